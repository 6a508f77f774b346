"""Shape-generic kernels against kernels built for each exact size, on this machine's OpenCL device.

    .venv/bin/python bench/dynamic.py [--hw pocl-cpu] [--rounds 3] [--repeat 5] [--md FILE] [--json FILE]

For each op with a symbolic size (a BERT-base layer's matmuls over the sequence length, ResNet-18 layers over
the batch), one ``roller.compile`` of the symbolic op (the kernel set, every kept kernel compiled at build) is
compared at every size with ``roller.compile`` of the op written with that size (top-1, its own kernel):
device time of one run, alternating, ``--rounds`` rounds of ``--repeat`` runs, medians. Also: the wall time of
the first call at a size (the generic kernel's dispatch, upload, run and download; the exact kernel's
construction, rendering and OpenCL build, then the same call), and the kernels each compiled. Roller's and
PoCL's caches start empty (private ROLLER_CACHE_DIR and POCL_CACHE_DIR), as for a user's first build.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.layers import _ort_times, ort_session
from bench.models import cpu_name

SEQ = (1, 7, 17, 64, 128, 300, 384, 512)
BATCH = (1, 2, 5, 16, 33, 64)
OPS: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [
    ("bert qkv/out proj [s,768]x[768,768]", {"op": "matmul", "M": "s", "N": 768, "K": 768,
                                             "symbols": {"s": [1, 512]}}, SEQ),
    ("bert ffn up [s,768]x[768,3072]", {"op": "matmul", "M": "s", "N": 3072, "K": 768,
                                        "symbols": {"s": [1, 512]}}, SEQ),
    ("bert ffn down [s,3072]x[3072,768]", {"op": "matmul", "M": "s", "N": 768, "K": 3072,
                                           "symbols": {"s": [1, 512]}}, SEQ),
    # attention's inner operators: the length is an inner or reduced axis (kernels take it as an argument)
    ("bert scores [s,12,64]x[12,64,s]", {"expr": "Y[h,q,k] += Q[q,h,d] * K[h,d,k]",
                                         "shapes": {"Q": ["s", 12, 64], "K": [12, 64, "s"]},
                                         "symbols": {"s": [1, 512]}}, SEQ),
    ("bert softmax [12,s,s]", {"expr": "M[h,q] max= X[h,q,k]; S[h,q] += exp(X[h,q,k] - M[h,q]); "
                                       "Y[h,q,k] = exp(X[h,q,k] - M[h,q]) / S[h,q]",
                               "shapes": {"X": [12, "s", "s"]}, "symbols": {"s": [1, 512]}}, SEQ),
    ("bert context [12,s,s]x[s,12,64]", {"expr": "Y[q,h,d] += P[h,q,k] * V[k,h,d]",
                                         "shapes": {"P": [12, "s", "s"], "V": ["s", 12, 64]},
                                         "symbols": {"s": [1, 512]}}, SEQ),
    ("resnet18 fc [n,512]x[512,1000]", {"op": "matmul", "M": "n", "N": 1000, "K": 512,
                                        "symbols": {"n": [1, 64]}}, BATCH),
    ("resnet18 conv 3x3 256->256 @14", {"op": "conv2d", "N": "n", "C": 256, "H": 14, "W": 14, "F": 256, "KH": 3,
                                        "KW": 3, "padding": "SAME", "symbols": {"n": [1, 64]}}, BATCH),
]


def _with(doc: dict[str, Any], sym: str, v: int) -> dict[str, Any]:
    """``doc`` with the size ``v`` written in place of ``sym`` (in shapes too)."""
    def sub(val: Any) -> Any:
        if isinstance(val, dict):
            return {k: sub(x) for k, x in val.items()}
        if isinstance(val, list):
            return [sub(x) for x in val]
        return v if val == sym else val

    return {k: sub(val) for k, val in doc.items() if k != "symbols"}


def measure(label: str, doc: dict[str, Any], sizes: tuple[int, ...], hw: str, rounds: int,
            repeat: int, evaluate: bool = False) -> dict[str, Any]:
    """With ``evaluate``, the kernel set is chosen by timing on the device (``roller.compile(..., evaluate=True)``)
    and each exact size is also built with its top-10 timed (the ``exact_eval`` columns)."""
    import roller
    from roller.ir.reference import random_inputs

    sym = next(iter(doc["symbols"]))
    t = time.perf_counter()
    gk = roller.compile(doc, hw=hw, evaluate=evaluate, progress=False)
    build_s = time.perf_counter() - t
    rows = []
    for v in sizes:
        expr = gk.op.instantiate({sym: v})
        x = random_inputs(expr, seed=0)
        t = time.perf_counter()
        gk(**x)
        first_generic = time.perf_counter() - t
        t = time.perf_counter()
        ek = roller.compile(_with(doc, sym, v), hw=hw)
        ek(**x)
        first_exact = time.perf_counter() - t
        xk = roller.compile(_with(doc, sym, v), hw=hw, evaluate=True, progress=False) if evaluate else None
        g_times: list[float] = []
        e_times: list[float] = []
        x_times: list[float] = []
        for _ in range(rounds):
            g_times.append(gk.benchmark({sym: v}, repeat=repeat))
            e_times.append(ek.benchmark(repeat=repeat))
            if xk is not None:
                x_times.append(xk.benchmark(repeat=repeat))
        g, e = statistics.median(g_times), statistics.median(e_times)
        rows.append({"size": v, "generic_ms": g * 1e3, "exact_ms": e * 1e3, "ratio": g / e,
                     "generic_kernel": gk.choice(**{sym: v})["line"], "exact_kernel": ek.program.line(),
                     "first_call_generic_ms": first_generic * 1e3, "first_call_exact_ms": first_exact * 1e3})
        if xk is not None:
            te = statistics.median(x_times)
            rows[-1].update(exact_eval_ms=te * 1e3, ratio_eval=g / te, exact_eval_kernel=xk.program.line())
        print(f"  {label} {sym}={v}: generic {g * 1e3:.3f} ms, exact {e * 1e3:.3f} ms ({g / e:.2f}x); first call "
              f"{first_generic * 1e3:.1f} vs {first_exact * 1e3:.0f} ms", file=sys.stderr)
    ratios = [r["ratio"] for r in rows]
    out = {"op": label, "symbol": sym, "mode": gk.mode, "kernels": gk.compiled, "build_s": build_s,
           "exact_kernels": len(sizes), "geomean_ratio": statistics.geometric_mean(ratios), "worst_ratio": max(ratios),
           "rows": rows, "evaluated": evaluate}
    if evaluate:
        out["geomean_ratio_eval"] = statistics.geometric_mean([r["ratio_eval"] for r in rows])
    return out



def measure_model(hw: str, lengths: tuple[int, ...], rounds: int, repeat: int, hidden: int = 768,
                  heads: int = 12, evaluate: bool = False) -> dict[str, Any]:
    """A BERT-base-sized encoder layer (tests/support/zoo_graphs.py's, hidden 768, 12 heads) with an open sequence
    length, one DynamicModel over every length (its kernel sets timed on the device with ``evaluate``),
    against the model built for each exact length (top-1) and onnxruntime on the same dynamic model."""
    import roller
    from tests.support.zoo_graphs import dynamic_attention_block

    proto = dynamic_attention_block(hidden=hidden, heads=heads)
    sess = ort_session(proto)
    t = time.perf_counter()
    m = roller.compile_model(proto, hw=hw, ranges={"seq": (1, max(lengths))}, evaluate=evaluate, progress=False)
    build = time.perf_counter() - t
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    for seq in lengths:
        feeds = {"x": rng.standard_normal((1, seq, hidden)).astype(np.float32),
                 "mask": np.zeros((1, 1, 1, seq), np.float32)}
        t = time.perf_counter()
        m.run(feeds)
        first = time.perf_counter() - t
        compiled = m.generic.per_size_compiled if m.generic is not None else len(m.model_at(seq=seq).by_key)
        err = max(float(v) for v in m.check(feeds)["max_abs_error"].values())
        t = time.perf_counter()
        exact = roller.compile_model(proto, hw=hw, shapes={"x": [1, seq, hidden], "mask": [1, 1, 1, seq]})
        exact.run(feeds)
        exact_first = time.perf_counter() - t
        r_times: list[float] = []
        e_times: list[float] = []
        o_times: list[float] = []
        for _ in range(rounds):
            r_times.append(m.benchmark(feeds, repeat=repeat))
            e_times.append(exact.benchmark(repeat=repeat, inputs=feeds))
            o_times.append(statistics.median(_ort_times(sess, feeds, repeat)))
        r, e, o = (statistics.median(x) for x in (r_times, e_times, o_times))
        rows.append({"seq": seq, "first_call_s": first, "roller_ms": r * 1e3, "exact_ms": e * 1e3,
                     "onnxruntime_ms": o * 1e3, "vs_exact": r / e, "vs_ort": r / o, "compiled_at_first_call":
                     compiled - sum(x["compiled_at_first_call"] for x in rows), "exact_first_call_s": exact_first,
                     "exact_kernels": len(exact.by_key), "max_abs_err": err})
        print(f"  bert layer seq={seq}: first call {first:.2f} s (exact build {exact_first:.1f} s), roller "
              f"{r * 1e3:.2f} ms, exact {e * 1e3:.2f} ms, onnxruntime {o * 1e3:.2f} ms", file=sys.stderr)
    return {"mode": m.mode, "why": m.why, "build_s": build, "evaluated": evaluate,
            "kernels": m.generic.kernels_compiled - m.generic.per_size_compiled if m.generic is not None else 0,
            "rows": rows}


def resnet18(batch_name: str = "n") -> Any:
    """ResNet-18 as torchvision defines it (7x7/2 stem, 3x3/2 max pool, four stages of two basic blocks with
    1x1/2 projections, global average pool, 1000-way Gemm), BatchNormalization kept, random weights, the batch
    left open: tests/support/zoo_graphs.py's builder, so no torch is needed."""
    from onnx import TensorProto, helper

    from tests.support.zoo_graphs import IR_VERSION, OPSET, _Builder

    b = _Builder("resnet18")
    h = b.node("Relu", [b.batchnorm(b.conv("x", 3, 64, 7, bias=False, strides=[2, 2], pads=[3, 3, 3, 3]), 64)])
    h = b.node("MaxPool", [h], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = 64
    for stage, width in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage and not block else 1
            t = b.node("Relu", [b.batchnorm(b.conv(h, c, width, 3, bias=False, strides=[stride, stride],
                                                   pads=[1, 1, 1, 1]), width)])
            t = b.batchnorm(b.conv(t, width, width, 3, bias=False, pads=[1, 1, 1, 1]), width)
            skip = h if stride == 1 and c == width else b.batchnorm(
                b.conv(h, c, width, 1, bias=False, strides=[stride, stride]), width)
            h, c = b.node("Relu", [b.node("Add", [t, skip])]), width
    h = b.node("Flatten", [b.node("GlobalAveragePool", [h])], axis=1)
    b.node("Gemm", [h, b.normal((1000, 512), 0.03), b.uniform((1000,), -0.1, 0.1)], ["logits"], transB=1)
    graph = helper.make_graph(b.nodes, "resnet18",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_name, 3, 224, 224])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch_name, 1000])],
                              initializer=b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def measure_cnn(hw: str, batches: tuple[int, ...], rounds: int, repeat: int) -> dict[str, Any]:
    """ResNet-18 with an open batch: one DynamicModel built once (shape-generic kernels) against a model built
    for each exact batch and against onnxruntime, same process, alternating."""
    import roller

    proto = resnet18()
    sess = ort_session(proto)
    t = time.perf_counter()
    m = roller.compile_model(proto, hw=hw, ranges={"n": (1, max(batches))})
    build = time.perf_counter() - t
    rng = np.random.default_rng(0)
    rows = []
    for n in batches:
        feeds = {"x": rng.standard_normal((n, 3, 224, 224)).astype(np.float32)}
        t = time.perf_counter()
        m.run(feeds)
        first = time.perf_counter() - t
        err = max(float(v) for v in m.check(feeds)["max_abs_error"].values())
        t = time.perf_counter()
        exact = roller.compile_model(proto, hw=hw, shapes={"x": [n, 3, 224, 224]})
        exact.run(feeds)
        exact_first = time.perf_counter() - t
        g_t: list[float] = []
        e_t: list[float] = []
        o_t: list[float] = []
        for _ in range(rounds):
            g_t.append(m.benchmark(feeds, repeat=repeat, warmup=1))
            e_t.append(exact.benchmark(repeat=repeat, warmup=1, inputs=feeds))
            o_t.append(statistics.median(_ort_times(sess, feeds, repeat)))
        g, e, o = (statistics.median(x) for x in (g_t, e_t, o_t))
        rows.append({"batch": n, "generic_ms": g * 1e3, "exact_ms": e * 1e3, "onnxruntime_ms": o * 1e3,
                     "generic_vs_exact": g / e, "generic_vs_ort": g / o, "first_call_s": first,
                     "exact_first_call_s": exact_first, "max_abs_err": err})
        print(f"  resnet18 n={n}: generic {g * 1e3:.1f} ms, exact {e * 1e3:.1f} ms ({g / e:.2f}x), onnxruntime "
              f"{o * 1e3:.1f} ms; first call {first:.2f} s vs {exact_first:.1f} s", file=sys.stderr)
    return {"mode": m.mode, "why": m.why, "build_s": build,
            "kernels": m.generic.kernels_compiled if m.generic is not None else None, "rows": rows}


def cnn_table(res: dict[str, Any]) -> str:
    lines = [f"mode {res['mode']}; one build {res['build_s']:.1f} s, {res['kernels']} kernels compiled", "",
             ("| batch | generic ms | exact-batch ms | generic / exact | onnxruntime ms | generic / ORT | "
              "first call generic s | first call exact s | max abs err |"), "|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['batch']} | {r['generic_ms']:.1f} | {r['exact_ms']:.1f} | {r['generic_vs_exact']:.2f} | "
                     f"{r['onnxruntime_ms']:.1f} | {r['generic_vs_ort']:.2f} | {r['first_call_s']:.2f} | "
                     f"{r['exact_first_call_s']:.1f} | {r['max_abs_err']:.1e} |")
    ratios = [r["generic_vs_exact"] for r in res["rows"]]
    lines.append("")
    lines.append(f"geomean generic / exact {statistics.geometric_mean(ratios):.2f}x")
    return "\n".join(lines)


def model_table(res: dict[str, Any]) -> str:
    lines = [(f"mode {res['mode']} ({res['why']}); one build {res['build_s']:.1f} s, {res['kernels']} kernels "
             "compiled" + ("; kernel sets chosen by timing (evaluate=True)" if res.get("evaluated") else "")), "",
             ("| seq | first call s | kernels compiled at it | Roller ms | exact-length ms | Roller / exact | "
              "onnxruntime ms | Roller / ORT | exact build + first run s | max abs err |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['seq']} | {r['first_call_s']:.2f} | {r['compiled_at_first_call']} | {r['roller_ms']:.2f} | "
                     f"{r['exact_ms']:.2f} | {r['vs_exact']:.2f} | {r['onnxruntime_ms']:.2f} | {r['vs_ort']:.2f} | "
                     f"{r['exact_first_call_s']:.1f} | {r['max_abs_err']:.1e} |")
    ratios = [r["vs_exact"] for r in res["rows"]]
    lines += ["", f"geomean Roller / exact {statistics.geometric_mean(ratios):.2f}x"]
    return "\n".join(lines)


def table(results: list[dict[str, Any]], hw: str) -> str:
    ev = any(res.get("evaluated") for res in results)
    extra = " exact, top-10 timed, ms | generic / that |" if ev else ""
    lines = [f"CPU: {cpu_name()}; hardware description: {hw}; device: PoCL via pyopencl"
             + ("; kernel sets chosen by timing (evaluate=True)" if ev else ""), "",
             ("| op | kernels (generic / exact) | build s | size | generic ms | exact ms | generic / exact |" + extra
              + " first call generic ms | first call exact ms |"), "|---|---|---|---|---|---|---|" +
             ("---|---|" if ev else "") + "---|---|"]
    for res in results:
        for i, r in enumerate(res["rows"]):
            head = (f"| {res['op']} | {res['kernels']} / {res['exact_kernels']} | {res['build_s']:.2f} |" if i == 0
                    else "| | | |")
            more = f" {r['exact_eval_ms']:.3f} | {r['ratio_eval']:.2f} |" if ev else ""
            lines.append(f"{head} {res['symbol']}={r['size']} | {r['generic_ms']:.3f} | {r['exact_ms']:.3f} | "
                         f"{r['ratio']:.2f} |{more} {r['first_call_generic_ms']:.1f} | "
                         f"{r['first_call_exact_ms']:.0f} |")
    lines.append("")
    for res in results:
        lines.append(f"{res['op']}: geomean generic / exact {res['geomean_ratio']:.2f}x, worst "
                     f"{res['worst_ratio']:.2f}x" + (f"; / exact timed {res['geomean_ratio_eval']:.2f}x" if ev else ""))
    allr = [r["ratio"] for res in results for r in res["rows"]]
    if not allr:
        return ""
    lines.append(f"All sizes: geomean {statistics.geometric_mean(allr):.2f}x over {len(allr)} sizes"
                 + (f"; against exact builds with top-10 timed {statistics.geometric_mean([r['ratio_eval'] for res in results for r in res['rows']]):.2f}x"
                    if ev else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hw", default="pocl-cpu")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--only", default="", help="ops whose label contains this ('none': no single ops)")
    p.add_argument("--eval", dest="evaluate", action="store_true",
                   help="kernel sets chosen by timing (evaluate=True); single ops' exact sizes also top-10 timed")
    p.add_argument("--model", action="store_true", help="also a BERT-base-sized layer over sequence lengths")
    p.add_argument("--lengths", default="1,17,128,384,512", help="sequence lengths for --model")
    p.add_argument("--cnn", action="store_true", help="also ResNet-18 over batch sizes")
    p.add_argument("--batches", default="1,2,5,8,16", help="batch sizes for --cnn")
    p.add_argument("--md", type=Path)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    # Both caches empty, as for a user's first build: Roller's, and PoCL's compiled kernels (a kernel source
    # compiled by an earlier run would make an exact-size build look nearly free).
    os.environ["ROLLER_CACHE_DIR"] = tempfile.mkdtemp(prefix="roller-bench-dynamic-")
    os.environ["POCL_CACHE_DIR"] = tempfile.mkdtemp(prefix="roller-bench-dynamic-pocl-")
    results = [measure(label, doc, sizes, args.hw, args.rounds, args.repeat, args.evaluate)
               for label, doc, sizes in OPS if args.only in label] if args.only != "none" else []
    text = table(results, args.hw)
    model_rows: dict[str, Any] = {}
    if args.model:
        model_rows = measure_model(args.hw, tuple(int(v) for v in args.lengths.split(",")), args.rounds,
                                   args.repeat, evaluate=args.evaluate)
        text += "\n\nBERT-base-sized layer (hidden 768, 12 heads), one DynamicModel over the sequence length:\n\n"
        text += model_table(model_rows)
    cnn: dict[str, Any] = {}
    if args.cnn:
        cnn = measure_cnn(args.hw, tuple(int(v) for v in args.batches.split(",")), args.rounds, args.repeat)
        text += "\n\nResNet-18 (BatchNormalization kept, random weights), one DynamicModel over the batch:\n\n"
        text += cnn_table(cnn)
    print(text)
    if args.md:
        args.md.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_name(), "hw": args.hw, "results": results,
                                         "model": model_rows, "cnn": cnn}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
