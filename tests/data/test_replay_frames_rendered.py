"""A replay saved without its frames (`Replay.save(frames=..., render=...)`): it keeps each step's
`RENDER_STATE` and frame CRC instead, loads back to the same storage through the renderer, keeps its
frames where the renderer cannot reproduce them, warns where a resume's renderer draws other frames,
and refuses a frameless save with no renderer. Frames here are a made-up function of the state (no
GL); tests/envs/test_render_state.py renders dm_control's."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from tensordict import TensorDict

from worldmodels.data import Replay, ReplayError
from worldmodels.data.replay import FRAME_CRC, read_saved
from worldmodels.envs.render_state import RENDER_STATE, state_bits, state_values

SIZE = 6


def render(bits: torch.Tensor) -> torch.Tensor:
    """int64 state bits [n, 2] -> uint8 frames [n, 3, SIZE, SIZE]: a function of the state alone."""
    states = torch.from_numpy(state_values(bits))
    grid = torch.arange(3 * SIZE * SIZE, dtype=torch.float64).reshape(3, SIZE, SIZE)
    return ((states[:, :1, None, None] * 37 + states[:, 1:, None, None] * grid) % 251).to(torch.uint8)


def episode(ep: int, length: int, seed: int = 0) -> TensorDict:
    """`length` steps of episode `ep`: a random float64 state per step, its frame, the other step keys."""
    g = torch.Generator().manual_seed(1000 * seed + ep)
    bits = torch.from_numpy(state_bits(torch.rand(length, 2, generator=g, dtype=torch.float64).numpy() * 50))
    index = torch.arange(length)
    return TensorDict({
        "obs": render(bits), RENDER_STATE: bits, "action": torch.rand(length, 2, generator=g),
        "reward": torch.rand(length, generator=g), "is_first": index == 0, "is_terminal": index < 0,
        "is_last": index == length - 1, "episode": torch.full((length,), ep), "step": index,
        "stream": torch.full((length,), ep), "stream_step": index,
    }, batch_size=[length])


def filled(device: str = "cpu") -> Replay:
    replay = Replay(capacity=500, batch_size=4, seq_len=5, device=device)
    for ep, length in enumerate((40, 23, 61, 9)):
        replay.add(episode(ep, length))
    return replay


def stored(replay: Replay) -> TensorDict:
    return replay.buffer.storage[: len(replay)].cpu()


def saved_keys(path) -> set[tuple[str, ...]]:
    return {tuple(field["key"]) for field in json.loads((path / "steps.json").read_text())["fields"]}


def test_a_frameless_save_keeps_states_and_checksums_and_loads_back_every_frame(tmp_path):
    replay = filled()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: the renderer reproduces every frame
        replay.save(tmp_path / "frameless", frames="obs", render=render)
    replay.save(tmp_path / "with_frames")
    assert ("obs",) not in saved_keys(tmp_path / "frameless")
    assert {(RENDER_STATE,), (FRAME_CRC,)} <= saved_keys(tmp_path / "frameless")
    assert json.loads((tmp_path / "frameless" / "steps.json").read_text())["rendered"] == ["obs"]
    size = lambda d: sum(p.stat().st_size for p in d.rglob("*.zlib"))  # noqa: E731
    assert size(tmp_path / "frameless") < size(tmp_path / "with_frames")

    back = Replay(capacity=500, batch_size=4, seq_len=5)
    back.load(tmp_path / "frameless", example=stored(replay)[:1], size=len(replay), render=render)
    assert (stored(back) == stored(replay)).all()
    assert back.buffer._writer._cursor == replay.buffer._writer._cursor
    batch = back.sample()
    assert RENDER_STATE not in batch.keys() and batch["obs"].shape == (4, 5, 3, SIZE, SIZE)


def test_frames_are_saved_after_all_where_the_renderer_does_not_reproduce_them(tmp_path):
    replay = filled()

    def off_by_one(bits):  # as a task whose frames depend on more than the state would
        frames = render(bits)
        frames[0] += 1
        return frames

    with pytest.warns(UserWarning, match=r"saved with its frames: 1 of \d+ frames rendered again"):
        replay.save(tmp_path / "replay", frames="obs", render=off_by_one)
    assert ("obs",) in saved_keys(tmp_path / "replay")
    assert "rendered" not in json.loads((tmp_path / "replay" / "steps.json").read_text())
    back = Replay(capacity=500, batch_size=4, seq_len=5)
    back.load(tmp_path / "replay", example=stored(replay)[:1], size=len(replay))  # no renderer needed
    assert (stored(back) == stored(replay)).all()

    with pytest.warns(UserWarning, match="no renderer was given"):
        replay.save(tmp_path / "no_renderer", frames="obs")
    assert ("obs",) in saved_keys(tmp_path / "no_renderer")


def test_steps_loaded_without_states_keep_the_replay_saving_its_frames(tmp_path):
    replay = filled()
    old = Replay(capacity=500, batch_size=4, seq_len=5)  # a save from before states: the same steps, none
    old.add(stored(replay).exclude(RENDER_STATE))
    old.save(tmp_path / "old")
    back = Replay(capacity=500, batch_size=4, seq_len=5)
    back.load(tmp_path / "old", example=stored(replay)[:1], size=len(replay))
    assert back.stateless_steps and (stored(back)[RENDER_STATE] == 0).all()  # zeros: not the states that were
    back.add(episode(9, 12))
    with pytest.warns(UserWarning, match="loaded without the state they were rendered from"):
        back.save(tmp_path / "again", frames="obs", render=render)
    assert ("obs",) in saved_keys(tmp_path / "again")


def test_a_resume_whose_renderer_draws_other_frames_warns_with_the_count_and_trains_on_them(tmp_path):
    replay = filled()
    replay.save(tmp_path / "replay", frames="obs", render=render)

    def other_gl(bits):  # another GL library: a few pixels differ in two frames
        frames = render(bits)
        frames[[3, 50], 0, 0, 0] ^= 1
        return frames

    back = Replay(capacity=500, batch_size=4, seq_len=5)
    message = rf"2 of {len(replay)} frames rendered again .* differ from the frames the run saw"
    with pytest.warns(UserWarning, match=message):
        back.load(tmp_path / "replay", example=stored(replay)[:1], size=len(replay), render=other_gl)
    assert torch.equal(stored(back)["obs"], other_gl(stored(replay)[RENDER_STATE]))


def test_a_frameless_save_refuses_to_load_without_a_renderer_naming_the_setting(tmp_path):
    replay = filled()
    replay.save(tmp_path / "replay", frames="obs", render=render)
    back = Replay(capacity=500, batch_size=4, seq_len=5)
    with pytest.raises(ReplayError, match=r"saved without its frames \(replay.save_frames=false\)"):
        back.load(tmp_path / "replay", example=stored(replay)[:1], size=len(replay))
    steps, _ = read_saved(tmp_path / "replay")  # what is on disk reads as it is: states and checksums
    assert FRAME_CRC in steps.keys() and "obs" not in steps.keys()


def test_a_frameless_replay_whose_frames_cannot_be_rendered_says_why(tmp_path):
    from worldmodels.envs.gl import GLUnavailable

    def no_gl(bits):
        raise GLUnavailable(AttributeError("'NoneType' object has no attribute 'glGetError'"))

    replay = filled()
    replay.save(tmp_path / "replay", frames="obs", render=render)
    back = Replay(capacity=500, batch_size=4, seq_len=5)
    with pytest.raises(ReplayError, match=r"saved without its frames \(replay.save_frames=false\), and rendering them "
                                          r"again failed: MuJoCo cannot render here \(MUJOCO_GL="):
        back.load(tmp_path / "replay", example=stored(replay)[:1], size=len(replay), render=no_gl)


def test_nested_frames_under_a_list_of_observation_keys(tmp_path):
    replay = Replay(capacity=500, batch_size=2, seq_len=3)
    steps = episode(0, 30)
    obs = TensorDict({"pixels": steps["obs"], "vector": torch.rand(30, 4)}, batch_size=[30])
    replay.add(steps.set("obs", obs))
    replay.save(tmp_path / "replay", frames=("obs", "pixels"), render=render)
    keys = saved_keys(tmp_path / "replay")
    assert ("obs", "pixels") not in keys and ("obs", "vector") in keys
    back = Replay(capacity=500, batch_size=2, seq_len=3)
    back.load(tmp_path / "replay", example=stored(replay)[:1], size=len(replay), render=render)
    assert (stored(back) == stored(replay)).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a replay stored on a GPU needs CUDA (the same save and "
                    "load on the host are checked above)")
def test_a_gpu_replay_saves_without_frames_and_loads_them_back(tmp_path):
    replay = filled("cuda")
    replay.save(tmp_path / "replay", frames="obs", render=render)
    assert ("obs",) not in saved_keys(tmp_path / "replay")
    back = Replay(capacity=500, batch_size=4, seq_len=5, device="cuda")
    back.load(tmp_path / "replay", example=stored(replay)[:1], size=len(replay), render=render)
    assert (stored(back) == stored(replay)).all()
