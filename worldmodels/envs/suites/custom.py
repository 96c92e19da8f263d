"""The `custom` suite: a user's factory, `env.entry=package.module:function`, called with
`env.kwargs` (and render_mode="rgb_array" when frames are wanted and it takes that keyword),
returning a gymnasium.Env or an unbatched torchrl EnvBase (docs/custom-envs.md)."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

from worldmodels.envs.suites.base import Suite, field, hint
from worldmodels.envs.suites.gym import wrap_gym


def load_entry(entry: str, error: type[Exception] = ValueError):
    """The callable named by `entry` = 'package.module:function'. The current directory is
    searched too (as `python -m` would), so a module beside the run's working dir is found."""
    if not isinstance(entry, str) or entry.count(":") != 1 or not all(entry.split(":")):
        raise error(f"env.entry={entry!r} must be 'package.module:function' (a factory returning a "
                    "gymnasium.Env or torchrl EnvBase)")
    module_name, attr = entry.split(":")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise error(f"env.entry={entry!r}: cannot import module {module_name!r} ({err})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise error(f"env.entry={entry!r}: module {module_name!r} has no callable {attr!r}; {hint(attr, public)}")
    return factory


def _accepts(function, keyword: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == keyword or p.kind == p.VAR_KEYWORD for p in parameters)


class Custom(Suite):
    """Its "task" is the entry point: `task()` reads `env.entry`, not `env.task`."""

    name = "custom"
    example = "my_pkg.envs:make_env"

    def tasks(self) -> tuple[str, ...]:
        return ()

    def task(self, cfg, error: type[Exception] = ValueError) -> str:
        entry = field(cfg, "entry")
        load_entry(entry, error)
        return entry

    def code_fields(self, cfg) -> dict[str, str]:
        return {"env.entry": field(cfg, "entry")}

    def label(self, task: str) -> str:
        return super().label(task.rsplit(":", 1)[-1])  # my_pkg.envs:make_env -> make_env

    def needs_gl(self, pixels: bool) -> bool:
        return pixels

    def make(self, task: str, opts: dict, pixels: bool):
        import gymnasium as gym
        import torch
        from torchrl.envs import EnvBase, TransformedEnv
        from torchrl.envs.transforms import ActionScaling, Compose, FrameSkipTransform

        factory, kwargs = load_entry(task), dict(opts["kwargs"])
        if pixels and _accepts(factory, "render_mode"):
            kwargs.setdefault("render_mode", "rgb_array")
        env = factory(**kwargs)
        if isinstance(env, gym.Env):
            return wrap_gym(env, opts, pixels)
        if not isinstance(env, EnvBase):
            raise TypeError(f"env.entry={task!r} returned {type(env).__name__}; expected a gymnasium.Env or a "
                            "torchrl EnvBase")
        if env.batch_size != torch.Size([]):
            raise ValueError(f"env.entry={task!r} returned an env of batch_size {tuple(env.batch_size)}; expected "
                             "one unbatched env (make_env batches env.num_envs copies)")
        transforms = []
        spec = env.action_spec
        if spec.domain == "continuous" and hasattr(spec.space, "low") and not (
                torch.all(spec.space.low == -1) and torch.all(spec.space.high == 1)):
            transforms.append(ActionScaling())  # the agent acts in [-1, 1]
        if opts["action_repeat"] > 1:
            transforms.append(FrameSkipTransform(opts["action_repeat"]))
        return TransformedEnv(env, Compose(*transforms)) if transforms else env

