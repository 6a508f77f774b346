"""float16 models (issue 40): the bench zoo's models with every float32 weight, constant, input and output made
float16 (what ``onnxconverter_common.float16.convert_float_to_float16`` does for op types that all take float16),
Roller against onnxruntime's run of the same file and against the float32 model (both runtimes), in one process,
alternating.

    python bench/float16_models.py --zoo DIR [--models resnet18 mobilenet_v2 bert_base_layer] [--json FILE]

Roller holds float16 tensors as their bits and computes in float32 (every kernel: docs/opjson.md); onnxruntime's
CPU provider has float16 kernels for few op types and casts around the others. Rows give each latency, the
ratios Roller float16 / onnxruntime float16 and Roller float16 / Roller float32, and the largest difference from
onnxruntime's float16 outputs relative to the largest output.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.zoo_runs import alternating_ms, zoo_main

MODELS = ("resnet18", "mobilenet_v2", "bert_base_layer")


def as_float16(path: Path) -> bytes:
    """The model at ``path`` with its float32 initializers, Constant values, inputs and outputs float16 (shape
    inference's value_info dropped: it would say float32)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, numpy_helper

    model = onnx.load(path)
    g = model.graph

    def half(t: onnx.TensorProto) -> onnx.TensorProto:
        return numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name) \
            if t.data_type == TensorProto.FLOAT else t

    inits = [half(t) for t in g.initializer]
    del g.initializer[:]
    g.initializer.extend(inits)
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Constant" and a.name == "value":
                a.t.CopyFrom(half(a.t))
    for v in [*g.input, *g.output]:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
    del g.value_info[:]
    return model.SerializeToString()


def measure(name: str, zoo: Path, rounds: int) -> dict[str, Any]:
    import numpy as np

    import roller
    from bench.models import ort_session

    plain = zoo / f"{name}.onnx"
    data = as_float16(plain)
    t = time.perf_counter()
    m16 = roller.compile_model(data, hw="pocl-cpu", progress=False)
    compile_s = time.perf_counter() - t
    m32 = roller.compile_model(plain, hw="pocl-cpu", progress=False)
    s16, s32 = ort_session(data), ort_session(plain)
    feeds16 = m16.random_inputs(0)
    feeds32 = {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in feeds16.items()}
    got = next(iter(m16.run(feeds16).values())).astype(np.float32)
    want = s16.run(None, feeds16)[0].astype(np.float32)
    jobs = {"roller_float16": lambda: m16.run(feeds16), "onnxruntime_float16": lambda: s16.run(None, feeds16),
            "roller_float32": lambda: m32.run(feeds32), "onnxruntime_float32": lambda: s32.run(None, feeds32)}
    ms = alternating_ms(jobs, rounds)
    return {"model": name, "kernels": len(m16.by_key), "launches": len(m16.kernels),
            "compile_s": round(compile_s, 1), **{f"{k}_ms": round(v, 2) for k, v in ms.items()},
            "float16: roller / onnxruntime": round(ms["roller_float16"] / ms["onnxruntime_float16"], 2),
            "roller: float16 / float32": round(ms["roller_float16"] / ms["roller_float32"], 2),
            "largest difference / largest output": f"{float(np.abs(got - want).max() / np.abs(want).max()):.1e}"}


def main(argv: list[str] | None = None) -> int:
    return zoo_main(argv, "float16_models.py", __doc__ or "", MODELS, measure,
                    "float16 weights, constants, inputs and outputs; Roller computes in float32, reading and "
                    "writing float16 bits (vectors of them converted with integer operations)")


if __name__ == "__main__":
    sys.exit(main())
