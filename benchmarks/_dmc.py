"""A run's dm_control task loaded bare (no torchrl, no wrappers of ours), for the benchmarks that time
its parts: `env_rate` (physics and render per step) and `render_rate` (frames rendered again)."""

from __future__ import annotations


def load_bare(env_cfg):
    """(the dm_control env, already reset; `domain/task`; the run's env options) for a run's `env` node
    on the dmc suite, or None for other suites."""
    from worldmodels.envs import suites
    from worldmodels.envs.factory import env_options
    from worldmodels.envs.gl import headless_gl
    from worldmodels.envs.suites import resolve_env

    suite_name, task = resolve_env(env_cfg)
    if suite_name != "dmc":
        return None
    opts = env_options(env_cfg, suites.get(suite_name))
    headless_gl()  # before dm_control imports MuJoCo's renderer
    from dm_control import suite

    domain, name = task.split("/")
    env = suite.load(domain, name, task_kwargs=opts["kwargs"] or None)
    env.reset()
    return env, task, opts


def random_agent_step(env, repeat: int, seed: int = 0):
    """A callable that takes one agent step of uniform random actions (from `seed`): the action
    `repeat` times, stopping at the episode's last step, where the env is reset."""
    import numpy as np

    low, high = env.action_spec().minimum, env.action_spec().maximum
    rng = np.random.default_rng(seed)

    def step():
        action = rng.uniform(low, high)
        for _ in range(repeat):
            if env.step(action).last():
                env.reset()
                break
    return step
