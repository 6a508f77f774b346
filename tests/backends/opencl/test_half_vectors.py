"""float16 tensors in vectorised CPU kernels (issue 40): OpenCL reads and writes vectors of float16 bits with
integer operations (``rl_h2f_v``, ``rl_f2h_v``), rounding to nearest even. Every float16 value goes through,
and float32 values at every rounding boundary come back, bit for bit as numpy's astype; the rows start at odd
elements (PoCL's own vload_halfN faulted there)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper

import roller
from roller.backends import get

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())


def _model(node: onnx.NodeProto, x_type: int, y_type: int, shape: list[int]) -> onnx.ModelProto:
    g = helper.make_graph([node], "half", [helper.make_tensor_value_info("X", x_type, shape)],
                          [helper.make_tensor_value_info("Y", y_type, shape)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _vectorised(built: roller.Model) -> str:
    source = "".join(k.artifact.source for k in built.by_key.values())
    assert "rl_h2f_v(" in source or "rl_f2h_v(" in source, "the kernel did not take the vector path"
    return source


@needs_device
def test_every_float16_value_reads_and_writes_back_unchanged() -> None:
    bits = np.arange(65536, dtype=np.uint16)
    rows = -(-bits.size // 37)   # 37 columns: vectors start at odd elements, and each row ends in scalar lanes
    x = np.resize(bits, rows * 37).view(np.float16).reshape(rows, 37)
    built = roller.compile_model(_model(helper.make_node("Relu", ["X"], ["Y"]), TensorProto.FLOAT16,
                                        TensorProto.FLOAT16, list(x.shape)), hw="pocl-cpu")
    _vectorised(built)
    got = built.run({"X": x})["Y"].view(np.uint16).reshape(-1)
    want = np.maximum(x, np.float16(0)).view(np.uint16).reshape(-1)
    nan = np.isnan(x.reshape(-1))
    assert np.array_equal(got[~nan], want[~nan])
    assert np.isnan(got.view(np.float16)[nan]).all()


def _boundaries() -> np.ndarray:
    """float32 values around every float16 value: exactly on it, half an ulp either side (ties: to even), just
    inside and outside each tie, the overflow edge, subnormals of both types, infinities and NaN."""
    h = np.arange(0, 0x7c00, dtype=np.uint16).view(np.float16).astype(np.float64)
    nxt = np.arange(1, 0x7c01, dtype=np.uint16).view(np.float16).astype(np.float64)
    mid = (h + nxt) / 2
    vals = np.concatenate([h, mid, np.nextafter(mid.astype(np.float32), np.float32(0)).astype(np.float64),
                           np.nextafter(mid.astype(np.float32), np.float32(np.inf)).astype(np.float64),
                           [65504.0, 65519.99, 65520.0, 65535.0, 1e6, 1e-8, 1e-30, 1e-45, np.inf]])
    x = vals.astype(np.float32)
    return np.concatenate([x, -x, [np.nan, -np.nan]]).astype(np.float32)


@needs_device
def test_float32_values_round_to_float16_as_numpy_does() -> None:
    x = _boundaries()
    rows = -(-x.size // 37)
    x = np.resize(x, rows * 37).reshape(rows, 37)   # 37 columns: the vectors start at odd elements
    built = roller.compile_model(_model(helper.make_node("Cast", ["X"], ["Y"], to=TensorProto.FLOAT16),
                                        TensorProto.FLOAT, TensorProto.FLOAT16, list(x.shape)), hw="pocl-cpu")
    _vectorised(built)
    got = built.run({"X": x})["Y"]
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(x)
    assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(got[nan]).all()
