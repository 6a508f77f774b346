"""Graphs far larger than any model of the zoo (issue 38): a chain of thousands of activations builds, runs
and matches onnxruntime with either fusion method; no fused body nests deeper than an op file's may (a chain
fused whole was a RecursionError), fusion works one segment at a time past ``WHOLE_UP_TO`` operators (linear
in the graph's size, where it rescanned the whole graph after every rewrite), and the solver hands a graph
past ``SOLVER_MAX_OPS`` operators to the greedy pass with one warning."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper

import roller
from roller.backends import get
from roller.compiler import model as model_module
from roller.frontends.onnx import import_model
from roller.graph import segments
from roller.ir.expr import depth
from roller.ir.parse import MAX_DEPTH

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())


def chain(n: int) -> onnx.ModelProto:
    nodes, prev = [], "X"
    for i in range(n):
        out = "Y" if i == n - 1 else f"v{i}"
        nodes.append(helper.make_node(("Relu", "Sigmoid", "Neg", "Abs")[i % 4], [prev], [out]))
        prev = out
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 64])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 64])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@needs_device
@pytest.mark.parametrize("fuse", ["greedy", "solver"])
def test_a_long_chain_builds_and_matches_onnxruntime(fuse: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segments, "SEGMENT_OPS", 100)   # several segments at a test's size
    monkeypatch.setattr(segments, "WHOLE_UP_TO", 100)
    monkeypatch.setattr(model_module, "SOLVER_MAX_OPS", 300)
    m = chain(600)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm = roller.compile_model(m, hw="pocl-cpu", fuse=fuse)
    said = [str(w.message) for w in caught if "fusion solver" in str(w.message)]
    assert said == ([] if fuse == "greedy" else
                    ["chain: 600 operators, more than the 300 the fusion solver takes in bounded time (it costs "
                     "tens of milliseconds an operator); fused by the greedy pass instead"])
    assert 600 // MAX_DEPTH <= len(cm.kernels) < 600
    assert all(depth(n.expr.body) <= MAX_DEPTH for n in cm.stages.fused.op_nodes)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    assert cm.check({"X": x})["ok"]


def test_segments_keep_every_value_the_graph_reads_later() -> None:
    """A value made in one segment and read in a later one (a skip connection) stays an output of its
    segment; the fused graph is valid (``Graph.check``) and computes the same as the graph unfused."""
    from roller.graph.fusion import fuse
    from roller.graph.reference import evaluate

    nodes, prev = [], "X"
    for i in range(30):
        nodes.append(helper.make_node("Relu" if i % 2 else "Neg", [prev], [f"v{i}"]))
        prev = f"v{i}"
    nodes.append(helper.make_node("Add", ["v3", prev], ["Y"]))   # v3 read 27 operators later
    g = helper.make_graph(nodes, "skip", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [8])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [8])])
    graph = import_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    fused, report = segments.fuse_in_segments(graph, fuse, size=7, whole=7)
    fused.check()
    x = {"X": np.linspace(-2, 2, 8).astype(np.float32)}
    np.testing.assert_allclose(evaluate(fused, x)["Y"], evaluate(graph, x)["Y"], rtol=1e-6)
    assert report.kernels_before == 31 and len(fused.op_nodes) < 31
