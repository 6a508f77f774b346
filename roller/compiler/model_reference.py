"""What a model's check compares with: onnxruntime on the original ONNX model (every graph optimisation, the run
users get), and, for a quantized model, onnxruntime's run without graph optimisations too.

A quantized model has no single correct output: each QuantizeLinear rounds to a grid, and two correct
implementations whose float32 sums differ in the last bit (another summation order, a fused requantization)
round a value near a half step differently; the flip then propagates through every later layer. onnxruntime's
optimised run (QDQ groups fused into integer kernels) and its unoptimised one (each node on its own) are two
such implementations, and how far apart they are measures the freedom the quantization leaves: a QDQ ResNet-50's
logits differ between them by up to 58 (mean 9.3) on values up to 3830. ``compare_outputs`` allows a quantized
model's outputs twice that spread from the reference, where a float model gets float32 rounding only."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: ONNX (and com.microsoft) operators that round values to an integer grid, besides the QLinear* family
QUANTIZING_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QGemm",
                            "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QAttention", "DynamicQuantizeLSTM"})


@dataclass(frozen=True)
class ModelReference:
    outputs: dict[str, np.ndarray]
    by: str                                   # what computed them, for messages
    spread: dict[str, np.ndarray] | None = None   # a second correct run's outputs (quantized models)
    spread_by: str = ""


def quantized(model: Any) -> bool:
    """Whether the ONNX model ``model`` quantizes any value (its main graph's operators)."""
    return any(n.op_type.startswith("QLinear") or n.op_type in QUANTIZING_OPS for n in model.graph.node)


class NoOnnxruntimeRun(Exception):
    """onnxruntime cannot run the model (no CPU kernel for a type, say bfloat16 convolutions): the message says
    why, in one line."""


def onnxruntime_outputs(model: Any, feeds: Mapping[str, Any], *, optimize: bool = True
                        ) -> tuple[dict[str, np.ndarray], str] | None:
    """(outputs by name, "onnxruntime VERSION") of the ONNX model ``model`` on ``feeds`` with the CPU provider,
    with every graph optimisation or (``optimize=False``) none; None without onnxruntime; NoOnnxruntimeRun when
    onnxruntime refuses the model or fails to run it."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    options.log_severity_level = 3   # its warnings (unused initializers...) are not the user's concern
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        outputs = sess.run(None, dict(feeds))
    except Exception as e:   # its errors (NotImplemented, Fail, ...) derive from Exception alone
        if not type(e).__module__.startswith("onnxruntime"):
            raise
        raise NoOnnxruntimeRun(f"onnxruntime {ort.__version__} cannot run this model: "
                               f"{' '.join(str(e).split())[:200]}") from None
    return {n: np.asarray(v) for n, v in zip(names, outputs)}, f"onnxruntime {ort.__version__}"


def onnxruntime_reference(model: Any, feeds: Mapping[str, Any]) -> ModelReference | str:
    """onnxruntime's outputs for ``feeds``, with its unoptimised run as the spread of a quantized model; else why
    there are none ("" without onnxruntime, which is no news to the user)."""
    try:
        got = onnxruntime_outputs(model, feeds)
        if got is None:
            return ""
        outputs, by = got
        if not quantized(model):
            return ModelReference(outputs, by)
        second = onnxruntime_outputs(model, feeds, optimize=False)
    except NoOnnxruntimeRun as e:
        return str(e)
    assert second is not None
    return ModelReference(outputs, by, second[0], f"{by} without graph optimisations")


def graph_reference(graph: Any, feeds: Mapping[str, Any], why: str) -> ModelReference:
    """The graph evaluated operator by operator with roller.reference, where onnxruntime gave nothing (``why``:
    what ``onnxruntime_reference`` said)."""
    from roller.graph.reference import evaluate

    by = "roller.reference, operator by operator" + (f" ({why})" if why else "")
    return ModelReference(evaluate(graph, dict(feeds)), by)
