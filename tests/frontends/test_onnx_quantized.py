"""Quantized models as onnxruntime's quantizer writes them (issue 40): static QDQ (uint8 and int8 activations,
per-tensor and per-channel weights), the QOperator format (QLinearConv, QLinearMatMul and onnxruntime's
com.microsoft QLinearAdd/QLinearGlobalAveragePool/QGemm, a MaxPool of uint8 values), and dynamic quantization (DynamicQuantizeLinear,
ConvInteger, MatMulInteger). Roller's integer sums are exact, so each model equals its own operator-by-operator
reference bit for bit (a dynamically quantized one to float32 rounding: its scales are computed), and
onnxruntime's run to within one step of the output's quantization (exactly, on the
machines tried: onnxruntime's uint8 x int8 products can saturate in 16 bits on AVX2, Roller's cannot)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import roller
from roller.backends import get
from roller.compiler.model_reference import ModelReference, onnxruntime_reference, quantized
from roller.errors import InputError
from roller.frontends.onnx import import_model
from roller.frontends.onnx.qdq import expand_contrib, qdq_to_qlinear
from roller.graph.reference import evaluate

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")
needs_cl = pytest.mark.skipif(not get("opencl").can_run_here(), reason=get("opencl").why_not_here())

SHAPE = [1, 3, 16, 16]


def float_cnn(gemm: bool = False) -> onnx.ModelProto:
    """Convolution + residual Add + depthwise convolution + pooling + MatMul: the op mix of a small CNN. With
    ``gemm``, a max pooling after the first convolution and a Gemm (transB, as torch exports a Linear) for the
    MatMul and its Add: in the QOperator format a uint8 MaxPool and onnxruntime's QGemm."""
    rng = np.random.default_rng(0)

    def init(name: str, shape: list[int], scale: float) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1" if not gemm else "r0"]),
        *([helper.make_node("MaxPool", ["r0"], ["r1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])] if gemm else []),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["a"]),
        helper.make_node("Relu", ["a"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], group=8, pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c3"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        *([helper.make_node("Gemm", ["f", "wt", "bm"], ["y"], transB=1)] if gemm else
          [helper.make_node("MatMul", ["f", "wm"], ["m"]), helper.make_node("Add", ["m", "bm"], ["y"])]),
    ]
    inits = [init("w1", [8, 3, 3, 3], 0.3), init("b1", [8], 0.1), init("w2", [8, 8, 3, 3], 0.2),
             init("b2", [8], 0.1), init("w3", [8, 1, 3, 3], 0.3), init("b3", [8], 0.1), init("wm", [8, 10], 0.3),
             init("bm", [10], 0.1)]
    if gemm:
        inits[-2] = numpy_helper.from_array(numpy_helper.to_array(inits[-2]).T.copy(), "wt")
    g = helper.make_graph(nodes, "qcnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


class _Calibration(quantization.CalibrationDataReader):  # type: ignore[misc]
    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        self.batches = iter([{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(8)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


QT = quantization.QuantType
VARIANTS = {
    "qdq-uint8": dict(activation_type=QT.QUInt8, weight_type=QT.QInt8),
    "qdq-int8-per-channel": dict(activation_type=QT.QInt8, weight_type=QT.QInt8, per_channel=True),
    "qoperator-uint8": dict(quant_format=quantization.QuantFormat.QOperator, activation_type=QT.QUInt8,
                            weight_type=QT.QInt8),
    # the float model with a MaxPool and a Gemm (float_cnn(gemm=True))
    "qoperator-gemm": dict(quant_format=quantization.QuantFormat.QOperator, activation_type=QT.QUInt8,
                           weight_type=QT.QInt8, per_channel=True),
    "qoperator-gemm-per-tensor": dict(quant_format=quantization.QuantFormat.QOperator, activation_type=QT.QUInt8,
                                      weight_type=QT.QInt8),
    "qdq-gemm": dict(activation_type=QT.QUInt8, weight_type=QT.QInt8, per_channel=True),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("quantized")
    plain, gemm = folder / "float.onnx", folder / "gemm.onnx"
    onnx.save(float_cnn(), plain)
    onnx.save(float_cnn(gemm=True), gemm)
    out = {}
    for name, options in VARIANTS.items():
        out[name] = folder / f"{name}.onnx"
        quantization.quantize_static(str(gemm if "gemm" in name else plain), str(out[name]), _Calibration(),
                                     **options)
    for name, weight in (("dynamic-int8", QT.QInt8), ("dynamic-uint8", QT.QUInt8)):
        out[name] = folder / f"{name}.onnx"
        quantization.quantize_dynamic(str(plain), str(out[name]), weight_type=weight)
    return out


def _last_scale(model: onnx.ModelProto) -> float:
    """The scale of the DequantizeLinear that makes the float output (one step of the output's grid)."""
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    last = next(n for n in reversed(model.graph.node) if n.op_type == "DequantizeLinear")
    return float(consts[last.input[1]].reshape(-1)[0])


@needs_cl
@pytest.mark.parametrize("name", [*VARIANTS, "dynamic-int8", "dynamic-uint8"])
def test_a_quantized_model_matches_its_reference_and_onnxruntime(models: dict[str, Path], name: str) -> None:
    path = models[name]
    proto = onnx.load(path)
    m = roller.compile_model(path, hw="pocl-cpu", progress=False)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    step = _last_scale(proto) if name.startswith("q") else 1e-5
    for _ in range(4):
        x = rng.standard_normal(SHAPE).astype(np.float32)
        got = m.run({"x": x})["y"]
        ref = evaluate(m.graph, {"x": x})["y"]
        if name.startswith("q"):   # integers to the end (the last dequantization is one product)
            np.testing.assert_array_equal(got, ref)
        else:   # the dynamic scales and the dequantized sums are float32 arithmetic
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        want = session.run(None, {"x": x})[0]
        assert np.abs(got - want).max() <= step * 1.001, name
    assert m.check({"x": x})["reference"].startswith("onnxruntime")


def test_a_quantized_models_reference_has_onnxruntimes_unoptimised_run_as_its_spread(models: dict[str, Path]
                                                                                     ) -> None:
    feeds = {"x": np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)}
    for name, path in models.items():
        proto = onnx.load(path)
        ref = onnxruntime_reference(proto, feeds)
        assert quantized(proto) and isinstance(ref, ModelReference) and ref.spread is not None, name
        assert ref.spread_by == f"{ref.by} without graph optimisations"
        assert np.abs(ref.spread["y"] - ref.outputs["y"]).max() <= (_last_scale(proto) if name.startswith("q")
                                                                    else 1e-3), name
    plain = onnxruntime_reference(float_cnn(), feeds)
    assert not quantized(float_cnn()) and isinstance(plain, ModelReference) and plain.spread is None


def test_qdq_groups_become_integer_operators(models: dict[str, Path]) -> None:
    for name in ("qdq-uint8", "qdq-int8-per-channel", "qdq-gemm", "qoperator-gemm", "qoperator-gemm-per-tensor"):
        ops = Counter(n.op_type for n in qdq_to_qlinear(expand_contrib(onnx.load(models[name]))).graph.node)
        assert ops["QLinearConv"] == 3 and ops["QLinearMatMul"] == 1, (name, ops)
        assert ops["Conv"] == ops["MatMul"] == ops["Gemm"] == ops["QGemm"] == 0, (name, ops)
    assert Counter(n.op_type for n in onnx.load(models["qoperator-gemm"]).graph.node)["QGemm"] == 1
    # the weights reach the device as integers less their zero points, not dequantized floats; each reader of
    # a quantized value computes it from what it was rounded from (no int8 tensor is left between kernels)
    graph = import_model(models["qdq-int8-per-channel"])
    assert not [v for v in graph.values.values() if v.dtype in ("int8", "uint8")]
    assert sum(n.expr.kind == "dequantize" for n in graph.op_nodes) >= 4
    for c in graph.constants.values():
        if c.ndim == 4:
            assert np.array_equal(c, np.rint(c)) and np.abs(c).max() <= 255


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], x_type: int = TensorProto.FLOAT,
           y_type: int = TensorProto.UINT8, shape: tuple[int, ...] = (1, 4)) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", x_type, list(shape))],
                          [helper.make_tensor_value_info("y", y_type, list(shape))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize(("nodes", "inits", "message"), [
    ([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
     [numpy_helper.from_array(np.array(0.1, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int16), "z")],
     "quantization to int16 is not supported"),
    ([helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=1, block_size=2)],
     [numpy_helper.from_array(np.full((1, 2), 0.1, np.float32), "s")], "block_size"),
    ([helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=1)],
     [numpy_helper.from_array(np.full(3, 0.1, np.float32), "s")], "neither one value nor one per element"),
])
def test_unsupported_quantization_is_one_clear_error(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto],
                                                       message: str) -> None:
    y_type = TensorProto.INT16 if "int16" in message else TensorProto.UINT8
    with pytest.raises(InputError, match=message) as err:
        import_model(_model(nodes, inits, y_type=y_type))
    assert "QuantizeLinear" in str(err.value)


@needs_cl
def test_quantize_rounds_halves_to_even_and_saturates() -> None:
    x = np.array([[-129.5, -128.4, -127.0, -0.5, 0.5, 1.5, 2.5, 126.5, 127.6, 300.0]], np.float32)
    for t, zero in ((TensorProto.INT8, np.int8(0)), (TensorProto.UINT8, np.uint8(3))):
        inits = [numpy_helper.from_array(np.array(1.0, np.float32), "s"), numpy_helper.from_array(np.array(zero), "z")]
        model = _model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])], inits, y_type=t,
                       shape=x.shape)
        got = roller.compile_model(model, hw="pocl-cpu", progress=False).run({"x": x})["y"]
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, want)


def test_scales_whose_multiplier_is_no_float32_number_are_refused() -> None:
    s = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
         (("xs", 1e30), ("ws", 1e30), ("ys", 1e-30))]
    z = [numpy_helper.from_array(np.array(0, np.uint8), "xz"), numpy_helper.from_array(np.array(0, np.int8), "wz"),
         numpy_helper.from_array(np.array(0, np.uint8), "yz"),
         numpy_helper.from_array(np.ones((1, 1, 1, 1), np.int8), "w")]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])
    with pytest.raises(InputError, match="multiplier"):
        import_model(_model([node], s + z, x_type=TensorProto.UINT8, shape=(1, 1, 2, 2)))
