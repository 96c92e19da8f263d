"""The command lines of scripts/train.py and scripts/eval.py: an unknown config key is refused naming the
nearest field (keys under env.kwargs stay free), `--help` lists every field with its comment, the
progress shows the real updates/s (a bar, or plain lines with progress=false), a finished run prints
the eval and plot commands, third-party noise is silenced, and an eval with video shows its progress."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests._train_config import CONFIGS, TINY, run_config
from worldmodels.train import ConfigError, Trainer
from worldmodels.train import trainer as trainer_module
from worldmodels.train.config import ConfigSchema, check_overrides
from worldmodels.train.config_help import help_text

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ConfigSchema.read(Path(CONFIGS))
NOISE = ("Initialized LazyTensorStorage", "precision lowered")


@pytest.mark.parametrize("override, nearest", [
    ("+batchsize=32", "batch_size"), ("batchsize=32", "batch_size"), ("++model.deterr=64", "model.deter"),
    ("+algo.gama=0.9", "algo.gamma"), ("~env.time_limt", "env.time_limit"), ("+gama=0.9", "algo.gamma")])
def test_an_unknown_key_is_refused_naming_the_nearest_field(override, nearest):
    with pytest.raises(ConfigError, match=rf"^{re.escape(override)}: .* did you mean {re.escape(nearest)}\?"):
        check_overrides(["env=pendulum", override], SCHEMA)


def test_env_kwargs_fields_of_any_file_group_choices_and_hydra_keys_pass():
    """+env.kwargs.NAME is the env factory's; +algo.cem.top and +model.encoder_units are fields of some
    file (algo/planet.yaml, an experiment) that a run reads where set."""
    check_overrides(["env=custom", "env.entry=my_pkg.envs:make", "+env.kwargs.goal=0.8", "+env.kwargs.level.size=3",
                     "+algo.cem.top=10", "+model.encoder_units=512", "+experiment=dmc_proprio", "seed=0,1,2",
                     "hydra/launcher=gpus", "hydra.sweep.dir=runs/x", "algo.optim.model_lr=1e-4"], SCHEMA)


def test_help_lists_every_field_with_its_value_and_comment_for_the_chosen_groups():
    default = help_text(Path(CONFIGS), [])
    assert re.search(r"^device: cpu +# cpu, cuda or cuda:N$", default, re.M)
    assert re.search(r"^batch_size: 16$", default, re.M)  # env/pendulum.yaml's value
    assert re.search(r"^  deter: 128$", default, re.M)  # no comment: an experiment file's is not for this choice
    assert re.search(r"^  classes: 8 +# null: Gaussian latents of size stoch$", default, re.M)
    assert re.search(r"^  kwargs: \{\} +# keyword arguments of gym\.make", default, re.M)  # from pendulum's base file
    assert re.search(r"^model: +# model=small: configs/model/small\.yaml$", default, re.M)
    cfg = run_config(Path("unused"), "algo=planet", "env=walker_walk")
    planet = help_text(Path(CONFIGS), ["algo=planet", "env=walker_walk"])
    assert "Fields for algo=planet env=walker_walk model=gaussian logger=wandb" in planet
    assert re.search(r"^    top: 100$", planet, re.M) and re.search(r"^  camera: 0 +# dm_control camera", planet, re.M)
    fields = planet.split(": value, then what it means:\n")[1].splitlines()
    keys = [line.split(":")[0] for line in fields if not line.lstrip().startswith("#")]
    assert keys == list(_keys(OmegaConf.to_container(cfg, resolve=False)))  # every field, in the config's order


def _keys(node: dict, depth: int = 0):
    for key, value in node.items():
        if key == "hydra":
            continue
        yield "  " * depth + key
        if isinstance(value, dict) and value:
            yield from _keys(value, depth + 1)


def test_the_bar_shows_the_updates_per_second_between_log_lines(tmp_path, monkeypatch, capsys):
    """No log_every line falls inside the run: the bar's rates still come from each collect."""
    monkeypatch.setattr(trainer_module, "RATE_SECONDS", 1e-6)
    Trainer(run_config(tmp_path, "steps=96", "progress=true")).train()
    rates = [float(ups) for ups in re.findall(r"ups=([\d.]+)", capsys.readouterr().err)]
    assert rates and max(rates) > 0


def test_the_command_line_refuses_typos_helps_and_runs_quietly_to_its_next_commands(tmp_path):
    """scripts/train.py as a user runs it, the cases side by side: +batchsize and batchsize are refused
    (exit 1, nothing written), --help and --hydra-help exit 0, and a short run with progress=false
    prints plain progress lines with nonzero updates/s, no third-party noise, and the commands to run next."""
    run_dir = tmp_path / "run"
    cases = {"plus": [*TINY, "+batchsize=32"], "bare": [*TINY, "batchsize=32"],
             "help": [*TINY, "algo=planet", "--help"],
             "hydra_help": ["--hydra-help"],  # Hydra's own, which composes no group choice
             "run": [*TINY, "steps=200", "log_every=80", f"run_dir={run_dir}"]}
    procs = {name: subprocess.Popen([sys.executable, str(ROOT / "scripts" / "train.py"), *args], cwd=tmp_path,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, args in cases.items()}
    out = {name: (proc.communicate(timeout=300), proc.returncode) for name, proc in procs.items()}
    for name in ("plus", "bare"):
        (stdout, stderr), code = out[name]
        assert code == 1 and "did you mean batch_size?" in stderr, (name, stderr[-2000:])
    (stdout, stderr), code = out["help"]
    assert code == 0 and re.search(r"^  cem:$", stdout, re.M), stderr[-2000:]  # algo=planet's fields
    assert re.search(r"^device: cpu +# cpu, cuda or cuda:N$", stdout, re.M)
    assert out["hydra_help"][1] == 0 and "Hydra" in out["hydra_help"][0][0]
    (stdout, stderr), code = out["run"]
    assert code == 0, stderr[-2000:]
    progress = re.findall(r"^(\d+)/200 env steps, \d+ updates: \d+ env steps/s, ([\d.]+) updates/s", stdout, re.M)
    assert [step for step, _ in progress] == ["80", "160"] and float(progress[-1][1]) > 0, stdout
    assert f"python scripts/eval.py run_dir={run_dir}" in stdout and f"python scripts/plot.py {run_dir}" in stdout
    assert not [noise for noise in NOISE if noise in stdout + stderr], stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # the refusals and the help wrote nothing


def test_an_eval_video_shows_its_progress(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("eval_script", ROOT / "scripts" / "eval.py")
    eval_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eval_script)
    Trainer(run_config(tmp_path, "steps=48", "env.time_limit=10")).train()
    capsys.readouterr()
    result = eval_script.evaluate_run(tmp_path / "run", episodes=2, video=True)
    err = capsys.readouterr().err
    assert "eval (2 episodes)" in err and "11/11" in err  # the reset and 10 steps, out of an episode's
    assert f"writing the video of 11 frames to {tmp_path / 'run' / 'media'}" in err and result["video"]
