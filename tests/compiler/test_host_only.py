"""A model that compiles to nothing the device runs is said so (issue 37, item 5): every output computed at
import, or run-time inputs folded as constants by the ONNX backend's specialisation, is never a silent
success."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import roller
from roller.backends import get
from roller.cli.main import main
from roller.errors import HostOnlyWarning

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
OPSET = [helper.make_opsetid("", 17)]


def _constant_only() -> onnx.ModelProto:
    c = numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "c")
    g = helper.make_graph([helper.make_node("Relu", ["c"], ["y"])], "constant_only", [],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], initializer=[c])
    return helper.make_model(g, opset_imports=OPSET)


def _ids_plus_one() -> onnx.ModelProto:
    """Token ids cast to float and shifted: the ids stay an input the device reads."""
    nodes = [helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["f", "one"], ["y"])]
    one = numpy_helper.from_array(np.ones((1,), np.float32), "one")
    g = helper.make_graph(nodes, "ids_plus_one", [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], initializer=[one])
    return helper.make_model(g, opset_imports=OPSET)


def _reshaped_by_input() -> onnx.ModelProto:
    """A constant reshaped by a shape the caller passes: the ONNX backend folds the shape in, and then every
    output is computed at import."""
    c = numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32), "c")
    nodes = [helper.make_node("Reshape", ["c", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    g = helper.make_graph(nodes, "reshaped", [helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])], initializer=[c])
    return helper.make_model(g, opset_imports=OPSET)


def _relu() -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(g, opset_imports=OPSET)


@needs_device
def test_a_model_computed_at_import_is_reported() -> None:
    with pytest.warns(HostOnlyWarning, match="constant_only: every output was computed at import"):
        m = roller.compile_model(_constant_only(), hw="pocl-cpu")
    assert not m.kernels and not m.on_device
    want = np.maximum(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), 0)
    np.testing.assert_array_equal(m.run({})["y"], want)


@needs_device
def test_a_model_that_runs_on_the_device_says_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostOnlyWarning)
        m = roller.compile_model(_relu(), hw="pocl-cpu")
    assert m.on_device and len(m.kernels) == 1


@needs_device
def test_the_onnx_backend_reports_folded_run_time_inputs() -> None:
    from roller.compiler import onnx_backend

    rep = onnx_backend.prepare(_reshaped_by_input(), device="CPU")
    with pytest.warns(HostOnlyWarning, match="folded as constants"):
        (y,) = rep.run([np.array([2, 3], np.int64)])
    np.testing.assert_array_equal(y, np.maximum(np.linspace(-1, 1, 6, dtype=np.float32), 0).reshape(2, 3))
    assert rep.specialised_inputs == ["shape"] and not rep.model.kernels


@needs_device
def test_token_ids_are_no_longer_folded() -> None:
    """Before integer tensors lived on the device, the ids were folded in and nothing ran there."""
    from roller.compiler import onnx_backend

    with warnings.catch_warnings():
        warnings.simplefilter("error", HostOnlyWarning)
        rep = onnx_backend.prepare(_ids_plus_one(), device="CPU")
        (y,) = rep.run([np.array([3, 1, 4, 1], np.int64)])
    np.testing.assert_array_equal(y, [4, 2, 5, 2])
    assert rep.specialised_inputs == [] and rep.model.on_device


@needs_device
def test_the_command_says_it_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.onnx"
    onnx.save(_constant_only(), str(path))
    assert main(["run", "--hw", "pocl-cpu", str(path)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("roller: warning: constant_only: every output was computed")
