"""Models of opsets before 11 are upgraded at import (onnx.version_converter) with a one-line note, and optional
outputs that nothing reads (Dropout's mask, MaxPool's indices, BatchNormalization's training statistics) are
dropped, not refused (issue 40): the ONNX package's light zoo runs as shipped."""
from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import roller
from roller.errors import InputError
from roller.frontends.onnx import import_model
from roller.frontends.onnx.rewrite import OpsetUpgrade
from tests.support import light_zoo


def _model(nodes: list, inputs: list, outputs: list, inits: dict | None = None, opset: int = 17,
           ir: int | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if ir is not None:
        model.ir_version = ir
    return model


X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])


@pytest.mark.parametrize("name", light_zoo.NAMES)
def test_the_light_zoo_imports_as_shipped(name: str) -> None:
    with pytest.warns(OpsetUpgrade, match=r"opset 9 upgraded to 11 at import \(onnx.version_converter\)$"):
        graph = import_model(light_zoo.path(name))
    assert graph.op_nodes and graph.outputs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["squeezenet", "shufflenet", "inception_v1"])
def test_light_models_run_with_random_weights_as_onnxruntime_does(name: str) -> None:
    """With random weights (with the shipped constants every class scores the same); the other six run the same
    way in ``bench/light_zoo.py``."""
    pytest.importorskip("onnxruntime")
    model = light_zoo.with_random_weights(onnx.load(light_zoo.path(name)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpsetUpgrade)
        m = roller.compile_model(model, hw="pocl-cpu")
    check = m.check(m.random_inputs(0))
    assert check["ok"] and check["reference"].startswith("onnxruntime"), check
    out = next(iter(m.run(m.random_inputs(1)).values()))
    assert np.ptp(out) > 1e-6   # the classes score differently: the check compared something


def test_an_opset_7_model_is_upgraded_and_computes_the_same() -> None:
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])
    model = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "b"], ["y"])],
                   [X], [y], {"b": np.full((1, 2, 4, 4), 0.5)}, opset=7)
    with pytest.warns(OpsetUpgrade, match="opset 7 upgraded to 11"):
        m = roller.compile_model(model, hw="pocl-cpu")
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(m.run({"x": x})["y"], np.maximum(x, 0) + 0.5, rtol=0, atol=0)


def test_a_model_the_converter_cannot_upgrade_is_one_line() -> None:
    """IR 3 wants every initializer among the graph's inputs; the converter then finds the weight undefined."""
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])
    model = _model([helper.make_node("Add", ["x", "b"], ["y"])], [X], [y], {"b": np.ones((1, 2, 4, 4))}, opset=8, ir=3)
    with pytest.raises(InputError) as err:
        import_model(model, source="old.onnx")
    text = str(err.value)
    assert "\n" not in text and "old.onnx" in text and "opset 8 could not be upgraded to 11" in text


def test_an_opset_newer_than_onnx_knows_is_refused() -> None:
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [X], [y], opset=onnx.defs.onnx_opset_version() + 1)
    with pytest.raises(InputError, match="newer than this onnx package knows"):
        import_model(model, source="new.onnx")


def test_unread_optional_outputs_are_dropped() -> None:
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"]),
             helper.make_node("BatchNormalization", ["d", "s", "b", "mean", "var"],
                              ["n", "running_mean", "running_var"], training_mode=0),
             helper.make_node("MaxPool", ["n"], ["y", "indices"], kernel_shape=[2, 2], strides=[2, 2])]
    inits = {"s": [1.0, 2.0], "b": [0.0, 1.0], "mean": [0.5, -0.5], "var": [1.0, 4.0]}
    m = roller.compile_model(_model(nodes, [X], [y], inits), hw="pocl-cpu")
    x = np.random.default_rng(1).standard_normal((1, 2, 4, 4)).astype(np.float32)
    sh = (1, 2, 1, 1)
    n = (x - np.reshape(inits["mean"], sh)) / np.sqrt(np.reshape(inits["var"], sh) + 1e-5) \
        * np.reshape(inits["s"], sh) + np.reshape(inits["b"], sh)
    want = n.reshape(1, 2, 2, 2, 2, 2).max(axis=(3, 5))
    np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_a_dropout_mask_that_is_read_is_still_refused_in_one_line() -> None:
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])
    mask = helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 2, 4, 4])
    model = _model([helper.make_node("Dropout", ["x"], ["y", "mask"])], [X], [y, mask])
    with pytest.raises(InputError, match="the mask output of Dropout is not supported"):
        import_model(model, source="m.onnx")


def test_the_command_line_notes_the_upgrade_in_one_line(tmp_path: Path) -> None:
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])
    path = tmp_path / "old.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])], [X], [y], opset=9), path)
    done = subprocess.run([sys.executable, "-m", "roller", "run", "--hw", "pocl-cpu", str(path)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if "upgraded" in line]
    assert len(notes) == 1 and "opset 9 upgraded to 11 at import" in notes[0] and str(path) in notes[0]
