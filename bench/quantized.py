"""int8 models (issue 40): onnxruntime's static QDQ quantization of the bench zoo's CNNs, Roller against
onnxruntime's own int8 run and against the float32 model (both runtimes), in one process, alternating.

    python bench/quantized.py --zoo DIR [--models resnet18 mobilenet_v2] [--json FILE]

Each model is quantized here (``onnxruntime.quantization.quantize_static``: QDQ, int8 weights per channel,
uint8 activations, calibrated on 8 random batches: the numbers measure speed and agreement, not accuracy). Rows
give each latency, the ratios Roller int8 / onnxruntime int8 and Roller int8 / Roller float32, and how far the
int8 outputs are from onnxruntime's (in steps of the output's quantization: 0 is bit for bit).
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.zoo_runs import alternating_ms, zoo_main

MODELS = ("resnet18", "mobilenet_v2")


def quantize(path: Path, out: Path) -> None:
    import numpy as np
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_static

    model = onnx.load(path)
    inp = model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)

    class Batches(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.it = iter([{inp.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(8)])

        def get_next(self) -> dict[str, Any] | None:
            return next(self.it, None)

    quantize_static(str(path), str(out), Batches(), activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, per_channel=True)


def measure(name: str, zoo: Path, rounds: int) -> dict[str, Any]:
    import numpy as np
    import onnx

    import roller
    from bench.models import ort_session

    plain = zoo / f"{name}.onnx"
    with tempfile.TemporaryDirectory(prefix="roller-int8-") as tmp:
        q = Path(tmp) / f"{name}-int8.onnx"
        quantize(plain, q)
        t = time.perf_counter()
        m8 = roller.compile_model(q, hw="pocl-cpu", progress=False)
        compile_s = time.perf_counter() - t
        m32 = roller.compile_model(plain, hw="pocl-cpu", progress=False)
        s8, s32 = ort_session(q), ort_session(plain)
        proto = onnx.load(q)
    feeds = m8.random_inputs(0)
    feeds_np = {k: np.asarray(v) for k, v in feeds.items()}
    got, want = next(iter(m8.run(feeds).values())), s8.run(None, feeds_np)[0]
    last = next(n for n in reversed(proto.graph.node) if n.op_type == "DequantizeLinear")
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    step = float(consts[last.input[1]].reshape(-1)[0])
    steps = np.abs(got - want) / step
    jobs = {"roller_int8": lambda: m8.run(feeds), "onnxruntime_int8": lambda: s8.run(None, feeds_np),
            "roller_float32": lambda: m32.run(feeds), "onnxruntime_float32": lambda: s32.run(None, feeds_np)}
    ms = alternating_ms(jobs, rounds)
    return {"model": name, "kernels": len(m8.by_key), "launches": len(m8.kernels), "compile_s": round(compile_s, 1),
            **{f"{k}_ms": round(v, 2) for k, v in ms.items()},
            "int8: roller / onnxruntime": round(ms["roller_int8"] / ms["onnxruntime_int8"], 2),
            "roller: int8 / float32": round(ms["roller_int8"] / ms["roller_float32"], 2),
            "outputs equal to onnxruntime's": f"{float((steps == 0).mean()):.1%}",
            "largest difference (output steps)": round(float(steps.max()), 2)}


def main(argv: list[str] | None = None) -> int:
    return zoo_main(argv, "quantized.py", __doc__ or "", MODELS, measure,
                    "QDQ int8 (per-channel weights, uint8 activations) as onnxruntime.quantization writes it; "
                    "Roller's integer sums run as float32 kernels (exact below 2**24)")


if __name__ == "__main__":
    sys.exit(main())
