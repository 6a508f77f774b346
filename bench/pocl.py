"""Speed of generated OpenCL kernels on the local PoCL device, against references measured in the same run.

* float32 1024^3 matmul: GFLOP/s of the model's top-1 and of the best of the top-10, next to numpy (OpenBLAS),
  and the wall time of the whole build (construction, rendering, compiling and timing all ten);
* memory-bound ops (relu, pooling, reductions): GB/s of compulsory traffic, next to a plain copy kernel.

Run: ``python bench/pocl.py [--hw pocl-cpu] [--md FILE]``. These machines are noisy: compare ratios, not
absolute numbers, and only within one run.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import roller  # noqa: E402
import roller.hw as H  # noqa: E402
from roller.backends import get  # noqa: E402
from roller.construction import construct  # noqa: E402
from roller.ir import load_op  # noqa: E402
from roller.ir.reference import random_inputs  # noqa: E402

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


def memory_table(hw_name: str, top_k: int = 5, rounds: int = 3) -> str:
    """Markdown: GB/s of compulsory traffic of each memory-bound op's best of ``top_k``, next to a plain copy
    kernel timed in the same rounds (alternating with the op: copy, op, copy, op, ...; ratios per round,
    median)."""
    import statistics

    hw = H.load(hw_name)
    be = get("opencl")
    lines = ["### memory-bound ops (GB/s of compulsory traffic)", "",
             "| op | best of top-k GB/s | copy GB/s (same rounds) | vs copy kernel |", "|---|---|---|---|"]
    for spec in MEMORY_OPS:
        op = load_op(spec)
        timed = time_candidates(op, hw, be, top_k)
        _, best = min(timed, key=lambda x: x[0])
        runner = be.compile(be.render(best, hw), hw)
        x = random_inputs(op, seed=0)
        args = [x[t.name] for t in op.inputs]
        ops, copies = [], []
        for _ in range(rounds):
            copies.append(copy_bandwidth(64 << 20))
            ops.append(op.bytes / runner.time(args, repeat=5, warmup=1) / 1e9)
        gbs, copy_gbs = statistics.median(ops), statistics.median(copies)
        ratio = statistics.median(o / c for o, c in zip(ops, copies))
        lines.append(f"| {op.name} `{_cell(best.line())}` | {gbs:.1f} | {copy_gbs:.1f} | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """A program's line inside a markdown table cell (its ' | ' separators would split the cell)."""
    return text.replace(" | ", "; ")


def matmul_table(hw_name: str, n: int, top_k: int, rounds: int = 5) -> str:
    """Markdown: float32 n^3 matmul, Roller against numpy in the same process, alternating. Three ways: the op
    as a user writes it (both operands inputs: the top-1 and the best of the top-k, B read as given); B a
    constant, as a model's weights are (a one-node ONNX model through ``roller.compile_model``: construction
    stores B in the layout it picks, once, at build time); and that again with the packing charged (Roller's
    kernel that lays a B of this size out so, timed in the same rounds and added)."""
    import statistics

    from bench.layers import MatMul

    hw = H.load(hw_name)
    be = get("opencl")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    op = load_op({"name": "mm", "op": "matmul", "M": n, "N": n, "K": n})
    t = time.perf_counter()
    timed = time_candidates(op, hw, be, top_k)
    build_s = time.perf_counter() - t
    top1_p, best_p = timed[0][1], min(timed, key=lambda x: x[0])[1]
    runners = {p.line(): be.compile(be.render(p, hw), hw) for p in (top1_p, best_p)}
    model_proto, feeds = MatMul("bench", (), n, n, n).onnx(rng)
    model = roller.compile_model(model_proto, hw=hw_name)
    feeds = {"x": a}
    [kernel] = model.kernels
    block = kernel.program.expr.tensor("B").shape[-1] if kernel.program.expr.tensor("B").shape != (n, n) else 0
    pack = None
    if block:
        pack_op = load_op({"name": "pack_b", "expr": f"Y[nb,k,nl] = B[k,{block}*nb+nl]",
                           "shapes": {"B": [n, n], "Y": [n // block, n, block]}})
        pack = be.compile(be.render(construct(pack_op, hw, top_k=1)[0], hw), hw)
    times: dict[str, list[float]] = {"numpy": [], "top1": [], "best": [], "model": [], "pack": []}
    model.executor.run(feeds)
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(5):
            a @ b
        times["numpy"].append((time.perf_counter() - t) / 5)
        times["top1"].append(runners[top1_p.line()].time([a, b], repeat=5, warmup=1))
        times["best"].append(runners[best_p.line()].time([a, b], repeat=5, warmup=1))
        times["model"].append(statistics.median(model.executor.time_steps(5, 1)))
        if pack is not None:
            times["pack"].append(pack.time([b], repeat=5, warmup=1))
    med = {k: statistics.median(v) for k, v in times.items() if v}
    gf = lambda s: 2 * n**3 / s / 1e9  # noqa: E731
    np_gf = gf(med["numpy"])
    rows = [("numpy (OpenBLAS, same rounds)", med["numpy"]),
            (f"roller top-1, B as given `{_cell(top1_p.line())}`", med["top1"]),
            (f"roller best of top-{len(timed)}, B as given `{_cell(best_p.line())}` (model rank "
             f"{[p for _, p in timed].index(best_p) + 1})", med["best"]),
            (f"roller, B a constant (stored `{kernel.program.expr.tensor('B').shape}` at build) "
             f"`{_cell(kernel.program.line())}`", med["model"])]
    if "pack" in med:
        rows.append((f"roller, B a constant, its packing charged (+{med['pack'] * 1e3:.2f} ms a run)",
                     med["model"] + med["pack"]))
    lines = [f"### float32 matmul {n}^3", "", "| what | GFLOP/s | vs numpy |", "|---|---|---|"]
    lines += [f"| {what} | {gf(s):.1f} | {gf(s) / np_gf:.2f} |" for what, s in rows]
    lines += ["", f"{rounds} rounds, alternating, medians. Whole build with evaluation of the op as given (construct, "
              f"render, compile and time {len(timed)} candidates): {build_s:.1f} s.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hw", default="pocl-cpu")
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--md", help="write the markdown tables here")
    ap.add_argument("--no-matmul", action="store_true")
    args = ap.parse_args()
    from bench.models import cpu_name

    lines = [f"CPU: {cpu_name()}; hardware description: {args.hw}; device: PoCL via pyopencl", ""]
    if not args.no_matmul:
        lines.append(matmul_table(args.hw, args.n, args.top_k))
    text = "\n".join(lines) + "\n" + memory_table(args.hw, min(args.top_k, 5))
    print(text)
    if args.md:
        Path(args.md).write_text(text)


if __name__ == "__main__":
    main()
