"""The model-level Python API under bad arguments: one ``InputError`` naming the argument and what is wrong,
never a traceback from deep inside (TypeError, ValueError, AttributeError), and nothing taken silently with
another meaning (a size of 1.5 or True, an unknown input name, an int64 input rounded to float32)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper

import roller
import roller.compiler.onnx_backend as backend
from roller.backends import get
from roller.errors import InputError

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())


def relu(dims: list[Any]) -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("Relu", ["X"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, dims)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


OPEN = relu(["n", 8])
COMPILE_CASES: list[tuple[str, Callable[[], object], str]] = [
    ("None", lambda: roller.compile_model(None, hw="pocl-cpu"), r"expected a model: .* got NoneType"),
    ("an int", lambda: roller.compile_model(12345, hw="pocl-cpu"), r"expected a model: .* got int"),
    ("garbage bytes", lambda: roller.compile_model(b"garbage", hw="pocl-cpu"), r"<bytes>: not an ONNX model"),
    ("shapes a string", lambda: roller.compile_model(OPEN, hw="pocl-cpu", shapes={"X": "ab"}),
     r"shapes\.X: expected a list of positive integer sizes, got 'ab'"),
    ("shapes a list", lambda: roller.compile_model(OPEN, hw="pocl-cpu", shapes=[1, 8]),
     r"shapes: expected input names mapped to their sizes"),
    ("a float size", lambda: roller.compile_model(OPEN, hw="pocl-cpu", shapes={"X": [1.5, 8]}),
     r"shapes\.X: .* got \[1\.5, 8\]"),
    ("a bool size", lambda: roller.compile_model(OPEN, hw="pocl-cpu", shapes={"X": [True, 8]}),
     r"shapes\.X: .* got \[True, 8\]"),
    ("a named size", lambda: roller.compile_model(OPEN, hw="pocl-cpu", shapes={"X": ["s", 8]}),
     r"shapes\.X: .* got \['s', 8\]"),
    ("an unknown input", lambda: roller.compile_model(OPEN, hw="pocl-cpu", shapes={"Z": [1, 8]}),
     r"shapes\.Z: 'Z' is not an input of the model \(inputs: X\)"),
    ("a range upside down", lambda: roller.compile_model(OPEN, hw="pocl-cpu", ranges={"n": (5, 1)}),
     r"^ranges\.n: expected \(least, greatest\)"),
    ("the backend on 'GPU'", lambda: backend.prepare(relu([2, 8]), device="GPU"),
     r"device: device 'GPU': expected 'CPU' or 'CUDA'"),
    ("the backend on garbage", lambda: backend.prepare(b"garbage"), r"not an ONNX model"),
    ("the backend on None", lambda: backend.prepare(None), r"expected a model"),
]


@pytest.mark.parametrize(("what", "call", "message"), COMPILE_CASES, ids=[c[0] for c in COMPILE_CASES])
def test_bad_arguments_are_one_line(what: str, call: Callable[[], object], message: str) -> None:
    with pytest.raises(InputError, match=message) as err:
        call()
    assert "\n" not in str(err.value)


@needs_device
def test_bad_run_arguments_are_one_line() -> None:
    rep = backend.prepare(relu([2, 8]))
    for inputs in (None, 3, "x"):
        with pytest.raises(InputError, match=r"run\(\) takes the inputs as a list, a tuple or a dict by name \(X\)"):
            rep.run(inputs)
    m = roller.compile_model(relu([2, 8]), hw="pocl-cpu")
    with pytest.raises(InputError, match=r"input 'X' holds 1099511627777 \(at \[0, 1\]\), which float32 cannot hold "
                                         r"exactly"):
        m.run({"X": np.array([[0, 2**40 + 1] + [0] * 6] * 2, np.int64)})
    exact = np.array([[-3, 2**24] + [0] * 6] * 2, np.int64)   # integers float32 holds still convert
    np.testing.assert_array_equal(m.run({"X": exact})["Y"], np.maximum(exact, 0).astype(np.float32))
