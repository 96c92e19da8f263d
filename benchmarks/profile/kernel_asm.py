"""Compile the triton RSSM kernels of a benchmark case for the H200 (sm_90) on any machine, a CPU
one included, and count how wide their global -> shared copies are, per source line.

    python -m benchmarks.profile.kernel_asm V3-1m-imagine-actor [--grad] [--split 2] [--input-table] [--out DIR]

The case is one of `benchmarks/triton_rssm.py`'s. The host code runs on CPU tensors as on the GPU,
with the launch configuration the H200 gets (`_config` for CUDA; SPLIT ranks each in a program of
its own, sized for 132 SMs unless `--split`), but every launch is replaced by an offline compile
for sm_90 (Triton's own binder, so argument specialisation is the JIT's). Per kernel it prints the
`cp.async` copies by width and source line (16 bytes: vectorised; 4 bytes: one element per copy),
the registers and spill bytes Triton's bundled ptxas gives the PTX (a kernel at 255 registers that
spills keeps values in local memory), and writes the TTGIR and PTX to `--out`. This found the
block-diagonal layers' 4-byte weight copies (`docs/kernels.md`, "16-byte copies"). `--grad` also
runs the backward (the reverse-chain kernel). No kernel runs: the outputs are garbage, the compile is the point.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

import torch

SMS = 132  # H200
COPY = re.compile(r"cp\.async\.c[ag]\.shared\.global \[[^\]]*\], \[[^\]]*\], (0x[0-9a-f]+)")
LOC = re.compile(r"\s*\.loc\s+(\d+)\s+(\d+)\s+\d+")
FILE = re.compile(r'\s*\.file\s+(\d+)\s+"([^"]+)"')
USAGE = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads|Used (\d+) registers")


def copy_widths(ptx: str) -> dict[tuple[str, int, int], int]:
    """(source file name, line, bytes) -> number of `cp.async` global -> shared copies in `ptx`,
    attributed to the `.loc` line before each."""
    lines = ptx.splitlines()
    files = {m.group(1): Path(m.group(2)).name for m in map(FILE.match, lines) if m}  # listed at the end
    where = ("?", 0)
    counts: collections.Counter = collections.Counter()
    for line in lines:
        if m := LOC.match(line):
            where = (files.get(m.group(1), m.group(1)), int(m.group(2)))
        elif m := COPY.search(line):
            counts[(*where, int(m.group(1), 16))] += 1
    return dict(counts)


def resource_usage(ptxas_output: str) -> dict[str, int]:
    """Registers and spill bytes from `ptxas -v`'s report."""
    usage = {}
    for m in USAGE.finditer(ptxas_output):
        if m.group(3):
            usage["registers"] = int(m.group(3))
        else:
            usage["spill_stores"], usage["spill_loads"] = int(m.group(1)), int(m.group(2))
    return usage


def _ptxas_usage(ptx_file: Path) -> dict[str, int]:
    """`resource_usage` of one PTX file, assembled for sm_90a by the ptxas Triton ships."""
    import subprocess

    from triton.backends.nvidia.compiler import get_ptxas

    done = subprocess.run([get_ptxas(90).path, "--gpu-name", "sm_90a", "-v", str(ptx_file), "-o", "/dev/null"],
                          capture_output=True, text=True, check=True)
    return resource_usage(done.stderr + done.stdout)


def _patch_launches(out: Path, split: int | None) -> None:
    """Make the triton launcher plan for the H200 and compile instead of launching."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    from worldmodels.ops.rssm.fused import entry, launch, share

    target = GPUTarget("cuda", 90, 32)
    tiles = launch._base_tiles
    launch._base_tiles = lambda device, dtype, batch, weight_bytes: tiles(
        torch.device("cuda"), dtype, batch, weight_bytes)

    def compile_only(kernel, plan, **args):
        backend = make_backend(target)
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        kwargs = dict(args, num_warps=plan.num_warps, debug=False, instrumentation_mode="")
        bound, specialization, options = binder(**kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
        compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                                  options=options.__dict__)
        name = kernel.fn.__name__
        for kind in ("ttgir", "ptx"):
            (out / f"{name}.{kind}").write_text(compiled.asm[kind])
        keys = {f: getattr(plan, f) for f in ("block_b", "block_n", "block_k", "num_warps", "fold", "count_barrier",
                                              "k_split_rows", "blocks_k_major", "preload_h")}
        print(f"{name}: grid {(plan.tiles, plan.nprog)}, {keys}, shared memory {compiled.metadata.shared} B")
        usage = _ptxas_usage(out / f"{name}.ptx")
        print(f"   {usage.get('registers')} registers, spills: {usage.get('spill_stores', 0)} bytes stored, "
              f"{usage.get('spill_loads', 0)} bytes loaded")
        for (file, line, width), n in sorted(copy_widths(compiled.asm["ptx"]).items()):
            print(f"   {n:4d} x {width:2d}-byte cp.async  {file}:{line}")

    launch._gpu_sms = lambda device: SMS  # the H200's SM count: its narrow-tile, split and fold rules
    if split:  # any number of ranks, each a program (compiled only: more programs than SMs are allowed)
        launch._split = lambda asked, tiles, col_tiles, sms: (split, split)
    launch._launch = compile_only
    # the action share's own small launch (`share.py`) on torch instead, its result as the launch takes it
    from worldmodels.ops.rssm import reference
    share.action_share = reference.action_in
    entry._check_runs = lambda *a, **k: None  # the backend would refuse CPU tensors


def main(argv=None) -> None:
    from benchmarks.triton_rssm import CASES, forward_backward, make_case

    p = argparse.ArgumentParser(prog="python -m benchmarks.profile.kernel_asm", description=__doc__.split("\n\n")[0])
    p.add_argument("case", choices=list(CASES))
    p.add_argument("--grad", action="store_true", help="also compile the backward's reverse-chain kernel")
    p.add_argument("--split", type=int, default=None, help="column ranks (default: as the H200 gets)")
    p.add_argument("--precision", default="tf32", choices=("ieee", "tf32", "tf32x3", "bf16"))
    p.add_argument("--out", default="kernel_asm", help="directory for the TTGIR and PTX")
    p.add_argument("--input-table", action="store_true",
                   help="compile the kernels as a no-grad CUDA-graph capture launches them: every input they can "
                        "read through the graph's input table read through it (core/cuda_graphs.InputTable)")
    args = p.parse_args(argv)
    if args.split is not None and args.split < 1:
        p.error(f"--split={args.split} must be >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _patch_launches(out, args.split)
    if args.input_table:
        from worldmodels.core import cuda_graphs
        cuda_graphs.graph_input = lambda tensor: (torch.zeros(1, dtype=torch.int64), True)
    import worldmodels as wm
    from worldmodels.ops.rssm.fused import entry

    wm.set_recurrent_matmul_precision(args.precision)
    call = make_case(args.case, device="cpu", grad=args.grad)
    if args.grad:
        forward_backward(call, entry, None)
    else:
        with torch.no_grad():
            call(entry, None)


if __name__ == "__main__":
    main()
