"""scripts/dmc_trace.py: a trace of a dm_control task under fixed actions is the same on every call, and
the comparison finds where two traces part (what tells two MuJoCo / dm_control builds apart)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("dm_control", reason="dm_control is not installed")
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "dmc_trace.py"
spec = importlib.util.spec_from_file_location("dmc_trace", SCRIPT)
dmc_trace = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dmc_trace)


def test_a_trace_repeats_and_a_perturbed_one_parts_where_it_was_changed():
    a = dmc_trace.trace("finger", "spin", episodes=2, steps=40, hold=5)
    b = dmc_trace.trace("finger", "spin", episodes=2, steps=40, hold=5)
    assert a["obs0"].shape == (40, 9) and not np.array_equal(a["obs0"], a["obs1"])  # seeded per episode
    rows = dmc_trace.compare(a, b, early=10, tol=1e-6)
    assert all(r["early_max_diff"] == 0 and r["first_step_over_tol"] is None for r in rows)
    assert all(r["return_a"] == r["return_b"] for r in rows)
    b["obs1"][25:, 3] += 1e-3  # episode 1 parts at step 25
    rows = dmc_trace.compare(a, b, early=10, tol=1e-6)
    assert [r["first_step_over_tol"] for r in rows] == [None, 25]
    assert rows[1]["early_max_diff"] == 0


def test_the_command_line_traces_and_compares(tmp_path):
    out = tmp_path / "a.npz"
    run = lambda *args: subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,  # noqa: E731
                                       text=True, env={"MUJOCO_GL": "disable", "PATH": ""})
    done = run("finger", "spin", "--out", str(out), "--episodes", "1", "--steps", "20")
    assert done.returncode == 0, done.stderr
    compared = run("--compare", str(out), str(out), "--early", "5")
    assert compared.returncode == 0 and "returns equal in 1 of 1 episodes" in compared.stdout
    bad = run("finger", "spin", "--out", str(out), "--hold", "0")
    assert bad.returncode != 0 and "--hold=0 must be >= 1" in bad.stderr
