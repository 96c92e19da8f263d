"""`python -m benchmarks.env_rate`: the run's env step split into bare physics, render and wrappers."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import env_rate
from tests.envs.test_env_factory import needs_gl


@needs_gl
def test_dmc_pixels_split_into_physics_render_and_wrappers(capsys, tmp_path):
    out = tmp_path / "env.json"
    result = env_rate.main(["+experiment=dreamer_v1_dmc", "env=cartpole_swingup", "env.size=16", "--steps", "3",
                            "--out", str(out)])
    idle = result["idle_ms"]
    assert (result["pixels"], result["action_repeat"]) == (True, 2)
    assert set(idle) == {"env_step", "physics", "render", "wrappers"}
    assert all(idle[k] > 0 for k in ("env_step", "physics", "render"))
    assert idle["wrappers"] == pytest.approx(idle["env_step"] - idle["physics"] - idle["render"])
    assert "busy_ms" not in result  # no --load-ms
    assert json.loads(out.read_text()) == result
    assert "render" in capsys.readouterr().out


@needs_gl
def test_dmc_state_has_no_render_row_and_other_suites_only_the_env_step():
    state = env_rate.main(["env=cartpole_swingup", "--steps", "2"])["idle_ms"]
    assert set(state) == {"env_step", "physics", "wrappers"}
    gym = env_rate.main(["env=pendulum", "--steps", "2"])["idle_ms"]
    assert set(gym) == {"env_step"} and gym["env_step"] > 0


def test_bad_flags_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        env_rate.main(["env=pendulum", "--steps", "0"])
    assert "--steps=0: expected an int >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        env_rate.main(["env=pendulum", "--load-ms", "-1"])
    assert "--load-ms=-1.0: expected a number > 0 of ms" in capsys.readouterr().err


@pytest.mark.parametrize("ms, flops_per_ms", [(30, 4e9), (30, 5e12), (0.05, 1e12), (1e6, 1e12)])
def test_the_load_matmul_is_sized_to_its_ms_from_above_and_below(ms, flops_per_ms):
    """A cubic cost model, as a GPU's for large n: the side is rescaled up or down until one matmul
    takes within 20% of the asked ms, or stops at the limits (64, 16384) when the ms lies past them."""
    seen = []

    def time_at(n):
        seen.append(n)
        return 2 * n**3 / flops_per_ms
    n, took = env_rate.matmul_side(ms, time_at)
    assert took == time_at(n) and n % 64 == 0 and 64 <= n <= 16384 and len(seen) <= 8 + 1
    lowest, highest = time_at(64), time_at(16384)
    if lowest <= ms <= highest:
        assert 0.8 * ms <= took <= 1.2 * ms, (n, took)
    else:
        assert n == (64 if ms < lowest else 16384)


@needs_gl
@pytest.mark.skipif(not torch.cuda.is_available(), reason="--load-ms keeps a CUDA GPU busy")
def test_gpu_load_sizes_its_matmul_and_every_row_is_timed_again_beside_it():
    result = env_rate.main(["+experiment=dreamer_v1_dmc", "env=cartpole_swingup", "--steps", "5", "--load-ms", "5"])
    # sized to within 20% of 5 ms by its last measurement; a GPU's timings are noisier than that between runs
    assert 2.5 <= result["load_matmul_ms"] <= 10 and result["gpu"] == torch.cuda.get_device_name()
    assert set(result["busy_ms"]) == set(result["idle_ms"]) == {"env_step", "physics", "render", "wrappers"}
