"""What an ONNX model holds, whether it is valid, and how fast onnxruntime runs it: onnx, numpy and onnxruntime
only, so that the files already written can be described and checked without torch."""
from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx

if TYPE_CHECKING:
    import onnxruntime


@dataclass(frozen=True)
class Summary:
    nodes: int
    op_counts: dict[str, int]           # most frequent first
    params: int                         # elements of the initializers
    inputs: list[tuple[str, list[int]]]
    outputs: list[tuple[str, list[int]]]

    def ops_line(self) -> str:
        return ", ".join(f"{op} {n}" for op, n in self.op_counts.items())


def _dims(vi: onnx.ValueInfoProto) -> list[int]:
    return [d.dim_value for d in vi.type.tensor_type.shape.dim]


def summarize(model: onnx.ModelProto) -> Summary:
    g = model.graph
    counts = Counter(n.op_type for n in g.node)
    return Summary(
        nodes=len(g.node),
        op_counts=dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        params=sum(int(np.prod(t.dims)) for t in g.initializer),
        inputs=[(i.name, _dims(i)) for i in g.input],
        outputs=[(o.name, _dims(o)) for o in g.output])


def _session(model: onnx.ModelProto, threads: int) -> onnxruntime.InferenceSession:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def verify(model: onnx.ModelProto, inputs: dict[str, np.ndarray], threads: int = 2) -> list[np.ndarray]:
    """Raise unless the model passes the full checker and strict shape inference with a static shape for every
    output, and one onnxruntime run on ``inputs`` gives finite outputs of those shapes; return the outputs."""
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    shapes = {o.name: _dims(o) for o in inferred.graph.output}
    for name, dims in shapes.items():
        if not dims or any(d <= 0 for d in dims):
            raise ValueError(f"output {name}: shape inference left it without a static shape ({dims})")
    outs = _session(model, threads).run(None, inputs)
    for (name, dims), y in zip(shapes.items(), outs):
        if list(y.shape) != dims:
            raise ValueError(f"output {name}: onnxruntime gave shape {list(y.shape)}, inference said {dims}")
        if not np.all(np.isfinite(y)):
            raise ValueError(f"output {name}: onnxruntime gave non-finite values")
    return outs


def ort_latency_ms(model: onnx.ModelProto, inputs: dict[str, np.ndarray], threads: int = 2, repeat: int = 10,
                   warmup: int = 3) -> float:
    """Median wall time of one onnxruntime run (CPU, ``threads`` intra-op threads, all graph optimisations)."""
    sess = _session(model, threads)
    for _ in range(warmup):
        sess.run(None, inputs)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        sess.run(None, inputs)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3
