"""A float16 model (weights, inputs and outputs float16, as onnxconverter_common.float16 writes them) runs whole
and is checked against onnxruntime with the half-precision tolerance (issue 40): onnxruntime computes in half
precision too, so the two differ by more than float32's model tolerance allows."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

import roller
from roller.compiler.check import HALF_ATOL, MODEL_ATOL, model_tolerances

MINI = Path(__file__).resolve().parents[2] / "examples" / "models" / "mini_resnet.onnx"


def as_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every float32 initializer, input and output float16 (its op types all take float16)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for i, init in enumerate(g.initializer):
        if init.data_type == TensorProto.FLOAT:
            g.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16),
                                                              init.name))
    for v in [*g.input, *g.output]:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
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


def test_the_half_tolerance_is_for_half_models_only() -> None:
    assert model_tolerances(["float32", "int64"])[1] == MODEL_ATOL
    assert model_tolerances(["float32", "float16"])[1] == HALF_ATOL
