"""Env factories for `env=custom env.entry=tests.custom_envs:<factory>` in the tests.

- `make_dict_env`: a gymnasium env with a Dict observation (a float vector and a uint8 image),
  the case of danijar's multi-key encoder: a point on a line, pushed by a continuous action
  towards the origin; the image shows the point as a bright column.
- `make_torchrl_env`: a torchrl `EnvBase` (torchrl's own gymnasium Pendulum), whose actions span
  [-2, 2]: `make_env` rescales them to the agent's [-1, 1].
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class PointDictEnv(gym.Env):
    """Observation {"position": float32 [2] (x, velocity), "camera": uint8 [size, size, 3]};
    action float32 [1] in [-1, 1]; reward -|x|; episodes end after `length` steps (truncated).

    Args:
        size: the camera image's height and width.
        length: steps per episode.
    """

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, size: int = 16, length: int = 20, render_mode: str | None = None):
        self.size, self.length, self.render_mode = size, length, render_mode
        self.observation_space = gym.spaces.Dict({
            "position": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "camera": gym.spaces.Box(0, 255, (size, size, 3), np.uint8),
        })
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def _obs(self) -> dict:
        return {"position": np.array([self.x, self.v], np.float32), "camera": self.render()}

    def render(self) -> np.ndarray:
        image = np.zeros((self.size, self.size, 3), np.uint8)
        column = int(np.clip((self.x + 2) / 4 * (self.size - 1), 0, self.size - 1))
        image[:, column] = 255
        return image

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.x, self.v, self.t = float(self.np_random.uniform(-1.5, 1.5)), 0.0, 0
        return self._obs(), {}

    def step(self, action):
        self.v = 0.8 * self.v + 0.2 * float(np.clip(action[0], -1, 1))
        self.x = float(np.clip(self.x + self.v, -2, 2))
        self.t += 1
        return self._obs(), -abs(self.x), False, self.t >= self.length, {}


def make_dict_env(size: int = 16, length: int = 20, render_mode: str | None = None) -> gym.Env:
    return PointDictEnv(size, length, render_mode)


def make_torchrl_env():
    from torchrl.envs import GymEnv

    return GymEnv("Pendulum-v1")
