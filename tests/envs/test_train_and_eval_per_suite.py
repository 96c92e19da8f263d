"""A tiny training run for each kind of task (a gymnasium id with discrete actions, a dm_control
`domain/task`, an Atari game, a user's torchrl env factory, a Dict-observation gymnasium env),
each followed by `scripts/eval.py` on its run directory."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests._train_config import run_config
from worldmodels.train import Trainer

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("eval_script", ROOT / "scripts" / "eval.py")
eval_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eval_script)

SHORT = ["steps=120", "env.time_limit=40"]  # a few hundred frames, 20 updates: seconds per run


def gl_renders() -> bool:
    from tests.envs.test_env_factory import gl_renders as renders

    return renders()


def train(tmp_path: Path, *overrides: str) -> Path:
    cfg = run_config(tmp_path, *SHORT, *overrides)
    result = Trainer(cfg).train()
    assert result["env_steps"] >= 120 and result["updates"] > 0
    return Path(cfg.run_dir)


def check_eval(run_dir: Path, episodes: int = 2, video: bool = True, expect_video: bool | None = None,
               trust_code: bool = False) -> dict:
    """scripts/eval.py's evaluation: its eval.json, returns and (`expect_video`, default `video`) video file.
    `trust_code`: a custom env's run (its config names the factory eval calls)."""
    result = eval_script.evaluate_run(run_dir, episodes=episodes, video=video, trust_code=trust_code)
    expect_video = video if expect_video is None else expect_video
    saved = json.loads((run_dir / "media" / "eval.json").read_text())
    assert saved == result and len(result["returns"]) == episodes
    assert result["mean"] == pytest.approx(sum(result["returns"]) / episodes)
    if expect_video:
        assert Path(result["video"]).stat().st_size > 0 and Path(result["video"]).suffix in (".mp4", ".gif")
    return result


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory) -> Path:
    """A tiny CartPole-v1 run (gymnasium id, discrete actions), shared by the tests that evaluate it."""
    return train(tmp_path_factory.mktemp("cartpole"), "env=gym", "env.task=CartPole-v1")


def test_gym_discrete_task_trains_and_evaluates(cartpole_run):
    result = check_eval(cartpole_run, episodes=3)
    assert all(r == int(r) and 8 <= r <= 80 for r in result["returns"])  # 1/frame; any fall >= 8, limit 40 x 2


def test_dm_control_domain_task_trains_and_evaluates(tmp_path):
    run_dir = train(tmp_path, "env=dmc", "env.task=cartpole/balance", "env.time_limit=20")
    # a video needs offscreen OpenGL (EGL/OSMesa), slow where it is software: one short episode
    check_eval(run_dir, episodes=1, video=gl_renders())


def test_atari_game_trains_and_evaluates(tmp_path):
    pytest.importorskip("ale_py", reason="ale-py is not installed")
    run_dir = train(tmp_path, "env=atari", "env.task=pong", "env.grayscale=true")
    check_eval(run_dir, episodes=1)


def test_custom_torchrl_env_trains_and_evaluates(tmp_path):
    run_dir = train(tmp_path, "env=custom", "env.entry=tests.custom_envs:make_torchrl_env", "env.action_repeat=2")
    with pytest.warns(UserWarning, match="no video"):  # a torchrl env has no generic renderer, and no image
        result = check_eval(run_dir, expect_video=False, trust_code=True)
    assert result["video"] is None


def test_dict_observation_env_trains_and_evaluates(tmp_path):
    from worldmodels import load

    run_dir = train(tmp_path, "env=custom", "env.entry=tests.custom_envs:make_dict_env", "+env.kwargs.length=30")
    encoder = load(run_dir).world_model.encoder
    assert encoder.image_keys == ["camera"] and encoder.vector_keys == ["position"]
    check_eval(run_dir, trust_code=True)


def test_eval_command_line(cartpole_run):
    """The script itself, in a fresh process: a run is evaluated on the seed given."""
    args = [f"run_dir={cartpole_run}", "episodes=2", "sample=true", "video=false", "seed=7"]
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "eval.py"), *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    saved = json.loads((cartpole_run / "media" / "eval.json").read_text())
    assert saved["sample"] and saved["seed"] == 7 and saved["episodes"] == 2 and saved["video"] is None
    assert f"return {saved['mean']:.1f} +- {saved['std']:.1f}" in done.stdout


def test_eval_main_reports_bad_arguments_and_missing_runs(tmp_path, capsys):
    assert eval_script.main([f"run_dir={tmp_path}", "episods=3"]) == 2
    assert "unknown argument 'episods'; did you mean ['episodes']" in capsys.readouterr().err
    assert eval_script.main([f"run_dir={tmp_path / 'none'}"]) == 1
    assert f"eval: run_dir={str(tmp_path / 'none')!r}" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    ([], "run_dir=<run directory> is required"),
    (["run_dir=x", "episodes=0"], "episodes=0 must be an int >= 1"),
    (["run_dir=x", "video=maybe"], "video='maybe' must be true or false"),
    (["run_dir"], "must be key=value"),
])
def test_eval_arguments_are_checked(argv, message):
    with pytest.raises(eval_script.ArgError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        eval_script.parse_args(argv)


def test_video_grid_tiles_episodes_and_holds_finished_ones():
    frames = [torch.full((3, 1, 4, 4), 10 + t, dtype=torch.uint8) for t in range(3)]
    running = [torch.tensor([True, True, True]), torch.tensor([True, False, True]), torch.tensor([False, False, True])]
    video = eval_script.video_grid(frames, running)
    # 3 episodes (gray, upscaled 4 -> 128 px) in a 2 x 2 grid, the fourth tile black
    assert video.shape == (3, 256, 256, 3)
    assert video[0, 0, 0, 0] == 10 and video[2, 0, 0, 0] == 11  # episode 0 ended at step 2: holds step 1
    assert video[2, 0, 128, 0] == 10 and video[2, 128, 0, 0] == 12 and video[2, 128, 128, 0] == 0
