"""A float16 model (weights, inputs and outputs float16, as onnxconverter_common.float16 writes them) runs whole
and is checked against onnxruntime with the half-precision tolerance (issue 40): onnxruntime computes in half
precision too, so the two differ by more than float32's model tolerance allows. A bfloat16 model runs too, and
is checked against roller.reference: onnxruntime's CPU kernels have no bfloat16 convolution."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

import roller
from roller.compiler.check import HALF_ATOL, MODEL_ATOL, model_tolerances

MINI = Path(__file__).resolve().parents[2] / "examples" / "models" / "mini_resnet.onnx"


def as_float16(model: onnx.ModelProto, elem: int = TensorProto.FLOAT16) -> onnx.ModelProto:
    """``model`` with every float32 initializer, input and output float16 (or ``elem``: bfloat16; its op types
    all take both)."""
    kind = onnx.helper.tensor_dtype_to_np_dtype(elem)   # bfloat16: ml_dtypes' type
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for i, init in enumerate(g.initializer):
        if init.data_type == TensorProto.FLOAT:
            g.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(kind), init.name))
    for v in [*g.input, *g.output]:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = elem
    del g.value_info[:]
    return out


def test_a_float16_model_runs_and_matches_onnxruntime() -> None:
    ort = pytest.importorskip("onnxruntime")
    half = as_float16(onnx.load(MINI))
    m = roller.compile_model(half, hw="pocl-cpu")
    feeds = m.random_inputs(0)
    assert {m.graph.values[n].dtype for n in (*m.graph.inputs, *m.graph.outputs)} == {"float16"}
    check = m.check(feeds)
    assert check["ok"] and check["reference"].startswith("onnxruntime")
    # closer to the float32 model's output than the half-precision tolerance, as onnxruntime's own half run is
    full = ort.InferenceSession(MINI.read_bytes(), providers=["CPUExecutionProvider"])
    want = full.run(None, {k: np.asarray(v, np.float32) for k, v in feeds.items()})[0]
    out = next(iter(m.run(feeds).values()))
    assert out.dtype == np.float16
    assert np.abs(out.astype(np.float32) - want).max() < HALF_ATOL * np.abs(want).max()


def test_a_bfloat16_model_runs_and_is_checked_against_the_graph_reference() -> None:
    ort = pytest.importorskip("onnxruntime")
    bf16 = as_float16(onnx.load(MINI), TensorProto.BFLOAT16)
    m = roller.compile_model(bf16, hw="pocl-cpu")
    assert {m.graph.values[n].dtype for n in (*m.graph.inputs, *m.graph.outputs)} == {"bfloat16"}
    feeds = m.random_inputs(0)
    check = m.check(feeds)
    assert check["ok"] and check["reference"].startswith("roller.reference, operator by operator (onnxruntime ")
    assert "cannot run this model: " in check["reference"] and "\n" not in check["reference"]
    full = ort.InferenceSession(MINI.read_bytes(), providers=["CPUExecutionProvider"])
    want = full.run(None, {k: np.asarray(v, np.float32) for k, v in feeds.items()})[0]
    out = next(iter(m.run(feeds).values()))
    assert out.dtype == np.float32 and not (out.view(np.uint32) & np.uint32(0xFFFF)).any()   # bfloat16 values
    # bfloat16 keeps 8 bits where float16 keeps 11: up to 8 times float16's difference from the float32 model
    assert np.abs(out - want).max() < 8 * HALF_ATOL * np.abs(want).max()


def test_the_half_tolerance_is_for_half_models_only() -> None:
    assert model_tolerances(["float32", "int64"])[1] == MODEL_ATOL
    assert model_tolerances(["float32", "float16"])[1] == HALF_ATOL
