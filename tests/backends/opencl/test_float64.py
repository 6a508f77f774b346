"""float64 on the device (issue 40): an op that holds a float64 tensor computes every float value in double, on
OpenCL (``cl_khr_fp64``, which PoCL has), CUDA and HIP. Every candidate of float64 ops, for a CPU's and two GPUs'
descriptions (direct reads, CPU vectors, staged tiles, row kernels, typed bodies), runs on PoCL within the bound
of a float64 evaluation (unit roundoff 2^-53: a float32 computation fails it by nine orders of magnitude); whole
ONNX models in float64 match onnx.reference to float64's precision; the CUDA and HIP sources compile (and run
emulated: tests/backends/cuda/test_emulated.py, tests/backends/hip/test_emulation.py); the Poplar backend,
without float64, refuses it in one line."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import roller
from roller.backends import get
from roller.compiler.check import check_against
from roller.errors import InputError, ToolchainError
from roller.hw import load
from tests.support.candidates import opencl_candidates

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())


def _op(name: str, expr: str, shapes: dict[str, list[int]], dtype: str = "float64", **dtypes: str) -> dict:
    return {"name": name, "expr": expr, "shapes": shapes, "dtype": dtype, "dtypes": dtypes}


OPS = [
    _op("matmul64", "Y[m,n] += A[m,k] * B[k,n]", {"A": [70, 96], "B": [96, 40]}),
    _op("conv64", "Y[n,f,h,w] += X[n,c,h+r,w+s] * W[f,c,r,s]", {"X": [1, 8, 14, 14], "W": [16, 8, 3, 3], "Y": [1, 16, 12, 12]}),
    _op("scale64", "Y[i,j] = exp(X[i,j] * 0.1) + j", {"X": [33, 70]}),
    _op("rowsum64", "Y[i] += X[i,k] * X[i,k]", {"X": [20, 300]}),
    _op("softmax64", "M[r] max= X[r,c]; S[r] += exp(X[r,c] - M[r]); Y[r,c] = exp(X[r,c] - M[r]) / S[r]",
        {"X": [9, 50]}),
    # mixed: a float32 tensor read into a float64 kernel, a float64 one stored as float32, integers beside
    _op("widen", "Y[i] = A[i] + B[i]", {"A": [100], "B": [100]}, A="float32"),
    _op("narrow", "Y[i,j] = X[i,j] * 3.0", {"X": [12, 40]}, Y="float32"),
    _op("ids64", "Y[i] = float64(ids[i]) * 0.5 + X[i]", {"ids": [64], "X": [64]}, ids="int64"),
    _op("trunc64", "Y[i] = int64(X[i] * 1e12)", {"X": [64]}, Y="int64"),
    # no float64 tensor, a float64 value: the kernel computes in double all the same
    _op("halfids", "Y[i] = int64(float64(ids[i]) * 0.5)", {"ids": [64]}, dtype="int64"),
]


@needs_device
@pytest.mark.parametrize("hw", ["pocl-cpu", "h100", "mi50"])
def test_every_candidate_of_float64_ops_is_within_float64_rounding(hw: str) -> None:
    checked = 0
    for op in OPS:
        expr = roller.load_op(op)
        assert expr.acc_dtype in ("float64", "int64"), op["name"]
        x = roller.random_inputs(op, seed=3)
        for prog, art, out in opencl_candidates(op, hw, x, top_k=5):
            assert "double" in art.source
            check_against(f"{op['name']} on {hw} ({prog.line()})", expr, x, out)
            checked += 1
    assert checked >= len(OPS)


@needs_device
def test_float64_sums_keep_what_float32_drops() -> None:
    # 1 + 1e-12 is 1 in float32: a float32 sum of these is exactly n, the float64 one n + n * 1e-12 (within
    # the sum's own rounding, 4096 additions of half an ulp of 4096 at most: 2e-9).
    n = 4096
    x = np.full((3, n), 1.0 + 1e-12)
    k = roller.compile(_op("tiny", "Y[i] += X[i,k]", {"X": [3, n]}), hw="pocl-cpu")
    got = k(X=x)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got - n, np.full(3, n * 1e-12), atol=2e-9)
    assert (got > n).all()
    # literals are doubles as written: 0.1 is not float32's 0.100000001490116
    k = roller.compile(_op("tenth", "Y[i] = X[i] * 0.1", {"X": [40]}), hw="pocl-cpu")
    v = np.arange(40, dtype=np.float64) + 1
    np.testing.assert_array_equal(k(X=v), v * 0.1)


def _model(nodes: list, inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "f64", inputs, outputs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _vi(name: str, t: int, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, t, shape)


@needs_device
def test_a_float64_model_matches_the_reference_to_float64_precision() -> None:
    rng = np.random.default_rng(0)
    d = TensorProto.DOUBLE
    inits = [numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)), "W"),
             numpy_helper.from_array(rng.standard_normal((8 * 4 * 4, 10)), "F"),
             numpy_helper.from_array(rng.standard_normal(10), "B")]
    nodes = [helper.make_node("Conv", ["X", "W"], ["C"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["C"], ["R"]),
             helper.make_node("AveragePool", ["R"], ["P"], kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Flatten", ["P"], ["V"]),
             helper.make_node("Gemm", ["V", "F", "B"], ["G"]),
             helper.make_node("ReduceMean", ["G"], ["M"], axes=[1], keepdims=1),
             helper.make_node("Sub", ["G", "M"], ["Z"]),
             helper.make_node("Softmax", ["Z"], ["Y"]),
             helper.make_node("Cast", ["Y"], ["Y32"], to=TensorProto.FLOAT)]
    m = _model(nodes, [_vi("X", d, [2, 4, 11, 11])], [_vi("Y", d, [2, 10]), _vi("Y32", TensorProto.FLOAT, [2, 10])],
               inits)
    x = rng.standard_normal((2, 4, 11, 11))
    got = roller.compile_model(m, hw="pocl-cpu").run({"X": x})
    want = ReferenceEvaluator(m).run(None, {"X": x})
    assert got["Y"].dtype == np.float64 and got["Y32"].dtype == np.float32
    np.testing.assert_allclose(got["Y"], want[0], rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(got["Y32"], want[0].astype(np.float32))


@pytest.mark.parametrize("hw,backend", [("h100", "cuda"), ("mi50", "hip")])
def test_float64_sources_compile_for_gpus(hw: str, backend: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    be, desc = get(backend), load(hw)
    for op in OPS:
        prog = roller.construct(op, hw, top_k=1)[0]
        art = be.render(prog, desc)
        assert "double" in art.source and "expf(" not in art.source, op["name"]
        try:
            be.check_compiles(art, desc, tmp_path / op["name"])
        except ToolchainError as err:
            pytest.skip(str(err))


def test_poplar_refuses_float64_in_one_line() -> None:
    with pytest.raises(InputError) as err:
        roller.compile(OPS[0], hw="ipu-gc200")
    assert str(err.value) == ("dtype: matmul64: the poplar backend does not render float64 tensors (it renders "
                              "float32)")
