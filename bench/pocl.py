"""Speed of generated OpenCL kernels on the local PoCL device, against references measured in the same run.

* float32 1024^3 matmul: GFLOP/s of the model's top-1 and of the best of the top-10, next to numpy (OpenBLAS),
  and the wall time of the whole build (construction, rendering, compiling and timing all ten);
* memory-bound ops (relu, pooling, reductions): GB/s of compulsory traffic, next to a plain copy kernel.

Run: ``python bench/pocl.py [--hw pocl-cpu] [--md FILE]``. These machines are noisy: compare ratios, not
absolute numbers, and only within one run.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import roller
import roller.hw as H
from roller.backends import get
from roller.construction import construct
from roller.ir import load_op
from roller.numpy_reference import random_inputs

MEMORY_OPS = [
    {"name": "relu_16x64x56x56", "op": "elementwise", "fn": "relu", "shapes": {"X": [16, 64, 56, 56]}},
    {"name": "avgpool3x3", "op": "avgpool2d", "N": 16, "C": 64, "H": 56, "W": 56, "K": 3, "stride": 1,
     "padding": "SAME"},
    {"name": "maxpool2x2", "op": "maxpool2d", "N": 16, "C": 64, "H": 56, "W": 56, "K": 2},
    {"name": "reduce_rows", "op": "reduce", "kind": "sum", "shape": [4096, 1024], "axes": [1]},
    {"name": "reduce_hw", "op": "reduce", "kind": "mean", "shape": [16, 256, 28, 28], "axes": [2, 3]},
    {"name": "transpose_4096", "op": "transpose", "shape": [4096, 4096], "perm": [1, 0]},
]

COPY = """__kernel void copy(__global const float4* restrict a, __global float4* restrict b) {
    const size_t i = get_global_id(0); b[i] = a[i]; }"""


def time_candidates(op, hw, be, k: int):  # type: ignore[no-untyped-def]
    x = random_inputs(op, seed=0)
    args = [x[t.name] for t in op.inputs]
    ref = roller.reference(op, x)
    out = []
    for p in construct(op, hw, top_k=k):
        runner = be.compile(be.render(p, hw), hw)
        y = runner(args)
        assert np.allclose(y, ref, rtol=1e-3, atol=1e-3), p.line()
        out.append((runner.time(args, repeat=5, warmup=1), p))
    return out


def copy_bandwidth(nbytes: int) -> float:
    import pyopencl as cl

    from roller.backends.opencl.launcher import context

    ctx, queue, _ = context()
    n4 = nbytes // 16
    a = cl.Buffer(ctx, cl.mem_flags.READ_ONLY, n4 * 16)
    b = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, n4 * 16)
    copy = cl.Kernel(cl.Program(ctx, COPY).build(), "copy")
    copy.set_args(a, b)
    times = []
    for i in range(6):
        ev = cl.enqueue_nd_range_kernel(queue, copy, (n4,), None)
        ev.wait()
        if i:
            times.append((ev.profile.end - ev.profile.start) * 1e-9)
    return 2 * n4 * 16 / float(np.median(times)) / 1e9


def memory_table(hw_name: str, top_k: int = 5) -> str:
    """Markdown: GB/s of compulsory traffic of each memory-bound op's best of ``top_k``, next to a plain copy
    kernel measured in the same run."""
    hw = H.load(hw_name)
    be = get("opencl")
    copy_gbs = copy_bandwidth(64 << 20)
    lines = ["### memory-bound ops (GB/s of compulsory traffic)", "",
             "| op | best of top-k GB/s | vs copy kernel |", "|---|---|---|",
             f"| plain float4 copy (64 MiB, same run) | {copy_gbs:.1f} | 1.00 |"]
    for spec in MEMORY_OPS:
        op = load_op(spec)
        best = min(s for s, _ in time_candidates(op, hw, be, top_k))
        gbs = op.bytes / best / 1e9
        lines.append(f"| {op.name} | {gbs:.1f} | {gbs / copy_gbs:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hw", default="pocl-cpu")
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--md", help="write the markdown tables here")
    args = ap.parse_args()
    hw = H.load(args.hw)
    be = get("opencl")
    n = args.n
    lines = [f"hardware description: {args.hw}; device: PoCL via pyopencl", ""]

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ b
    t = time.perf_counter()
    for _ in range(5):
        a @ b
    numpy_gflops = 2 * n**3 / ((time.perf_counter() - t) / 5) / 1e9

    op = load_op({"name": "mm", "op": "matmul", "M": n, "N": n, "K": n})
    t = time.perf_counter()
    timed = time_candidates(op, hw, be, args.top_k)
    build_s = time.perf_counter() - t
    top1 = timed[0][0]
    best_t, best_p = min(timed, key=lambda x: x[0])
    gf = lambda s: 2 * n**3 / s / 1e9  # noqa: E731
    lines += [f"### float32 matmul {n}^3", "",
              "| what | GFLOP/s | vs numpy |", "|---|---|---|",
              f"| numpy (OpenBLAS, same run) | {numpy_gflops:.1f} | 1.00 |",
              f"| roller top-1 (model's choice) `{timed[0][1].line()}` | {gf(top1):.1f} | {gf(top1) / numpy_gflops:.2f} |",
              f"| roller best of top-{len(timed)} `{best_p.line()}` (model rank {[p for _, p in timed].index(best_p) + 1}) "
              f"| {gf(best_t):.1f} | {gf(best_t) / numpy_gflops:.2f} |",
              "", f"Whole build with evaluation (construct, render, compile and time {len(timed)} candidates): "
              f"{build_s:.1f} s.", ""]

    text = "\n".join(lines) + "\n" + memory_table(args.hw, min(args.top_k, 5))
    print(text)
    if args.md:
        Path(args.md).write_text(text)


if __name__ == "__main__":
    main()
