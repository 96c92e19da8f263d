"""`python -m benchmarks.render_rate`: a frameless checkpoint's frames rendered again, by process count."""

from __future__ import annotations

import json

import pytest

from benchmarks import render_rate
from tests.envs.test_env_factory import needs_gl


@needs_gl
def test_one_row_per_process_count_with_every_frame_rendered(capsys, tmp_path):
    # 7 states render in this process (fewer than PARALLEL_FROM): the rows' bookkeeping without the
    # pool's seconds-long start; the pool's frames: tests/envs/test_render_state.py
    out = tmp_path / "render.json"
    result = render_rate.main(["+experiment=planet_dmc", "env=cartpole_swingup", "env.size=16", "--states", "7",
                               "--workers", "1", "2", "--repeats", "2", "--out", str(out)])
    assert (result["task"], result["size"], result["states"]) == ("cartpole/swingup", 16, 7)
    assert set(result["rows"]) == {"1", "2"}
    for row in result["rows"].values():
        assert len(row["runs_s"]) == 2 and row["frames_per_s"] == pytest.approx(7 / row["s"])
    assert json.loads(out.read_text()) == result
    printed = capsys.readouterr().out
    assert "2 processes at most" in printed and "in this process" in printed


@pytest.mark.parametrize("flags, message", [(["--states", "0"], "--states=0: expected an int >= 1"),
                                            (["--repeats", "0"], "--repeats=0: expected an int >= 1"),
                                            (["--workers", "8", "0"], "--workers=[8, 0]: expected ints >= 1")])
def test_bad_flags_are_refused_by_name(capsys, flags, message):
    with pytest.raises(SystemExit):
        render_rate.main(["+experiment=planet_dmc", *flags])
    assert message in capsys.readouterr().err


def test_a_task_that_renders_nothing_again_is_refused():
    with pytest.raises(SystemExit, match="expected a dm_control task from pixels"):
        render_rate.main(["env=pendulum", "--states", "2"])
