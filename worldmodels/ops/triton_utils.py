"""What the fused Triton ops (`ops/rnn/fused/`, `ops/rssm/fused/`) share, one copy each.

Host side, importable without triton (the registry asks `fits` on CPU installs too):
- the interpreter check `INTERPRET` and the `L2_BUDGET_BYTES` the persistent kernels keep resident;
- launch overrides for benchmarks and tests (`launch_overrides`, `overrides`, `LAUNCH_KEYS`), and
  `pinned_launch`, which a fused op's backward runs under to plan as its forward did;
- the triton backend's `fits` (which asks each fused op's own);
- one-time warnings (`warn_once`, `warn_if_slower_than_cudnn`), `wants_grad`;
- how the kernels take operands: `kernel_precision`, `operand_dtype`, `lines` (128-byte rows).

Device side, where triton is installed: the @triton.jit helpers every kernel calls (a jit function
imported from here resolves its own names in this module):
- activations: `sigmoid`, `tanh`, `activation` / `activation_grad` (ELU, SiLU, ReLU, identity),
  `softplus`, `rsqrt`;
- dots: `dot` in each precision (`round_tf32`);
- cross-program barriers: `step_barrier` (one flag per program), `count_barrier` (one counter per
  batch tile) and `sync`, the epoch barrier the RSSM kernels call, whose flags' dtype picks the mode.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings

import torch

from worldmodels.core.triton_support import interpreting

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton: the host helpers still import
    triton = None

INTERPRET = interpreting()
"""Triton's interpreter (TRITON_INTERPRET=1, read at import: the tests set it before importing the kernels)."""

L2_BUDGET_BYTES = 24 << 20
"""The weights a persistent kernel reads every step must stay resident in L2 across steps (50 MB on Hopper GPUs)."""

ACT_CODES = {"elu": 0, "silu": 1, "relu": 3}
"""The kernels' ACT constexpr for each activation name (`activation`; 2 is the identity)."""

LAUNCH_KEYS = {
    "rnn": ("BLOCK_B", "BLOCK_H", "BLOCK_K", "SPLIT", "W_RESIDENT", "num_warps", "BARRIER"),
    "rssm": ("BLOCK_B", "BLOCK_N", "BLOCK_K", "num_warps", "SPLIT", "FOLD_NORMS", "COUNT_BARRIER", "KSPLIT_ROWS",
             "BLOCKS_KMAJOR", "PRELOAD_H", "BARRIER", "PROFILE"),
}
"""The launch keys benchmarks and tests may override, per fused op (docs/kernels.md has their defaults)."""

_overrides: contextvars.ContextVar[dict] = contextvars.ContextVar("launch_overrides", default={})


@contextlib.contextmanager
def launch_overrides(op: str, **keys):
    """Override launch keys of fused op `op` ("rnn" or "rssm") for the calls inside (benchmarks, tests).

        with launch_overrides("rssm", SPLIT=2, BLOCK_N=16):
            rssm.observe(...)
    """
    unknown = sorted(set(keys) - set(LAUNCH_KEYS[op]))
    if unknown:
        raise ValueError(f"unknown {op} launch keys {unknown}; expected some of {list(LAUNCH_KEYS[op])}")
    with pinned_launch(op, {**overrides(op), **keys}):
        yield


@contextlib.contextmanager
def pinned_launch(op: str, keys: dict):
    """Exactly `keys` overridden for `op` inside, whatever the caller's context. A fused op's backward
    runs under the keys its forward saw: autograd runs a CUDA backward on its device thread, which does
    not see the caller's `launch_overrides` (context variables stay with their thread), and the RSSM's
    saved scratch is laid out by the forward's plan."""
    current = _overrides.get()
    token = _overrides.set({**current, op: dict(keys)})
    try:
        yield
    finally:
        _overrides.reset(token)


def overrides(op: str) -> dict:
    """The launch keys of `op` overridden in this context (empty outside `launch_overrides`)."""
    return _overrides.get().get(op, {})


def fits(problem: dict) -> bool:
    """The triton backend's `fits` (registered by name in `core/backends.py`): the RSSM op's rule for
    RSSM unrolls (problems with a "spec"), the GRU / LSTM op's otherwise."""
    if "spec" in problem:
        from worldmodels.ops.rssm.fused import fits as rssm_fits
        return rssm_fits(problem)
    from worldmodels.ops.rnn.fused import fits as rnn_fits
    return rnn_fits(problem)


# ---------------------------------------------------------------------------------------------- warnings
_warned: set = set()


def warn_once(message: str, stacklevel: int = 3) -> None:
    """`warnings.warn(message)` the first time this message is given in the process."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=stacklevel)


def warn_if_slower_than_cudnn(device: torch.device, dtype: torch.dtype, precision: str, op: str) -> None:
    """One warning per op when an explicit `backend="triton"` call runs where it is slower than
    `cudnn`: fp32 in "ieee" precision on CUDA, where Triton's dots are FMA reductions on the CUDA
    cores and cuBLAS / cuDNN run the same IEEE math faster (docs/kernels.md). `auto` never picks
    triton there."""
    if device.type != "cuda" or dtype != torch.float32 or precision != "ieee":
        return
    warn_once(f"backend='triton' runs {op} in 'ieee' precision as fp32 FMA dots, without tensor cores: slower "
              f"than backend='cudnn' (or 'auto', which picks it here). For the fused kernels use precision "
              f"'tf32', 'tf32x3' or 'bf16' (precision= on the module, set_recurrent_matmul_precision, or the "
              f"run config's precision=)", stacklevel=5)


# ---------------------------------------------------------------------------------------------- operands
def wants_grad(tensors) -> bool:
    """Whether autograd will ask for a gradient through any of `tensors` (None entries allowed)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def kernel_precision(precision: str, state_dtype: torch.dtype) -> str:
    """The kernels' PRECISION constexpr (`dot`'s mode) for a matmul precision and state dtype: float64
    as FMA reductions on the GPU (tl.dot under the interpreter), "bf16" emulated under the interpreter."""
    if state_dtype == torch.float64:
        return "ieee" if INTERPRET else "fma"
    if precision == "bf16":
        return "bf16-emulated" if INTERPRET else "bf16"
    return precision


def operand_dtype(precision: str, state_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the dot operands the kernels stream: bf16 weights in bf16 mode on the GPU
    (the interpreter emulates it by rounding fp32 operands), else the state dtype."""
    if precision == "bf16" and state_dtype == torch.float32 and not INTERPRET:
        return torch.bfloat16
    return state_dtype


def lines(n: int) -> int:
    """n rounded up to whole 128-byte lines of fp32 (32 elements; 2 lines of fp64): the rows of the
    buffers one program writes and another reads (the kernels' memory-ordering rule)."""
    return -(-n // 32) * 32


# ---------------------------------------------------------------------------------------------- jit helpers
if triton is not None:

    # ------------------------------------------------------------------------------------------ activations
    @triton.jit
    def sigmoid(x):
        return 1.0 / (1.0 + tl.exp(-x))

    @triton.jit
    def tanh(x):
        return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0

    @triton.jit
    def activation(x, ACT: tl.constexpr):
        """ACT (`ACT_CODES`) 0: ELU (alpha 1), 1: SiLU, 2: identity, 3: ReLU."""
        if ACT == 0:
            return tl.where(x > 0, x, tl.exp(tl.minimum(x, 0.0)) - 1.0)
        elif ACT == 1:
            return x * sigmoid(x)
        elif ACT == 3:
            return tl.maximum(x, 0.0)
        else:
            return x

    @triton.jit
    def activation_grad(y, ACT: tl.constexpr):
        """d act(y) / dy. ACT 0: ELU (alpha 1), 1: SiLU, 3: ReLU (0 at y = 0, as torch's)."""
        if ACT == 0:
            d = tl.where(y > 0, 1.0, tl.exp(tl.minimum(y, 0.0)))
        elif ACT == 3:
            d = tl.where(y > 0, 1.0, 0.0)
        else:
            s = sigmoid(y)
            d = s * (1.0 + y * (1.0 - s))
        return d

    @triton.jit
    def softplus(x):
        """torch's softplus (threshold 20), in a form that cannot overflow."""
        return tl.where(x > 20.0, x, tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x))))

    @triton.jit
    def rsqrt(var):
        if var.dtype == tl.float32:  # IEEE-rounded (tl.sqrt is the fast approximation in fp32)
            return 1.0 / tl.sqrt_rn(var)
        else:
            return 1.0 / tl.sqrt(var)

    # ------------------------------------------------------------------------------------------ dots
    @triton.jit
    def _add(a, b):
        return a + b

    @triton.jit
    def round_tf32(x):
        """fp32 -> the nearest tf32 value (ties away from zero; what `cvt.rna.tf32.f32` computes). Fed
        raw fp32, the tensor cores drop the low 13 mantissa bits: a truncation towards zero, whose
        error has the same sign for every term of a dot and adds up over K and over steps (a bias),
        where a rounded operand's error is unbiased."""
        bits = x.to(tl.uint32, bitcast=True)
        return ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)

    @triton.jit
    def dot(a, b, acc, PRECISION: tl.constexpr):
        """acc + a @ b in the requested matmul precision (acc fp32, or fp64 for fp64 operands)."""
        if PRECISION == "fma":  # float64 on the GPU: Triton 3.6 has no fp64 MMA for these tiles on sm90
            return acc + tl.reduce(a[:, :, None] * b[None, :, :], 1, _add)
        elif PRECISION == "tf32":  # operands rounded to nearest, not truncated by the MMA (`round_tf32`)
            return tl.dot(round_tf32(a.to(tl.float32)), round_tf32(b), acc, input_precision="tf32",
                          out_dtype=acc.dtype)
        elif PRECISION == "bf16":
            return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
        elif PRECISION == "bf16-emulated":  # the interpreter cannot dot bf16: round, then fp32 dot
            return tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32), acc,
                          input_precision="ieee")
        else:
            return tl.dot(a.to(b.dtype), b, acc, input_precision=PRECISION, out_dtype=acc.dtype)

    # ------------------------------------------------------------------------------------------ barriers
    @triton.jit
    def step_barrier(flags_ptr, pid_b, pid_c, epoch, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr,
                     BARRIER: tl.constexpr):
        """Every program of this batch tile has finished step `epoch` (stores visible) on return.
        BARRIER=False skips the cross-program part: wrong results, only to time what it costs."""
        tl.debug_barrier()
        if SPLIT > 1 and BARRIER:
            group = flags_ptr + pid_b * SPLIT
            tl.atomic_xchg(group + pid_c, epoch, sem="release", scope="gpu")
            peers = tl.arange(0, SPLIT_P2)
            seen = tl.atomic_add(group + peers, 0, mask=peers < SPLIT, sem="acquire", scope="gpu")
            low = tl.min(tl.where(peers < SPLIT, seen, epoch), 0)
            while low < epoch:
                seen = tl.atomic_add(group + peers, 0, mask=peers < SPLIT, sem="acquire", scope="gpu")
                low = tl.min(tl.where(peers < SPLIT, seen, epoch), 0)
            tl.debug_barrier()

    @triton.jit
    def count_barrier(flags_ptr, pid_b, epoch, SPLIT: tl.constexpr):
        """`step_barrier` on one counter per batch tile (its first program's flag, unsigned): each
        program adds 1 and waits for epoch * SPLIT. A poll is one read per program (Triton compiles the
        add of 0 to one `ld.acquire`, broadcast to the CTA through shared memory), where
        `step_barrier`'s is an acquire atomic per peer (SPLIT^2 atomics on the same lines per round:
        4,096 at 64 ranks). Launch key COUNT_BARRIER (`ops/rssm/fused/launch._flags`)."""
        tl.debug_barrier()
        if SPLIT > 1:
            counter = flags_ptr + pid_b * SPLIT
            target = (epoch * SPLIT).to(counter.dtype.element_ty)
            tl.atomic_add(counter, 1, sem="release", scope="gpu")
            seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
            while seen < target:
                seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
            tl.debug_barrier()

    @triton.jit
    def _stamp(flags, pid_b, pid_c, epoch, side, NPROG: tl.constexpr):
        """Profile mode: this program's %globaltimer (ns) -> the int64 record after the P flags,
        flags[P + 2 (epoch P + program) + side] (side 0: the barrier reached, 1: passed)."""
        tl.debug_barrier()  # the whole program has got here
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                        pack=1)
        programs = tl.num_programs(0) * tl.num_programs(1)
        tl.store(flags + programs + 2 * (epoch * programs + pid_b * NPROG + pid_c) + side, now)

    @triton.jit
    def sync(flags, pid_b, pid_c, epoch, NPROG: tl.constexpr, NPROG_P2: tl.constexpr):
        """Barrier over the NPROG programs of this batch tile; returns the next epoch. The flags'
        dtype picks the launch's modes (`ops/rssm/fused/launch._flags`): int32 one epoch flag per program
        (`step_barrier`), uint32 one counter per batch tile (`count_barrier`, launch key
        COUNT_BARRIER); timing-only: int16 skips the cross-program wait (wrong results), int64 /
        uint64 record when each program reaches and passes every barrier (`benchmarks.profile.phase_profile`)."""
        epoch += 1
        kind = flags.dtype.element_ty
        profiled: tl.constexpr = kind == tl.int64 or kind == tl.uint64
        if profiled:
            _stamp(flags, pid_b, pid_c, epoch, 0, NPROG)
        if kind == tl.uint32 or kind == tl.uint64:
            count_barrier(flags, pid_b, epoch, NPROG)
        else:
            step_barrier(flags, pid_b, pid_c, epoch, NPROG, NPROG_P2, kind != tl.int16)
        if profiled:
            _stamp(flags, pid_b, pid_c, epoch, 1, NPROG)
        return epoch
