"""What a run directory may make this process import or call: nothing, unless the user says so.

A run directory holds a config (in each checkpoint's `state.pt` and in `config.yaml`) that someone
else may have written. Its weights load with `weights_only=True`; its config is data too, except
for the fields that name code: a custom env's `env.entry` (`package.module:function`, imported and
called with `env.kwargs`), a gymnasium id of the form `module:Env-v0` (gymnasium imports `module`).
`code_fields` (envs/suites) finds them without importing anything.

Contract:
- `worldmodels.load(run_dir)` builds no env when the checkpoint holds its `env_info` (every
  checkpoint written since it was saved), so it imports nothing the config names; for an older
  checkpoint it builds one env to learn the shapes, and then refuses a config that names code
  unless called with `trust_code=True`.
- `scripts/eval.py` builds the run's env: it refuses such a config unless given `trust_code=true`.
- A resumed run (`scripts/train.py run_dir=...`) builds what its command line names; the stored
  config is only compared with it (run_dir.py), never built.
"""

from __future__ import annotations

from worldmodels.envs.suites import code_fields
from worldmodels.train.checkpoint import UnsafeCheckpointError


class UntrustedCodeError(UnsafeCheckpointError):
    """A run directory's config names code to import and call, and the user has not said to trust it."""


def check_trusted(cfg, trust_code: bool, source: str, consent: str) -> None:
    """Refuse (UntrustedCodeError) a run config read from `source` (a file) whose env names code,
    unless `trust_code`; `consent` is how the user says so (`trust_code=True`, ...)."""
    named = code_fields(cfg.env)
    if named and not trust_code:
        fields = ", ".join(f"{name}={value!r}" for name, value in named.items())
        raise UntrustedCodeError(
            f"the config in {source} names code that building its env would import and call ({fields}); "
            f"a run directory runs no code it names unless you say so. If you trust whoever wrote it and "
            f"that code, pass {consent}")
