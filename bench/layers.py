"""Every distinct convolution and matmul layer of ResNet-18, MobileNetV2 and a BERT-base layer, on this
machine's OpenCL device, against onnxruntime in the same process.

    .venv/bin/python bench/layers.py [--hw pocl-cpu] [--only SUBSTRING] [--rounds 5] [--md FILE] [--json FILE]

Each layer is a one-node ONNX model with its weights as initializers (no bias: folding the bias into the
kernel is the fusion issue's; onnxruntime's convolution runs the same MLAS kernel either way). Roller compiles
it twice with empty caches, as ``roller.compile_model`` does for a user: top-1 (the model's choice alone) and
best of top-10 (all ten timed on the device, the fastest kept); both build times are wall time of the whole
compile. Latency is the device work of one run with inputs already uploaded (Roller's executor) and the run
call of onnxruntime (graph optimisations on, 2 intra-op threads), alternating, ``--rounds`` rounds of
``--repeat`` runs each, medians. Memory-bound ops are timed against a plain float4 copy kernel
(``bench/pocl.py``). Compare ratios, not absolute numbers: these machines are noisy.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.models import cpu_name  # noqa: E402


@dataclass(frozen=True)
class Conv:
    """A square convolution with 'same'-style padding (kernel // 2), as the three models use."""
    model: str
    c: int
    f: int
    h: int
    k: int
    stride: int = 1
    group: int = 1

    @property
    def name(self) -> str:
        kind = "dw" if self.group > 1 else "conv"
        return f"{kind} {self.k}x{self.k}/{self.stride} {self.c}->{self.f} @{self.h}"

    @property
    def out_hw(self) -> int:
        return (self.h + 2 * (self.k // 2) - self.k) // self.stride + 1

    @property
    def flops(self) -> int:
        return 2 * self.f * (self.c // self.group) * self.k * self.k * self.out_hw ** 2

    def onnx(self, rng: np.random.Generator) -> tuple[Any, dict[str, np.ndarray]]:
        from onnx import helper, numpy_helper

        w = rng.standard_normal((self.f, self.c // self.group, self.k, self.k)).astype(np.float32)
        p = self.k // 2
        node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[self.k, self.k], pads=[p] * 4,
                                strides=[self.stride] * 2, group=self.group)
        o = self.out_hw
        return _model(node, {"x": [1, self.c, self.h, self.h]}, [1, self.f, o, o], {"w": w}, rng)


@dataclass(frozen=True)
class MatMul:
    """``x[batch.., m, k] @ w[batch.., k, n]``; ``w`` an initializer (a weight) unless ``activation``."""
    model: str
    batch: tuple[int, ...]
    m: int
    k: int
    n: int
    activation: bool = False
    trans_b: bool = False  # a Gemm with transB=1, as classifier heads export

    @property
    def name(self) -> str:
        b = "x".join(map(str, self.batch))
        return f"{'gemm' if self.trans_b else 'matmul'} {b + 'x' if b else ''}{self.m}x{self.k}x{self.n}"

    @property
    def flops(self) -> int:
        return 2 * math.prod(self.batch) * self.m * self.k * self.n

    def onnx(self, rng: np.random.Generator) -> tuple[Any, dict[str, np.ndarray]]:
        from onnx import helper

        a = [*self.batch, self.m, self.k]
        b = [*self.batch, self.k, self.n]
        if self.trans_b:
            node = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)
            w = rng.standard_normal((self.n, self.k)).astype(np.float32)
            return _model(node, {"x": a}, [self.m, self.n], {"w": w}, rng)
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
        out = [*self.batch, self.m, self.n]
        if self.activation:
            return _model(node, {"x": a, "w": b}, out, {}, rng)
        return _model(node, {"x": a}, out, {"w": rng.standard_normal(b).astype(np.float32)}, rng)


def _model(node: Any, inputs: dict[str, list[int]], out: list[int], weights: dict[str, np.ndarray],
           rng: np.random.Generator) -> tuple[Any, dict[str, np.ndarray]]:
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [node], "layer", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in inputs.items()}
    return model, feeds


R, M, B = "resnet18", "mobilenet_v2", "bert_base_layer"
# Every distinct Conv, Gemm and MatMul of the three zoo models (bench/zoo), as onnx shape inference lists them.
LAYERS: tuple[Conv | MatMul, ...] = (
    Conv(R, 3, 64, 224, 7, 2), Conv(R, 64, 64, 56, 3), Conv(R, 64, 128, 56, 1, 2), Conv(R, 64, 128, 56, 3, 2),
    Conv(R, 128, 128, 28, 3), Conv(R, 128, 256, 28, 1, 2), Conv(R, 128, 256, 28, 3, 2), Conv(R, 256, 256, 14, 3),
    Conv(R, 256, 512, 14, 1, 2), Conv(R, 256, 512, 14, 3, 2), Conv(R, 512, 512, 7, 3),
    MatMul(R, (), 1, 512, 1000, trans_b=True),
    Conv(M, 3, 32, 224, 3, 2), Conv(M, 32, 32, 112, 3, 1, 32), Conv(M, 32, 16, 112, 1), Conv(M, 16, 96, 112, 1),
    Conv(M, 96, 96, 112, 3, 2, 96), Conv(M, 96, 24, 56, 1), Conv(M, 24, 144, 56, 1),
    Conv(M, 144, 144, 56, 3, 1, 144), Conv(M, 144, 24, 56, 1), Conv(M, 144, 144, 56, 3, 2, 144),
    Conv(M, 144, 32, 28, 1), Conv(M, 32, 192, 28, 1), Conv(M, 192, 192, 28, 3, 1, 192), Conv(M, 192, 32, 28, 1),
    Conv(M, 192, 192, 28, 3, 2, 192), Conv(M, 192, 64, 14, 1), Conv(M, 64, 384, 14, 1),
    Conv(M, 384, 384, 14, 3, 1, 384), Conv(M, 384, 64, 14, 1), Conv(M, 384, 96, 14, 1), Conv(M, 96, 576, 14, 1),
    Conv(M, 576, 576, 14, 3, 1, 576), Conv(M, 576, 96, 14, 1), Conv(M, 576, 576, 14, 3, 2, 576),
    Conv(M, 576, 160, 7, 1), Conv(M, 160, 960, 7, 1), Conv(M, 960, 960, 7, 3, 1, 960), Conv(M, 960, 160, 7, 1),
    Conv(M, 960, 320, 7, 1), Conv(M, 320, 1280, 7, 1), MatMul(M, (), 1, 1280, 1000, trans_b=True),
    MatMul(B, (1,), 128, 768, 768), MatMul(B, (1, 12), 128, 64, 128, activation=True),
    MatMul(B, (1, 12), 128, 128, 64, activation=True), MatMul(B, (1,), 128, 768, 3072),
    MatMul(B, (1,), 128, 3072, 768),
)


def ort_session(model: Any) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _ort_times(sess: Any, feeds: dict[str, np.ndarray], repeat: int) -> list[float]:
    sess.run(None, feeds)
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        sess.run(None, feeds)
        out.append(time.perf_counter() - t)
    return out


def measure(layer: Conv | MatMul, hw: str, rounds: int, repeat: int) -> dict[str, Any]:
    import roller

    model, feeds = layer.onnx(np.random.default_rng(0))
    data = model.SerializeToString()
    sess = ort_session(model)
    expected = sess.run(None, feeds)[0]
    row: dict[str, Any] = {"model": layer.model, "layer": layer.name, "gflop": layer.flops / 1e9}
    compiled = {}
    for tag, kw in (("top1", {"top_k": 1}), ("best10", {"top_k": 10, "evaluate": True})):
        t = time.perf_counter()
        m = roller.compile_model(data, hw=hw, cache=False, **kw)
        _ = m.executor
        row[f"{tag}_build_s"] = time.perf_counter() - t
        got = m.run(feeds)["y"]
        scale = float(np.abs(expected).max()) or 1.0
        row[f"{tag}_max_err"] = float(np.abs(got - expected).max()) / scale
        row[f"{tag}_kernels"] = len(m.kernels)
        row[f"{tag}_program"] = " / ".join(k.program.line() for k in m.kernels)
        compiled[tag] = m
    samples: dict[str, list[float]] = {"ort": [], "top1": [], "best10": []}
    for _ in range(rounds):
        samples["ort"] += _ort_times(sess, feeds, repeat)
        for tag, m in compiled.items():
            samples[tag] += m.executor.time(feeds, repeat=repeat, warmup=1)
    for tag, ts in samples.items():
        row[f"{tag}_ms"] = statistics.median(ts) * 1e3
        row[f"{tag}_gflops"] = layer.flops / statistics.median(ts) / 1e9
    row["top1_ratio"] = row["ort_ms"] / row["top1_ms"]
    row["best10_ratio"] = row["ort_ms"] / row["best10_ms"]
    return row


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def table(rows: list[dict[str, Any]], hw: str) -> str:
    lines = [f"CPU: {cpu_name()}; hardware description: {hw}; device: PoCL via pyopencl; onnxruntime 2 threads",
             "", "| model | layer | GFLOP | ORT GFLOP/s | top-1 GFLOP/s | top-1 vs ORT | best of 10 GFLOP/s "
             "| best vs ORT | build top-1 / top-10 s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['layer']} | {r['gflop']:.3f} | {r['ort_gflops']:.1f} "
                     f"| {r['top1_gflops']:.1f} | {r['top1_ratio']:.2f} | {r['best10_gflops']:.1f} "
                     f"| {r['best10_ratio']:.2f} | {r['top1_build_s']:.1f} / {r['best10_build_s']:.1f} |")
    top1 = [r["top1_ratio"] for r in rows]
    best = [r["best10_ratio"] for r in rows]
    lines += ["", f"Over {len(rows)} layers: best of top-10 geomean {geomean(best):.2f}x onnxruntime "
              f"(lowest {min(best):.2f}x, {rows[best.index(min(best))]['layer']}); top-1 geomean "
              f"{geomean(top1):.2f}x (lowest {min(top1):.2f}x)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hw", default="pocl-cpu")
    ap.add_argument("--only", help="layers whose model or name contains this")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--md", help="write the markdown table here")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory-bound ops")
    args = ap.parse_args()
    chosen = [ly for ly in LAYERS if not args.only or args.only in ly.name or args.only in ly.model]
    rows = []
    for layer in chosen:
        row = measure(layer, args.hw, args.rounds, args.repeat)
        print(f"{row['model']:16} {row['layer']:30} ort {row['ort_gflops']:6.1f} top1 {row['top1_gflops']:6.1f} "
              f"({row['top1_ratio']:.2f}) best {row['best10_gflops']:6.1f} ({row['best10_ratio']:.2f})",
              file=sys.stderr, flush=True)
        rows.append(row)
    text = table(rows, args.hw)
    if not args.no_memory:
        from bench.pocl import memory_table

        text += "\n" + memory_table(args.hw)
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
