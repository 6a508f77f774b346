"""Values with a zero dimension (issue 40): an empty slice, split, gather or concatenation input is a value known
at import with no elements, so no kernel makes it; what reads only it is folded, a copy leaves it out, and an
elementwise result of it is empty again. Before, each was refused (or, for Split and Gather, a traceback)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper

import roller
from roller.backends import get

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())


def _model(nodes: list[onnx.NodeProto], outputs: list[str], inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "empty", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 5])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, [None, None]) for o in outputs],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _empty_rows() -> list[onnx.NodeProto]:
    return [helper.make_node("Slice", ["X", "s9", "e10"], ["E"])]   # rows 9..10 of 4: none


CASES = {
    # an empty slice through an activation, added to a row (broadcast: empty), concatenated before X
    "concat": (_empty_rows() + [helper.make_node("Relu", ["E"], ["R"]),
                                helper.make_node("Slice", ["X", "s0", "e1"], ["X1"]),
                                helper.make_node("Add", ["R", "X1"], ["A"]),
                                helper.make_node("Concat", ["A", "X"], ["Y"], axis=0)], ["Y"]),
    # a split whose first part is empty, each part through an activation, both outputs
    "split": ([helper.make_node("Split", ["X", "sizes"], ["P", "Q"], axis=1), helper.make_node("Relu", ["P"], ["Y"]),
               helper.make_node("Relu", ["Q"], ["Z"])], ["Y", "Z"]),
    # a gather of no indices
    "gather": ([helper.make_node("Gather", ["X", "none"], ["Y"])], ["Y"]),
    # the sum over an empty axis (zeros) added to X, and a product over an empty inner dimension
    "reductions": (_empty_rows() + [helper.make_node("ReduceSum", ["E", "axis0"], ["S"], keepdims=1),
                                    helper.make_node("Add", ["S", "X"], ["Y"]),
                                    helper.make_node("Slice", ["X", "s9", "e10", "axis1"], ["C"]),
                                    helper.make_node("Transpose", ["C"], ["CT"]),
                                    helper.make_node("MatMul", ["C", "CT"], ["Z"])], ["Y", "Z"]),
}
INITS = [_ints("s9", [9]), _ints("e10", [10]), _ints("s0", [0]), _ints("e1", [1]), _ints("sizes", [0, 5]),
         _ints("none", []), _ints("axis0", [0]), _ints("axis1", [1])]


@needs_device
@pytest.mark.parametrize("case", list(CASES))
def test_empty_values_flow_through_like_onnxruntime(case: str) -> None:
    ort = pytest.importorskip("onnxruntime")
    nodes, outputs = CASES[case]
    used = {i for n in nodes for i in n.input}
    model = _model(nodes, outputs, [t for t in INITS if t.name in used])
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    built = roller.compile_model(model, hw="pocl-cpu")
    got = built.run({"X": x})
    assert list(got) == outputs
    for name, expected in zip(outputs, want):
        assert got[name].shape == expected.shape, name
        np.testing.assert_allclose(got[name], expected, rtol=1e-5, atol=1e-6)
    # nothing on the device has a zero dimension: the empty values are constants, and no kernel makes one
    assert all(built.graph.values[n.output].size > 0 for n in built.graph.nodes)
