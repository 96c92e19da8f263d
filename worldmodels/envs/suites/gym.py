"""The `gym` suite: any registered gymnasium id (Box or Discrete actions; vector, image or Dict
observations), e.g. `CartPole-v1`, `Hopper-v5`. ALE ids belong to the atari suite."""

from __future__ import annotations

from functools import cache

from worldmodels.envs.suites.base import Suite, field


@cache
def repeat_action() -> type:
    """A gymnasium wrapper that repeats each action `repeat` times (rewards summed, stopping at the
    episode's end, as torchrl's `frame_skip`). Every env repeats with it, under torchrl's pixel
    wrapper: that wrapper renders at every `step`, so `frame_skip` around it rendered every repeated
    step."""
    import gymnasium as gym

    class RepeatAction(gym.Wrapper):
        def __init__(self, env, repeat: int):
            super().__init__(env)
            self.repeat = repeat

        def step(self, action):
            total = 0.0
            for _ in range(self.repeat):
                obs, reward, terminated, truncated, info = self.env.step(action)
                total += float(reward)
                if terminated or truncated:
                    break
            return obs, total, terminated, truncated, info

    return RepeatAction


def wrap_gym(env, opts: dict, pixels: bool):
    """A gymnasium env -> torchrl, Box actions rescaled to [-1, 1], Discrete as one-hot,
    `action_repeat` steps per agent step (a frame rendered once per agent step)."""
    import gymnasium as gym
    from torchrl.envs import GymWrapper

    if isinstance(env.action_space, gym.spaces.Box):
        env = gym.wrappers.RescaleAction(env, -1.0, 1.0)
    if opts["action_repeat"] > 1:
        env = repeat_action()(env, opts["action_repeat"])
    return GymWrapper(env, from_pixels=pixels, pixels_only=bool(opts["pixels_only"]),
                      categorical_action_encoding=False)


@cache
def _gym_ids() -> tuple[str, ...]:
    """Registered gymnasium ids, but ALE's (whether ale_py registered them yet): those are the atari suite."""
    import gymnasium as gym

    return tuple(sorted(env_id for env_id in gym.registry if not env_id.startswith("ALE/")))


class Gym(Suite):
    name = "gym"
    example = "CartPole-v1"

    def tasks(self) -> tuple[str, ...]:
        return _gym_ids()

    def is_task(self, task: str, error: type[Exception] = ValueError) -> bool:
        if task.startswith("ALE/"):
            raise error(f"env.task={task!r}: Atari games are the atari suite, e.g. env=atari env.task=pong "
                        "(sticky actions, frame skip with max-pooling, 64x64 frames)")
        return task in self.tasks()

    def code_fields(self, cfg) -> dict[str, str]:
        task = field(cfg, "task")  # gymnasium imports `module` of a `module:Env-v0` id before it looks the id up
        return {"env.task": task} if isinstance(task, str) and ":" in task else {}

    def episode_frames(self, task: str) -> int | None:
        import gymnasium as gym

        return gym.spec(task).max_episode_steps

    def needs_gl(self, pixels: bool) -> bool:
        return pixels

    def make(self, task: str, opts: dict, pixels: bool):
        import gymnasium as gym

        kwargs = dict(opts["kwargs"])
        if pixels:
            kwargs["render_mode"] = "rgb_array"
            if "mujoco" in str(gym.spec(task).entry_point):
                kwargs.update(width=opts["size"], height=opts["size"])  # MuJoCo renders straight at size x size
        return wrap_gym(gym.make(task, **kwargs), opts, pixels)

