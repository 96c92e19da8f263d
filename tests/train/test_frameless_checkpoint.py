"""`replay.save_frames=false`: a dm_control pixel run's checkpoint keeps the physics states, not the
frames, and the resumed run's replay holds every frame the first run stored, rendered again; a config
whose env records no such state is refused, naming the field, before anything is built."""

from __future__ import annotations

import json

import pytest
import torch

from tests._train_config import run_config
from tests.envs.test_env_factory import needs_gl
from worldmodels.envs.render_state import RENDER_STATE
from worldmodels.train import Trainer
from worldmodels.train.config import ConfigError, validate

PIXELS = ("env=cartpole_swingup", "env.pixels=true", "env.action_repeat=4", "env.time_limit=10",
          "replay.save_frames=false")


@needs_gl
def test_a_frameless_checkpoint_resumes_with_every_frame_rendered_again(tmp_path, capsys):
    framed = tuple(o for o in PIXELS if not o.startswith("replay.save_frames"))
    Trainer(run_config(tmp_path, *framed, "steps=48")).train()  # saved with its frames
    first = Trainer(run_config(tmp_path, *PIXELS, "steps=96"))  # resumed, saving without them from now on
    assert first.run.allowed == {"replay.save_frames": (True, False), "steps": (48, 96)}
    first.train()
    before = first.replay.buffer.storage[: len(first.replay)].clone()
    checkpoint = first.run_dir / "checkpoints" / "step-0000000096"
    layout = json.loads((checkpoint / "replay" / "steps.json").read_text())
    assert layout["rendered"] == ["obs"] and ["obs"] not in [f["key"] for f in layout["fields"]]
    assert before[RENDER_STATE].shape[-1] == 4  # cartpole: qpos and qvel, 2 each
    capsys.readouterr()

    resumed = Trainer(run_config(tmp_path, *PIXELS, "steps=128"))
    after = resumed.replay.buffer.storage[: len(resumed.replay)]
    assert len(resumed.replay) == len(before) > 0
    assert f"rendered {len(before)} frames again from their physics states" in capsys.readouterr().out
    assert torch.equal(after["obs"], before["obs"])
    assert (after == before).all()
    resumed.train()  # and it trains on from there
    assert resumed.counters["env_steps"] >= 128


@pytest.mark.parametrize("env", [("env=pendulum",), ("env=pendulum", "env.pixels=true"),
                                 ("env=cartpole_swingup", "env.pixels=false")])
def test_save_frames_false_needs_an_env_that_renders_from_its_state(tmp_path, env):
    cfg = run_config(tmp_path, *env, "replay.save_frames=false")
    with pytest.raises(ConfigError, match=r"replay.save_frames=false needs a pixel env that renders its frames"):
        validate(cfg)
