"""Early checks of a run config: each bad value fails before any env, model or file is made,
with a `ConfigError` naming the field and what was expected (`env.name`, `steps`, `device`, ...).

Contract:
- `upgrade(cfg)` rewrites deprecated spellings in place first (kept for one release, with a
  warning printed once): the old `backend` group that also set a device (`backend=cuda` ->
  `device=cuda backend=auto`; a stored `backend: {name, device}` -> `backend`, `device`); and a
  config from before `train_ratio_unit` (its `train_ratio` counted replayed steps per env step,
  i.e. per frame) -> the same rate in replayed steps per agent step (x `env.action_repeat`);
  `precision=fp32` -> `ieee` (the recurrent core's name; a config without the field: `ieee` too);
  the removed `env_thread` is dropped.
- `check_resume_unit(run_dir, cfg)`: resuming a run directory whose stored config predates
  `train_ratio_unit` is refused unless `train_ratio` is that run's rate in the new unit; the
  message names the field and the converted value (see `upgrade`).
- `validate(cfg)` upgrades, then checks types and ranges (booleans are true/false only), choices,
  sizes that must agree (`model.blocks` divides `model.deter`; `replay.capacity` and
  `replay.memory_gb` hold a sequence; `seq_len` fits in an episode), the device and recurrent
  backend available here, and optional packages the logger needs.
- `check_overrides(overrides, ConfigSchema.read(configs))`: a new run's command line (scripts/train.py,
  before Hydra composes anything) may name only fields that configs/ defines, with or without
  Hydra's `+`: an unknown key is refused naming the nearest field ("did you mean batch_size"). A
  field of any file counts (`+algo.cem.top=10` with algo=planet's field), and keys under a mapping
  that is empty there are free: `+env.kwargs.NAME=VALUE` passes NAME to a custom env's factory (or
  gym.make). Stored configs (a resumed run's, docs/results) are never checked against it: fields
  they hold that configs/ has since dropped still load (`upgrade`).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import os
import warnings
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from worldmodels.algos import ALGOS
from worldmodels.algos.dreamer_v3 import (CONTINUE_LABELS, IMAGINED_CONTINUES, START_CONTINUES, START_STATES,
                                          UPDATE_ORDERS, update_conflict)
from worldmodels.algos.optim import OPTIMIZERS
from worldmodels.core import BACKENDS, registry
from worldmodels.core.precision import USER_MODES, recurrent_matmul_precision
from worldmodels.envs import check_env_config, resolve_env, suites
from worldmodels.envs.factory import frame_renderer
from worldmodels.models.actor import DISTS
from worldmodels.models.layers import ACTS, LINEAR_BIASES, NORMS
from worldmodels.models.networks import TWOHOT_BINS
from worldmodels.models.init import FANS, INITS
from worldmodels.models.rssm import CELLS, DYN_NORMS, INITIALS
from worldmodels.train.logger import KINDS


class ConfigError(ValueError):
    """A bad config value; the message names the field."""


PRECISIONS = (*USER_MODES, "fp16")
"""`precision`: the core's matmul precision names (core/precision.py), for the whole run, and `fp16`
(float16 compute with a loss scale, as DreamerV3's 2023 reference ran): see `RunPrecision` for what
each sets."""

LEGACY_PRECISIONS = {"fp32": "ieee"}
"""Old spelling -> the core's name, read by `upgrade` (with a one-time warning)."""

BOOLS = ("resume", "progress", "check_finite", "cuda_graphs", "act_while_training", "compile_nets", "replay.memmap",
         "replay.on_device", "replay.save_frames",
         "replay.cross_episodes", "env.pixels", "env.parallel", "model.symlog_inputs", "algo.continue_head",
         "algo.replay_context")
"""Fields that take true or false only (a string such as 'no' is not read as a boolean)."""

# The smallest step a replay can store (bytes): a 1-d float32 observation and action, float32
# reward, bool is_first / is_terminal / is_last, int64 episode / step / stream / stream_step.
# `replay.memory_gb` below seq_len of these can never hold a sequence, whatever the env.
_MIN_STEP_BYTES = 4 + 4 + 4 + 1 + 1 + 1 + 4 * 8

TRAIN_RATIO_UNIT = "agent_step"
"""`train_ratio_unit`: the only unit, written into every new config (configs/config.yaml).
`train_ratio` is DreamerV3's: replayed steps (batch_size x seq_len per update) per agent step
(policy steps summed over envs, before action repeat). A config without the field predates it:
its `train_ratio` counted replayed steps per env step (frame), `env.action_repeat` times fewer."""

_warned: set[str] = set()


def available_backends(device: str) -> tuple[str, ...]:
    """The recurrent backends this build runs the RSSM unrolls with on `device` (besides 'auto'),
    from the registry: training needs both RSSM op families."""
    observe = registry.available_backends(device, "rssm_observe")
    return tuple(b for b in observe if b in registry.available_backends(device, "rssm_imagine"))


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, FutureWarning, stacklevel=3)


@dataclasses.dataclass(frozen=True)
class RunPrecision:
    """What a run's `precision` (one of the core's names, core/precision.py, or fp16) sets:

    | precision   | torch's float32 matmuls (cuBLAS) | recurrent core                           | updates          |
    |-------------|----------------------------------|------------------------------------------|------------------|
    | `ieee`      | "highest": IEEE fp32             | ieee                                     | float32          |
    | `tf32`      | "high": TF32                     | tf32                                     | float32          |
    | `tf32x3`    | "high": TF32                     | tf32x3                                   | float32          |
    | `fast`      | "high": TF32                     | fast (tf32 on Ampere+, else ieee)        | float32          |
    | `high-prec` | "high": TF32                     | high-prec (tf32x3 on Ampere+, else ieee) | float32          |
    | `bf16`      | "high": TF32                     | bf16                                     | bf16 autocast    |
    | `fp16`      | "high": TF32                     | ieee (autocast runs its torch ops fp16)  | fp16, loss scale |
    | `auto`      | torch's own, unchanged           | WORLDMODELS_RNN_PRECISION, else torch's  | float32          |

    `fp32`, the old spelling of `ieee`, is read as `ieee`. cuBLAS has no tf32x3 mode: with the
    recurrent core in tf32x3 or high-prec the other nets run TF32. torch's matmul precision is set
    process-wide; the recurrent core's for the training loop's context (`recurrent_context`), like
    the run's backend, so nothing else in the process is changed by it.

    `fp16` is the 2023 DreamerV3 reference's `precision: float16`: weights in float32, each update under
    float16 autocast, and every optimiser scaling its loss (`algos/optim.LossScale`: an update with
    non-finite gradients is skipped and halves the scale). The core is left in `ieee` so that `auto`
    runs the RSSM on cudnn or the loop, whose torch ops autocast computes in float16; the fused
    kernels would take float16 autocast as bf16 operands (`backend=triton` is refused with it).

    Args:
        mode: the run's `precision`.
        float32_matmul: torch's float32 matmul precision to set (None: leave torch's).
        recurrent: the recurrent core's mode to set (None: clear it, so it follows the env var / torch).
        autocast: the dtype each update runs under autocast in (None: none).
        loss_scale: whether every optimiser scales its loss.
    """

    mode: str
    float32_matmul: str | None
    recurrent: str | None
    autocast: torch.dtype | None
    loss_scale: bool = False

    @classmethod
    def of(cls, mode: str) -> RunPrecision:
        mode = LEGACY_PRECISIONS.get(mode, mode)
        if mode not in PRECISIONS:
            raise ConfigError(f"precision={mode!r} is not valid; expected one of {list(PRECISIONS)}")
        if mode == "auto":
            return cls(mode, None, None, None)
        if mode == "fp16":
            return cls(mode, "high", "ieee", torch.float16, loss_scale=True)
        return cls(mode, "highest" if mode == "ieee" else "high", mode, torch.bfloat16 if mode == "bf16" else None)

    def apply(self) -> None:
        """Set torch's float32 matmul precision (process-wide: cuBLAS has no per-context switch)."""
        if self.float32_matmul is not None:
            torch.set_float32_matmul_precision(self.float32_matmul)

    def recurrent_context(self):
        """The recurrent core's mode for the block (this thread only; `auto`: the process's)."""
        return recurrent_matmul_precision(self.recurrent or "auto")


def update_autocast(device_type: str, dtype: torch.dtype | None):
    """The autocast region an update runs in (`Trainer.update_on`; the benchmarks time it so): `dtype`
    (None: autocast off), with autocast's cache of cast weights off, as a captured update must run
    anyway. With the cache on, the uses of a weight (every step of an unroll) share one cast and their
    gradients add up in the half dtype before reaching the float32 weight; off, each use casts and they
    add up in float32 (`tests/train/test_run_precision.py`)."""
    return torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None, cache_enabled=False)


def upgrade(cfg: DictConfig, warn: bool = True) -> DictConfig:
    """Rewrite deprecated spellings in place (see the module docstring); returns `cfg`."""
    backend = cfg.get("backend")
    with open_dict(cfg):
        if isinstance(backend, DictConfig):  # a config stored before `device` was split off
            cfg.device = backend.get("device", "cpu")
            cfg.backend = backend.get("name", "auto")
        elif backend == "cuda":
            if warn:
                _warn_once("backend=cuda is deprecated and will be removed in the next release: "
                           "use device=cuda (backend= now picks only the recurrent backend; auto by default)")
            cfg.device, cfg.backend = "cuda", "auto"
        if "device" not in cfg:
            cfg.device = "cpu"
        cfg.pop("env_thread", None)  # a removed option: where the envs stepped, never what they or the run did
        precision = cfg.setdefault("precision", "ieee")  # stored before the field: IEEE fp32
        if precision in LEGACY_PRECISIONS:
            cfg.precision = LEGACY_PRECISIONS[precision]
            if warn:
                _warn_once(f"precision={precision} is the old spelling of precision={cfg.precision} (IEEE fp32 "
                           "matmuls, the recurrent core's name for them): use precision=ieee")
        model = cfg.get("model")
        if model is not None:  # fields added since, read as what the run trained with
            model.setdefault("dyn_hidden", None)  # the block GRU's hidden layer `hidden` wide,
            model.setdefault("dyn_norm", "block")  # normalised per block,
            model.setdefault("prior_layers", 1)  # and a one-layer prior head, torch's init
            model.setdefault("init", "torch")
            model.setdefault("linear_bias", "auto")  # no bias before a norm
            model.setdefault("cnn_act", None)  # the CNNs with `act`,
            model.setdefault("image_bits", None)  # images read as p / 255 - 0.5
        algo = cfg.get("algo")
        if algo is not None:
            algo.setdefault("rec_scale", 1.0)  # the unit Gaussian NLL
            algo.setdefault("reward_scale", 1.0)  # and the reward's, unweighted
            if algo.get("name") == "dreamer_v1":
                algo.setdefault("explore_noise", 0.0)  # the sampled action alone
            if algo.get("name") == "dreamer_v3":
                algo.setdefault("replay_critic", 0.0)  # no replay-critic loss
                # the continue head's probability, learnt on 1 - is_terminal; the start weighed as each flag did
                algo.setdefault("imagined_continue", "probability")
                algo.setdefault("continue_label", "hard")
                algo.setdefault("start_continue", "data" if algo.imagined_continue == "mode" else "model")
                if "optim" in algo:
                    algo.optim.setdefault("kind", "adam")  # Adam, no warmup
                    algo.optim.setdefault("warmup", 0)
        if "train_ratio" in cfg and "train_ratio_unit" not in cfg:  # stored before the unit: per frame
            old, converted = cfg.train_ratio, legacy_train_ratio(cfg)
            cfg.train_ratio, cfg.train_ratio_unit = converted, TRAIN_RATIO_UNIT
            if warn:
                _warn_once(f"a config without train_ratio_unit counted train_ratio={old} replayed steps per env step "
                           f"(frame): read as train_ratio={converted} (x env.action_repeat={_action_repeat(cfg)}) "
                           f"replayed steps per agent step, train_ratio_unit={TRAIN_RATIO_UNIT}")
    return cfg


def _action_repeat(stored: DictConfig) -> int:
    return stored.env.get("action_repeat", 1) if "env" in stored else 1


def legacy_train_ratio(stored: DictConfig):
    """A `train_ratio` from before `train_ratio_unit` (replayed steps per frame) in replayed steps
    per agent step: the same update rate."""
    return stored.train_ratio * _action_repeat(stored)


def check_resume_unit(run_dir: Path, cfg: DictConfig) -> None:
    """Before resuming `run_dir` (it holds checkpoints): refuse a `train_ratio` other than the run's
    own rate when its `config.yaml` predates `train_ratio_unit`. Its train_ratio counted per frame,
    so the same number would now train `env.action_repeat` times more; the converted number
    resumes it unchanged (`upgrade` reads the stored config the same way)."""
    path = Path(run_dir) / "config.yaml"
    if not cfg.resume or not path.is_file():
        return
    stored = OmegaConf.load(path)
    if "train_ratio_unit" in stored or "train_ratio" not in stored:
        return
    converted = legacy_train_ratio(stored)
    if cfg.train_ratio != converted:
        raise ConfigError(
            f"train_ratio={cfg.train_ratio} would change the update rate of the run in run_dir={str(run_dir)!r}: its "
            f"config.yaml predates train_ratio_unit, and its train_ratio={stored.train_ratio} counted replayed steps "
            "per env step (frame). train_ratio now counts replayed steps per agent step (DreamerV3's unit), so that "
            f"run's rate is train_ratio={converted} (= {stored.train_ratio} x env.action_repeat="
            f"{_action_repeat(stored)}): resume with train_ratio={converted}, or use a new run_dir")


GLOBAL_PACKAGE = "# @package _global_"
"""The header of a group file whose keys sit at the config's root (env/pendulum.yaml, experiment/*.yaml)."""


@dataclasses.dataclass(frozen=True)
class ConfigSchema:
    """The fields the files of a config folder (configs/) define, read without composing them.

    Args:
        fields: dotted path of every field and mapping of every file (`batch_size`, `algo.cem.top`),
            a group file's keys under its group (`model/small.yaml`'s `deter`: `model.deter`) unless
            the file is `# @package _global_`; `defaults` and `hydra` left out.
        free: mappings that are empty in some file (`env.kwargs: {}`): any key below them is the user's.
        groups: the config groups (`env`, `algo`, ..., `hydra/launcher`): `group=option` picks a file.
    """

    fields: frozenset[str]
    free: frozenset[str]
    groups: frozenset[str]

    @classmethod
    def read(cls, configs: Path) -> ConfigSchema:
        fields: set[str] = set()
        free: set[str] = set()
        groups = {str(d.relative_to(configs)) for d in configs.rglob("*") if d.is_dir()}
        for path in sorted(configs.rglob("*.yaml")):
            group = str(path.parent.relative_to(configs))
            if group.split("/")[0] == "hydra":
                continue
            text = path.read_text()
            package = "" if group == "." or GLOBAL_PACKAGE in text.splitlines()[:1] else group
            node = OmegaConf.load(path)
            _collect_fields(node, package, fields, free)
        return cls(frozenset(fields), frozenset(free), frozenset(groups))

    def knows(self, key: str) -> bool:
        return key in self.fields or any(key.startswith(f"{mapping}.") for mapping in self.free)

    def nearest(self, key: str) -> str | None:
        """The known field spelt most like `key` (the whole path, else its last part), or None."""
        close = difflib.get_close_matches(key, sorted(self.fields), n=1, cutoff=0.6)
        if close:
            return close[0]
        by_name = {field.rsplit(".", 1)[-1]: field for field in sorted(self.fields)}
        close = difflib.get_close_matches(key.rsplit(".", 1)[-1], sorted(by_name), n=1, cutoff=0.6)
        return by_name[close[0]] if close else None


def _collect_fields(node: DictConfig, prefix: str, fields: set[str], free: set[str]) -> None:
    for key in node.keys():
        if not prefix and key in ("defaults", "hydra"):
            continue
        path = f"{prefix}.{key}" if prefix else str(key)
        fields.add(path)
        value = node._get_node(key)
        if isinstance(value, DictConfig):
            if len(value) == 0:
                free.add(path)
            _collect_fields(value, path, fields, free)


def check_overrides(overrides: list[str], schema: ConfigSchema) -> None:
    """Refuse a command-line override (`key=value`, `+key=value`, `++key=value`, `~key`) whose key
    `schema` does not know, naming the nearest field; group choices (`env=pendulum`,
    `+experiment=dmc_proprio`) and Hydra's own keys (`hydra.*`, `hydra/launcher=...`) pass. Overrides
    Hydra cannot parse pass too: Hydra refuses them itself, saying where."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return
    for override in parsed:
        key = override.key_or_group
        if key in schema.groups or override.package is not None or key.split(".")[0] == "hydra":
            continue
        if not schema.knows(key):
            nearest = schema.nearest(key)
            hint = f"did you mean {nearest}? " if nearest else ""
            free = ", ".join(sorted(schema.free))
            raise ConfigError(f"{override.input_line}: {key!r} is not a config field; {hint}`python scripts/train.py "
                              f"--help` lists the fields. Keys under {free} are free (+env.kwargs.NAME=VALUE: "
                              "a keyword argument of the env's factory)")


def _get(cfg, field: str):
    node = cfg
    for part in field.split("."):
        node = node[part]
    return node


def _has(cfg, field: str) -> bool:
    node = cfg
    for part in field.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node[part]
    return True


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int(cfg, field: str, minimum: int, optional: bool = False) -> None:
    value = _get(cfg, field)
    if optional and value is None:
        return
    if not _is_int(value) or value < minimum:
        extra = " or null" if optional else ""
        raise ConfigError(f"{field}={value!r} must be an int >= {minimum}{extra}")


def _number(cfg, field: str, low: float, high: float, low_open: bool = True, high_open: bool = False,
            optional: bool = False) -> None:
    value = _get(cfg, field)
    if optional and value is None:
        return
    ok = _is_number(value) and not math.isnan(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        extra = " or null" if optional else ""
        raise ConfigError(f"{field}={value!r} must be a number in {left}{low}, {high}{right}{extra}")


def _bool(cfg, field: str) -> None:
    value = _get(cfg, field)
    if not isinstance(value, bool):
        raise ConfigError(f"{field}={value!r} must be true or false")


def _choice(cfg, field: str, choices) -> None:
    value = _get(cfg, field)
    if value not in choices:
        raise ConfigError(f"{field}={value!r} is not valid; expected one of {sorted(choices)}")


def device_available(device: str) -> bool:
    """Whether this machine has `device`, its index included (cuda:1 on a one-GPU machine: no)."""
    device = torch.device(device)
    if device.type == "cpu":
        return True
    module = getattr(torch, device.type, None)
    if module is None or not hasattr(module, "is_available") or not module.is_available():
        return False
    return device.index is None or not hasattr(module, "device_count") or device.index < module.device_count()


def validate(cfg: DictConfig, world_size: int = 1, local_rank: int = 0) -> None:
    """Check every field of a run config (after `upgrade`); raises ConfigError naming the first bad one.
    `world_size`, `local_rank`: torchrun's (train/distributed.py): the sizes each rank splits must
    divide, and the GPU this rank takes must exist."""
    upgrade(cfg)
    check_env_config(cfg.env, error=ConfigError)
    _choice(cfg, "algo.name", ALGOS)
    _choice(cfg, "logger.kind", KINDS)
    if _has(cfg, "precision"):
        _choice(cfg, "precision", PRECISIONS)
    for field in BOOLS:
        if _has(cfg, field):
            _bool(cfg, field)
    _int(cfg, "seed", 0)
    _int(cfg, "threads", 1, optional=True)
    if _has(cfg, "runs_per_gpu"):  # configs stored before it lack it
        _int(cfg, "runs_per_gpu", 1)
    for field, minimum in (("steps", 0), ("prefill", 0), ("batch_size", 1), ("seq_len", 2),
                           ("eval_every", 1), ("eval_episodes", 1), ("save_every", 1), ("log_every", 1),
                           ("collect_steps", 1), ("env.num_envs", 1), ("env.action_repeat", 1),
                           ("env.size", 8), ("replay.capacity", 1), ("algo.horizon", 1)):
        _int(cfg, field, minimum)
    _int(cfg, "env.time_limit", 1, optional=True)
    _number(cfg, "train_ratio", 0, float("inf"), high_open=True)
    _choice(cfg, "train_ratio_unit", (TRAIN_RATIO_UNIT,))
    _number(cfg, "replay.memory_gb", 0, float("inf"), high_open=True, optional=True)
    _check_model(cfg)
    _check_algo(cfg)
    _check_sizes(cfg)
    _check_fp16(cfg)  # before the machine's checks: its refusals hold on any machine
    _check_device_and_backend(cfg)
    _check_replay_on_device(cfg)
    _check_save_frames(cfg)
    _check_compile_nets(cfg)
    if world_size > 1:
        _check_ranks(cfg, world_size, local_rank)
    if cfg.logger.kind == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("logger.kind='tensorboard' needs the tensorboard package, which is not installed: "
                          "pip install 'worldmodels[tensorboard]' (or pick logger=csv / wandb / none)")


def _check_model(cfg) -> None:
    model = cfg.model
    for field in ("deter", "hidden", "stoch", "blocks", "units", "depth", "encoder_layers", "actor_layers"):
        _int(cfg, f"model.{field}", 1)
    _int(cfg, "model.head_layers", 0)
    _int(cfg, "model.classes", 2, optional=True)
    _choice(cfg, "model.cell", CELLS)
    _choice(cfg, "model.norm", NORMS)
    _choice(cfg, "model.act", ACTS)
    if model.get("cnn_act") is not None:
        _choice(cfg, "model.cnn_act", ACTS)
    if model.get("image_bits") is not None:
        _int(cfg, "model.image_bits", 1)
    if (model.get("image_bits") or 0) > 8:
        raise ConfigError(f"model.image_bits={model.image_bits!r} must be an int in 1..8 or null (bits kept of "
                          "each 8-bit pixel value)")
    _number(cfg, "model.min_std", 0, float("inf"), high_open=True)
    _number(cfg, "model.unimix", 0, 1, low_open=False, high_open=True)
    _int(cfg, "model.dyn_hidden", 1, optional=True)
    if "encoder_units" in model:
        _int(cfg, "model.encoder_units", 1, optional=True)
    if "initial_state" in model:
        _choice(cfg, "model.initial_state", INITIALS)
    if "init_fan" in model:
        _choice(cfg, "model.init_fan", FANS)
    if "linear_bias" in model:
        _choice(cfg, "model.linear_bias", LINEAR_BIASES)
    if "actor_outscale" in model:
        _number(cfg, "model.actor_outscale", 0, float("inf"), low_open=False, high_open=True)
    _choice(cfg, "model.dyn_norm", DYN_NORMS)
    if "init" in model:
        _choice(cfg, "model.init", INITS)
        if model.init == "dreamerv3" and cfg.algo.name != "dreamer_v3":
            raise ConfigError(f"model.init=dreamerv3 is DreamerV3's initialisation; algo.name={cfg.algo.name!r} "
                              "builds its nets with model.init=torch")
    _int(cfg, "model.prior_layers", 1)
    if model.cell == "block_gru":
        for field in ("deter", "dyn_hidden" if model.dyn_hidden is not None else "hidden"):
            if model[field] % model.blocks:
                raise ConfigError(f"model.blocks={model.blocks} must divide model.{field}={model[field]} "
                                  "(block_gru splits the state into equal blocks)")


def _check_fp16(cfg) -> None:
    """precision=fp16 scales each optimiser's own loss (RunPrecision): refuse what cannot take that."""
    if cfg.get("precision") != "fp16":
        return
    if cfg.get("backend") == "triton":
        raise ConfigError("precision=fp16 with backend=triton: the fused kernels take float16 autocast as bf16 "
                          "operands; use backend=auto (it runs the RSSM on cudnn or the loop in fp16) or "
                          "precision=bf16")
    algo = cfg.algo
    if algo.get("optim", {}).get("kind", "adam") != "adam":
        raise ConfigError(f"precision=fp16 with algo.optim.kind={algo.optim.kind}: its loss scale skips "
                          "non-finite updates through Adam's fused step; use algo.optim.kind=adam or precision=bf16")
    if algo.name == "dreamer_v3" and algo.get("update_order", "same_weights") == "same_weights":
        raise ConfigError("precision=fp16 with algo.update_order=same_weights: that order steps the world model "
                          "and critic from one backward of their summed losses, where each optimiser's loss "
                          "scale needs a backward of its own; use algo.update_order=world_model_first (the "
                          "2023 reference's, which ran float16) or precision=bf16")


def _check_algo(cfg) -> None:
    algo = cfg.algo
    if algo.name == "dreamer_v1" and _is_int(algo.get("horizon")) and algo.horizon < 2:
        raise ConfigError(f"algo.horizon={algo.horizon} must be >= 2 for algo.name=dreamer_v1: its returns "
                          "cover the imagined states but the last, whose value bootstraps them")
    for field in ("rec_scale", "reward_scale"):
        if field in algo:
            _number(cfg, f"algo.{field}", 0, float("inf"), high_open=True)
    if "gamma" in algo:
        _number(cfg, "algo.gamma", 0, 1)
    if "lam" in algo:
        _number(cfg, "algo.lam", 0, 1, low_open=False)
    if "explore_noise" in algo:
        _number(cfg, "algo.explore_noise", 0, float("inf"), low_open=False, high_open=True)
    if "actor_dist" in algo:
        _choice(cfg, "algo.actor_dist", DISTS)
    if "actor_grad" in algo:
        _choice(cfg, "algo.actor_grad", ("reinforce", "backprop"))
    if algo.get("start_state") == "previous_batch":
        raise ConfigError("algo.start_state='previous_batch' is not a choice: the 2023 reference carries the "
                          "previous batch's last state, but its replay marks each sequence's first step "
                          "is_first, which resets it; algo.start_state=initial does what its runs did")
    for field, choices in (("update_order", UPDATE_ORDERS), ("start_state", START_STATES),
                           ("imagined_continue", IMAGINED_CONTINUES), ("continue_label", CONTINUE_LABELS),
                           ("start_continue", START_CONTINUES)):  # DreamerV3's update choices
        if field in algo:
            _choice(cfg, f"algo.{field}", choices)
    if (conflict := update_conflict(algo)) is not None:
        raise ConfigError(conflict)
    if "cem" in algo:
        for field in ("horizon", "candidates", "top", "iterations"):
            _int(cfg, f"algo.cem.{field}", 1)
        if algo.cem.top > algo.cem.candidates:
            raise ConfigError(f"algo.cem.top={algo.cem.top} must be <= algo.cem.candidates={algo.cem.candidates} "
                              "(CEM refits its action distribution to the best `top` of `candidates` plans)")
    if "twohot_bins" in algo:
        _choice(cfg, "algo.twohot_bins", TWOHOT_BINS)
    if algo.get("value_layers") is not None:
        _int(cfg, "algo.value_layers", 1)
    if "actor_init_std" in algo and algo.actor_init_std is not None:
        _number(cfg, "algo.actor_init_std", 0, float("inf"), high_open=True)
    if "kl" in algo and "free_on" in algo.kl:
        _choice(cfg, "algo.kl.free_on", ("step", "mean"))
    if algo.get("actor_dist") == "bounded_normal" and not 0 < algo.actor_min_std < algo.get("actor_max_std", 1.0):
        raise ConfigError(f"algo.actor_dist=bounded_normal needs 0 < algo.actor_min_std < algo.actor_max_std, "
                          f"got {algo.actor_min_std} and {algo.get('actor_max_std', 1.0)}")
    for name in algo.optim:
        if name.endswith("_lr") or name.endswith("eps"):
            _number(cfg, f"algo.optim.{name}", 0, float("inf"), high_open=True)
        if name.endswith("clip"):
            _number(cfg, f"algo.optim.{name}", 0, float("inf"), low_open=False, high_open=True)
    if "replay_critic" in algo:
        _number(cfg, "algo.replay_critic", 0, float("inf"), low_open=False, high_open=True)
    if "kind" in algo.optim:
        _choice(cfg, "algo.optim.kind", OPTIMIZERS)
    if algo.optim.get("warmup", 0):
        _int(cfg, "algo.optim.warmup", 0)
        if algo.optim.get("kind", "adam") != "laprop":
            raise ConfigError(f"algo.optim.warmup={algo.optim.warmup} is LaProp's warmup: set algo.optim.kind=laprop "
                              "(Adam here takes none) or algo.optim.warmup=0")


def _ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system that tells
        return None


def _check_replay_fits_in_ram(cfg) -> None:
    """A replay in RAM takes its whole storage on the first add (torchrl's LazyTensorStorage), so a
    preset sized for a large machine fails there with a bare allocation error after the envs and the
    model are built. Refused here from a lower bound of its size (a step's frame and scalars)."""
    if cfg.replay.get("memmap", False) or _replay_on_gpu(cfg):
        return
    ram = _ram_bytes()
    if ram is None:
        return
    need = _replay_bytes(cfg)
    if need > ram:
        raise ConfigError(f"replay.capacity={cfg.replay.capacity} / replay.memory_gb={cfg.replay.memory_gb} take at "
                          f"least {need / 2**30:.1f} GiB in RAM, more than this machine's {ram / 2**30:.1f} GiB: "
                          "lower replay.memory_gb (or replay.capacity), or set replay.memmap=true (files in run_dir)")


def _replay_bytes(cfg) -> int:
    """A lower bound of the bytes a full replay takes (a step's frame and scalars, times its capacity
    capped by `replay.memory_gb`)."""
    channels = 1 if cfg.env.get("grayscale", False) else 3
    step_bytes = _MIN_STEP_BYTES + (cfg.env.size ** 2 * channels if cfg.env.get("pixels", False) else 0)
    if cfg.algo.get("replay_context", False):
        step_bytes += 2 * cfg.model.deter  # the stored filter state's deter, bfloat16 (agent.py)
    need = cfg.replay.capacity * step_bytes
    if cfg.replay.memory_gb is not None:
        need = min(need, cfg.replay.memory_gb * 2**30)
    return need


def _replay_on_gpu(cfg) -> bool:
    return bool(cfg.replay.get("on_device", False)) and torch.device(cfg.device).type == "cuda"


def _check_replay_on_device(cfg) -> None:
    """`replay.on_device=true` with a CUDA device keeps the steps in the GPU's memory: not with
    memory-mapped host files, and refused here where the full replay would not fit in that GPU's memory
    (it is allocated at the first add). With device=cpu it changes nothing."""
    if not _replay_on_gpu(cfg):
        return  # device=cpu: the steps are on the host either way (in files with replay.memmap=true)
    if cfg.replay.get("memmap", False):
        raise ConfigError(f"replay.on_device=true keeps the steps in {cfg.device}'s memory and replay.memmap=true in "
                          "host files: set one of them to false")
    device = torch.device(cfg.device)
    total = torch.cuda.get_device_properties(device.index or 0).total_memory
    need = _replay_bytes(cfg)
    if need > 0.8 * total:  # the model, its update's activations and the CUDA graphs need the rest
        raise ConfigError(f"replay.on_device=true: replay.capacity={cfg.replay.capacity} / replay.memory_gb="
                          f"{cfg.replay.memory_gb} take at least {need / 2**30:.1f} GiB, more than 80% of "
                          f"{cfg.device}'s {total / 2**30:.1f} GiB: lower replay.memory_gb, or set "
                          "replay.on_device=false (host memory)")


def _check_save_frames(cfg) -> None:
    """`replay.save_frames=false` saves a pixel replay without its frames, rendered again from the
    simulator states on resume: only where the env renders frames from a state it records."""
    if cfg.replay.get("save_frames", True):
        return
    if frame_renderer(cfg.env) is None:  # the env config itself was checked first (check_env_config)
        raise ConfigError(f"replay.save_frames=false needs a pixel env that renders its frames from a simulator state "
                          f"it records (env.pixels=true, suite dmc); env {resolve_env(cfg.env)[0]!r} has "
                          f"pixels={bool(cfg.env.get('pixels', False))}: set replay.save_frames=true")


def _check_sizes(cfg) -> None:
    """Sizes that must agree with each other: a replay must hold a sequence, an episode must be
    at least a sequence long (an episode of L agent steps stores L + 1 steps, its reset included)."""
    if cfg.replay.capacity < cfg.seq_len:
        raise ConfigError(f"replay.capacity={cfg.replay.capacity} must be >= seq_len={cfg.seq_len}: "
                          "it could never hold one sequence")
    memory_gb = cfg.replay.memory_gb
    if memory_gb is not None and memory_gb * 2**30 < cfg.seq_len * _MIN_STEP_BYTES:
        raise ConfigError(f"replay.memory_gb={memory_gb} holds fewer than seq_len={cfg.seq_len} steps of any env "
                          f"(a step takes at least {_MIN_STEP_BYTES} bytes)")
    _check_replay_fits_in_ram(cfg)
    if cfg.replay.get("cross_episodes", False):
        return  # sequences run on across episode ends: any episode length will do
    suite, task = resolve_env(cfg.env, ConfigError)
    frames = suites.get(suite).episode_frames(task)
    if cfg.env.time_limit is not None:
        length, why = cfg.env.time_limit, f"env.time_limit={cfg.env.time_limit}"
    elif frames is not None:
        length = frames // cfg.env.action_repeat
        why = f"{cfg.env.name} episodes last at most {frames} frames / env.action_repeat={cfg.env.action_repeat}"
    else:
        return
    if cfg.seq_len > length + 1:
        raise ConfigError(f"seq_len={cfg.seq_len} is longer than any episode ({why} = {length} agent steps, "
                          f"{length + 1} stored steps): no sequence could ever be sampled and nothing would "
                          "train; lower seq_len, raise env.time_limit, or set replay.cross_episodes=true")


def _check_ranks(cfg, world_size: int, local_rank: int) -> None:
    """A data-parallel run (torchrun, WORLD_SIZE > 1) splits the global batch, the envs and the
    replay evenly over its ranks, and each rank takes GPU `local_rank`."""
    launch = f"torchrun's WORLD_SIZE={world_size}"
    for field in ("batch_size", "env.num_envs"):
        value = _get(cfg, field)
        if value % world_size:
            raise ConfigError(f"{field}={value} must be divisible by the number of ranks ({launch}): it is the "
                              "total over ranks, each takes an equal share; pick a multiple of the world size")
    if -(-cfg.replay.capacity // world_size) < cfg.seq_len:
        raise ConfigError(f"replay.capacity={cfg.replay.capacity} split over {world_size} ranks ({launch}) holds "
                          f"fewer than seq_len={cfg.seq_len} steps per rank: raise replay.capacity")
    device = torch.device(cfg.device)
    if device.type == "cuda":
        if device.index is not None:
            raise ConfigError(f"device={cfg.device!r} names one GPU, but {launch} ranks each take their own: "
                              "use device=cuda (rank with LOCAL_RANK=i takes cuda:i)")
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"device='cuda' under torchrun: LOCAL_RANK={local_rank} needs GPU {local_rank}, this "
                              f"machine has {torch.cuda.device_count()}; start at most that many processes per "
                              "machine (--nproc-per-node)")


def _check_device_and_backend(cfg) -> None:
    device = cfg.device
    if not isinstance(device, str):
        raise ConfigError(f"device={device!r} must be a string: cpu, cuda or cuda:N")
    try:
        available = device_available(device)
    except RuntimeError as err:
        raise ConfigError(f"device={device!r} is not a device: {err}") from None
    if not available:
        raise ConfigError(f"device={device!r} is not available on this machine")
    _choice(cfg, "backend", (*BACKENDS, "auto"))
    usable = available_backends(device)
    if cfg.backend not in (*usable, "auto"):
        raise ConfigError(f"backend={cfg.backend!r} is not available in this build on device={device!r}; "
                          f"available: {list(usable)} or 'auto'")
    if cfg.backend == "cudnn" and torch.device(device).type == "cuda" and not torch.backends.cudnn.is_available():
        raise ConfigError("backend='cudnn' needs cuDNN, which this CUDA device lacks")


def _check_compile_nets(cfg) -> None:
    """`compile_nets=true` with `cuda_graphs=true` on CUDA is refused: the graphed update with
    inductor-compiled nets captures, but measures no faster than the graphed update without them, and
    costs the compile (docs/pace.md, "Compiled nets", has the figures and the command)."""
    if (cfg.get("compile_nets", False) and cfg.get("cuda_graphs", True)
            and torch.device(cfg.device).type == "cuda"):
        raise ConfigError("compile_nets=true cannot run with cuda_graphs=true on CUDA: the graphed update with "
                          "compiled nets has measured no faster than without them (docs/pace.md); set "
                          "compile_nets=false, or cuda_graphs=false to run the compiled nets eagerly")
