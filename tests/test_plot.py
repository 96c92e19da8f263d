"""scripts/plot.py: seeds of one config become one curve (mean, min, max), a resumed run's repeated
steps count once, different configs are labelled by what differs, a PNG is written, and bad
input fails naming the run directory or the key."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "plot.py"
spec = importlib.util.spec_from_file_location("plot_script", SCRIPT)
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)


def make_run(root: Path, name: str, seed: int, evals: dict[int, float], horizon: int = 15) -> Path:
    run = root / name
    run.mkdir()
    config = {"seed": seed, "run_dir": str(run), "threads": 1, "steps": 3000, "env": {"name": "pendulum"},
              "algo": {"name": "dreamer_v3", "horizon": horizon}, "logger": {"kind": "csv"}}
    OmegaConf.save(OmegaConf.create(config), run / "config.yaml")
    lines = [{"step": 500, "train/return": -1300.0}]
    lines += [{"step": step, "eval/return": value, "updates": step // 4} for step, value in evals.items()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def test_seeds_group_into_one_curve_with_mean_min_max(tmp_path):
    a = make_run(tmp_path, "a", 0, {1000: -1200.0, 2000: -800.0, 3000: -300.0})
    b = make_run(tmp_path, "b", 1, {1000: -1000.0, 2000: -600.0})  # stopped early: no step 3000
    with (b / "metrics.jsonl").open("a") as f:  # resumed from step 1000: step 2000 logged again
        f.write(json.dumps({"step": 2000, "eval/return": -400.0}) + "\n")
    other = make_run(tmp_path, "c", 0, {1000: -900.0}, horizon=10)
    groups = plot.group_runs([a, b, other], "eval/return")
    assert [len(g["runs"]) for g in groups] == [2, 1]
    assert [g["label"] for g in groups] == ["pendulum dreamer_v3 algo.horizon=15",
                                            "pendulum dreamer_v3 algo.horizon=10"]
    steps, mean, low, high, count = plot.seed_stats(groups[0]["runs"])
    np.testing.assert_array_equal(steps, [1000, 2000, 3000])
    np.testing.assert_allclose(mean, [-1100.0, -600.0, -300.0])  # seed b's step 2000: the resumed value
    np.testing.assert_allclose(low, [-1200.0, -800.0, -300.0])
    np.testing.assert_allclose(high, [-1000.0, -400.0, -300.0])
    np.testing.assert_array_equal(count, [2, 2, 1])


def test_command_writes_a_png_and_prints_the_table(tmp_path):
    a = make_run(tmp_path, "a", 0, {1000: -1200.0, 2000: -800.0})
    b = make_run(tmp_path, "b", 1, {1000: -1000.0, 2000: -600.0})
    out = tmp_path / "docs" / "curves.png"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(a), str(b), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "step     2000  mean    -700.0  min    -800.0  max    -600.0  seeds 2" in proc.stdout


def test_missing_run_and_missing_key_fail_naming_them(tmp_path):
    a = make_run(tmp_path, "a", 0, {1000: -1200.0})
    with pytest.raises(FileNotFoundError, match="nowhere"):
        plot.group_runs([tmp_path / "nowhere"], "eval/return")
    with pytest.raises(ValueError, match=r"--key='eval/retrun'.*'eval/return'"):
        plot.group_runs([a], "eval/retrun")
    assert plot.main([str(a), "--out", str(tmp_path / "x.png"), "--key", "eval/retrun"]) == 2
    assert not (tmp_path / "x.png").exists()
