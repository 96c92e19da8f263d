"""`scripts/train.py --help`: every field of a run config with its value and the comment its file
gives it (configs/config.yaml and the group files), for the groups the command line picks.

Contract:
- `help_text(configs, overrides)` composes `configs` with `overrides` as the run would (Hydra's
  compose API; group choices such as `env=walker_walk algo=planet` change which fields and values
  are listed), then lists the usage, each group's options, and each field as `key: value  # comment`.
- A field's comment is the one in the file that sets it for this choice (an `+experiment` file
  first, then the env_algo, algo, env, model and logger files, each before the files of its group
  it builds on, env/gym.yaml for env=pendulum; then configs/config.yaml). Files not chosen are not
  read: their comments explain their own values.
  Comment lines above a key belong to it, as do deeper-indented comment lines right after it; a
  file's comment lines before its first key are its header and are not listed.
- Raises Hydra's own errors for overrides it cannot compose (an unknown group option).
"""

from __future__ import annotations

import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from worldmodels.train.config import GLOBAL_PACKAGE

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_]\w*):(?P<value>[^#]*?)\s*(?:#\s?(?P<comment>.*))?$")
COMMENT_LINE = re.compile(r"^(?P<indent> *)#\s?(?P<comment>.*)$")
COMMENT_COLUMN = 34
"""Where the comments start in the listing (a longer `key: value` pushes its first line further)."""
SELECTED_ORDER = ("experiment", "env_algo", "algo", "env", "model", "logger")
"""The groups whose chosen file's comments come first, in this order (the later file's value wins in Hydra)."""

USAGE = """\
usage: python scripts/train.py [group=option ...] [field=value ...]
  e.g.   python scripts/train.py env=pendulum steps=5000 batch_size=32
  sweep: python scripts/train.py -m env=pendulum seed=0,1,2   (Hydra's multirun; --hydra-help: Hydra's options)
  these fields for another choice: python scripts/train.py env=walker_walk algo=dreamer_v1 --help

A key that configs/ does not define is refused, with or without Hydra's +, naming the nearest field.
Free keys: +env.kwargs.NAME=VALUE, a keyword argument of the env's factory (env=custom, or gym.make's).
Paper protocols: +experiment=NAME (configs/experiment/NAME.yaml) before the env choice."""


def help_text(configs: Path, overrides: list[str]) -> str:
    """The --help listing for `overrides` (see the module docstring)."""
    with initialize_config_dir(config_dir=str(configs.resolve()), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    choices = {group: choice for group, choice in cfg.hydra.runtime.choices.items()
               if not group.startswith("hydra/") and choice is not None
               and (configs / group / f"{choice}.yaml").is_file()}
    comments = _comments(configs, choices)
    values = OmegaConf.to_container(cfg, resolve=False)
    values.pop("hydra")
    picked = " ".join(f"{group}={choices[group]}" for group in SELECTED_ORDER if group in choices)
    lines = [USAGE, "", "Groups (group=option, configs/<group>/<option>.yaml):"]
    lines += [f"  {group}: {', '.join(_options(configs, group))}" for group in sorted(_groups(configs))]
    lines += ["", f"Fields for {picked}: value, then what it means:"]
    lines += _field_lines(values, "", comments, choices)
    return "\n".join(lines)


def _groups(configs: Path) -> list[str]:
    return [d.name for d in configs.iterdir() if d.is_dir() and d.name != "hydra"]


def _options(configs: Path, group: str) -> list[str]:
    return sorted(path.stem for path in (configs / group).glob("*.yaml"))


def _comments(configs: Path, choices: dict[str, str]) -> dict[str, list[str]]:
    """Dotted field -> its comment lines, from the chosen files in `SELECTED_ORDER`, each followed by the
    files of its group it builds on (its `defaults`: env/gym.yaml under env/pendulum.yaml), then
    configs/config.yaml. Files not chosen say nothing: their comments explain their own values."""
    chosen = [path for group in SELECTED_ORDER if group in choices
              for path in _with_bases(configs / group / f"{choices[group]}.yaml")]
    comments: dict[str, list[str]] = {}
    for path in [*chosen, configs / "config.yaml"]:
        for field, lines in _file_comments(configs, path).items():
            if lines:
                comments.setdefault(field, lines)
    return comments


def _with_bases(path: Path) -> list[Path]:
    """`path`, then the files of its group that its defaults list names (`- gym@env`, `- dmc`), theirs after them."""
    bases = [entry.split("@")[0] for entry in OmegaConf.load(path).get("defaults", [])
             if isinstance(entry, str) and entry != "_self_"]
    return [path, *(base for name in bases if (path.parent / f"{name}.yaml").is_file()
                    for base in _with_bases(path.parent / f"{name}.yaml"))]


def _file_comments(configs: Path, path: Path) -> dict[str, list[str]]:
    """One file's comments by dotted field, its group's package in front (none for _global_ files)."""
    text = path.read_text()
    group = str(path.parent.relative_to(configs))
    package = "" if group == "." or GLOBAL_PACKAGE in text.splitlines()[:1] else group
    comments: dict[str, list[str]] = {}
    parents: list[tuple[int, str]] = [(-1, package)]  # (indent, dotted path) of the keys enclosing the next
    last: tuple[int, str] | None = None  # the latest key: a deeper comment line right after it continues its comment
    above: list[str] = []  # comment lines waiting for the key below them
    seen_key = False
    for line in text.splitlines():
        if comment := COMMENT_LINE.match(line):
            if last is not None and len(comment["indent"]) > last[0]:
                comments[last[1]].append(comment["comment"])
            elif seen_key:  # before the first key: the file's header
                above.append(comment["comment"])
            continue
        key = KEY_LINE.match(line)
        if key is None:  # a blank line or a list item: what came before belongs to nothing below
            last, above = None, []
            continue
        indent = len(key["indent"])
        while parents[-1][0] >= indent:
            parents.pop()
        field = ".".join(part for part in (parents[-1][1], key["key"]) if part)
        comments[field] = above + ([key["comment"]] if key["comment"] else [])
        parents.append((indent, field))
        last, above, seen_key = (indent, field), [], True
    return comments


def _field_lines(values: dict, prefix: str, comments: dict[str, list[str]], choices: dict[str, str]) -> list[str]:
    lines = []
    depth = prefix.count(".") + 1 if prefix else 0
    for key, value in values.items():
        field = f"{prefix}.{key}" if prefix else key
        notes = list(comments.get(field, []))
        if field in choices:
            notes.insert(0, f"{field}={choices[field]}: configs/{field}/{choices[field]}.yaml")
        nested = isinstance(value, dict) and value
        head = f"{'  ' * depth}{key}:" + ("" if nested else f" {_scalar(value)}")
        lines += _with_comment(head, notes)
        if nested:
            lines += _field_lines(value, field, comments, choices)
    return lines


def _with_comment(head: str, notes: list[str]) -> list[str]:
    if not notes:
        return [head]
    first = f"{head.ljust(COMMENT_COLUMN - 2)}  # {notes[0]}"
    return [first, *(f"{' ' * COMMENT_COLUMN}# {note}" for note in notes[1:])]


def _scalar(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if value == {}:
        return "{}"
    if isinstance(value, str) and value == "":
        return "''"
    return str(value)
