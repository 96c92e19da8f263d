"""How fp32 operands become tf32 in a matmul, and what it costs in error (CUDA).

    python -m benchmarks.tf32_rounding [--out FILE]

For one [M, K] @ [K, N] product per K, against the float64 product of the same fp32 inputs:
cuBLAS in TF32 (`allow_tf32`), a Triton `tl.dot(input_precision="tf32")` fed raw fp32 operands, the
same dot fed operands rounded to the nearest tf32 first (`ops/triton_utils.round_tf32`, what the
kernels do now), and two float64 emulations: operands truncated to tf32 (the low 13 mantissa bits
dropped) and rounded to nearest. Each row reports the relative error (Frobenius norm) and the mean
signed error relative to the mean |product| (a bias: non-zero when every term errs the same way),
on normal inputs and on positive ones (uniform [0, 1), where a one-signed operand error adds up
over K). `matches` names the emulation each GPU result is closest to.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks._cli import add_out, write_json

M = N = 128


def _kernels():
    import triton
    import triton.language as tl

    from worldmodels.ops.triton_utils import round_tf32

    @triton.jit
    def matmul(a, b, c, K, ROUND: tl.constexpr, BLOCK_K: tl.constexpr):
        rows, cols, kk = tl.arange(0, 128), tl.arange(0, 128), tl.arange(0, BLOCK_K)
        acc = tl.zeros((128, 128), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(a + rows[:, None] * K + (k0 + kk)[None, :])
            y = tl.load(b + (k0 + kk)[:, None] * 128 + cols[None, :])
            if ROUND:
                x, y = round_tf32(x), round_tf32(y)
            acc = tl.dot(x, y, acc, input_precision="tf32")
        tl.store(c + rows[:, None] * 128 + cols[None, :], acc)

    return matmul


def _to_tf32(x: torch.Tensor, nearest: bool) -> torch.Tensor:
    bits = x.view(torch.int32)
    if nearest:
        bits = bits + 0x1000
    return (bits & ~0x1FFF).view(torch.float32)


def measure(k: int, positive: bool, matmul) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(k)
    draw = torch.rand if positive else torch.randn
    a = draw(M, k, device="cuda", generator=gen)
    b = draw(k, N, device="cuda", generator=gen)
    exact = a.double() @ b.double()
    results = {}
    torch.backends.cuda.matmul.allow_tf32 = True
    results["cublas_tf32"] = (a @ b).double()
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, rounded in (("triton_raw", False), ("triton_rounded", True)):
        c = torch.empty(M, N, device="cuda")
        matmul[(1,)](a, b, c, k, ROUND=rounded, BLOCK_K=32, num_warps=8)
        results[name] = c.double()
    emulated = {name: _to_tf32(a, nearest).double() @ _to_tf32(b, nearest).double()
                for name, nearest in (("truncated", False), ("nearest", True))}
    scale = exact.abs().mean()
    row = {"K": k, "inputs": "uniform[0,1)" if positive else "normal"}
    for name, out in {**results, **{f"emulated_{n}": v for n, v in emulated.items()}}.items():
        row[name] = {"rel_error": ((out - exact).norm() / exact.norm()).item(),
                     "bias": ((out - exact).mean() / scale).item()}
    for name, out in results.items():
        row[name]["matches"] = min(emulated, key=lambda e: (out - emulated[e]).norm().item())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_out(parser, help="write the rows as JSON here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    matmul = _kernels()
    rows = [measure(k, positive, matmul) for positive in (False, True) for k in (256, 1024, 4096)]
    print("| inputs | K | cuBLAS tf32 | Triton tf32 raw | Triton tf32 rounded | emulated truncation | "
          "emulated nearest |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r[n]['rel_error']:.2e} (bias {r[n]['bias']:+.1e})" for n in
                 ("cublas_tf32", "triton_raw", "triton_rounded", "emulated_truncated", "emulated_nearest")]
        print(f"| {r['inputs']} | {r['K']} | " + " | ".join(cells) + " |")
    print("closest emulation:", {r["inputs"] + f" K{r['K']}": {n: r[n]["matches"] for n in
                                  ("cublas_tf32", "triton_raw", "triton_rounded")} for r in rows})
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
