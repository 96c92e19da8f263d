"""`Suite`: one family of envs (its task names, its maker, its episode length), and the suite
registry: suite name -> `Suite`, read by the env config checks, `make_env` and the run-config
checks, so a new suite is one file that calls `register(MySuite())`.

A suite subclass sets `name`, `example` (a task for error messages) and `options` (defaults of
its own config fields), and implements `tasks()` and `make()`; the other hooks have defaults
that fit a suite of gymnasium-style ids.
"""

from __future__ import annotations

import abc
import difflib
import re

from omegaconf import DictConfig, OmegaConf


class Suite(abc.ABC):
    """One env suite. Subclasses override what differs; `make_env` and the checks call only these."""

    name: str = ""
    example: str = ""
    """A valid task, shown when `env.task` is missing (`env.task=<example>`)."""
    options: dict = {}
    """Defaults of the suite's own config fields (e.g. dmc's `camera`), for configs that lack them."""

    @abc.abstractmethod
    def tasks(self) -> tuple[str, ...]:
        """Every valid task name (errors suggest the nearest ones)."""

    def task(self, cfg, error: type[Exception] = ValueError) -> str:
        """The task an env config names (`env.task`), checked; raises `error` naming the field."""
        task = field(cfg, "task")
        if not isinstance(task, str) or not task:
            raise error(f"env.task={task!r}: env.suite={self.name!r} needs a task name, e.g. env.task={self.example}")
        if not self.is_task(task, error):
            raise error(f"env.task={task!r} is not a task of the {self.name} suite; {hint(task, self.tasks())}")
        return task

    def is_task(self, task: str, error: type[Exception] = ValueError) -> bool:
        return task in self.tasks()

    def check_options(self, cfg, task: str, error: type[Exception] = ValueError) -> None:
        """Refuse config options the suite cannot honour (raises `error` naming the field)."""

    def code_fields(self, cfg) -> dict[str, str]:
        """The fields of an env config whose values name code that building the env imports or calls
        (custom's `env.entry`), field -> value; read without importing anything. A config someone else
        wrote (a shared run directory's) may name such code only where the user consents (train/trust.py)."""
        return {}

    def label(self, task: str) -> str:
        """A run-directory-safe label of a task: `walker/walk` -> `walker-walk`."""
        return safe_label(task, self.name)

    def episode_frames(self, task: str) -> int | None:
        """The most frames an episode lasts, where known without building the env (None: unknown)."""
        return None

    def needs_gl(self, pixels: bool) -> bool:
        """Whether building the env (rendering `pixels` or not) needs MuJoCo's offscreen OpenGL."""
        return False

    @abc.abstractmethod
    def make(self, task: str, opts: dict, pixels: bool):
        """One unbatched torchrl env of `task` (opts: the env config's fields, defaults filled in):
        actions in [-1, 1] or one-hot, `opts["action_repeat"]` frames per step, RGB frames under
        the suite's image key when `pixels`."""

    def observation_transforms(self, env) -> list:
        """Transforms giving the env the common observation keys (before images are resized)."""
        return []

    def state_renderer(self, task: str, opts: dict):
        """Where a pixel env of `task` adds its simulator state to each step (`envs/render_state.py`):
        a callable float64 states [n, S] -> its frames again, uint8 [n, H, W, C] as the env rendered
        them; None (the default): the suite's frames cannot be rendered from a state."""
        return None

    def image_key(self, key):
        """The key an image observation `key` is stored under."""
        return key


_registry: dict[str, Suite] = {}


def register(suite: Suite) -> Suite:
    """Add (or replace) a suite; returns it."""
    if not suite.name.isidentifier():
        raise ValueError(f"suite name {suite.name!r} must be an identifier")
    _registry[suite.name] = suite
    return suite


def unregister(name: str) -> None:
    _registry.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered suites (the valid `env.suite` values), in registration order."""
    return tuple(_registry)


def get(name: object, error: type[Exception] = ValueError) -> Suite:
    """The suite `name`; an unknown one raises `error` listing the registered suites."""
    suite = _registry.get(name) if isinstance(name, str) else None
    if suite is None:
        raise error(f"env.suite={name!r} is not valid; expected one of {list(names())} ({hint(str(name), names())})")
    return suite


def safe_label(text: str, fallback: str) -> str:
    """`text` with every run of characters unsafe in a directory name replaced by "-"."""
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", text).strip("-") or fallback


def field(cfg, name: str):
    """An env config's field `name`, None when absent or missing (`???`)."""
    if isinstance(cfg, DictConfig):
        return None if name not in cfg or OmegaConf.is_missing(cfg, name) else cfg[name]
    return cfg.get(name)


def nearest(name: str, names, count: int = 5) -> list[str]:
    """Up to `count` of `names` closest to `name` (difflib), case-insensitively."""
    lowered = {n.lower(): n for n in names}
    return [lowered[n] for n in difflib.get_close_matches(name.lower(), lowered, n=count, cutoff=0.5)]


def hint(name: str, names) -> str:
    close = nearest(name, names)
    return f"nearest valid names: {close}" if close else f"e.g. {list(names)[:5]}"

