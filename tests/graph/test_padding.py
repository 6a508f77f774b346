"""Values made inside the padding their readers' windows want (roller.graph.padding): the rewrite, the plan
without copies, and the model on PoCL against onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import roller
from roller.backends import get
from roller.compiler.model import fuse_stage
from roller.compiler.target import Target
from roller.construction import construct, read_pads
from roller.frontends.onnx import import_model
from roller.graph import Graph, InputPad, kernel_key, plan
from roller.graph.memory import CopyStep
from roller.graph.padding import hold_padded
from roller.graph.reference import evaluate
from roller.ir import load_op
from roller.ir.fuse import fusible_groups, write_padded
from tests.compiler.test_models import _model, _ort, residual

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
HW = roller.hw.load("pocl-cpu")
C, SIDE = 8, 12


def _fused() -> Graph:
    g, _ = fuse_stage(import_model(residual(C, SIDE)), Target.resolve(HW), "greedy")
    return g


def _x() -> np.ndarray:
    return np.random.default_rng(3).standard_normal((1, C, SIDE, SIDE)).astype(np.float32)


def test_the_value_only_a_window_reads_is_made_inside_its_padding() -> None:
    g = _fused()
    want = evaluate(g, {"x": _x()})["y"]
    assert hold_padded(g, lambda e: read_pads(e, HW)) == 1
    g.check()
    (held,) = [v for v in g.values.values() if v.border is not None]
    assert held.shape == (1, C, SIDE + 2, SIDE + 2) and held.border is not None
    assert held.border.pads == ((0, 0), (0, 0), (1, 1), (1, 1)) and held.border.fill == 0.0
    (maker,) = [n for n in g.op_nodes if n.output == held.name]
    assert maker.expr.output.shape == held.shape
    # x stays as it is: a graph input, read padded by conv1 and plain by the residual add.
    assert g.values["x"].border is None
    got = evaluate(g, {"x": _x()}, keep=True)
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-6)
    border = got[held.name].copy()
    border[held.border.interior(held.shape)] = 0.0
    assert not border.any()


def test_a_rewrite_the_model_says_does_not_pay_is_left_alone() -> None:
    g = _fused()
    before = [n.expr.content_hash() for n in g.op_nodes]
    asked = []
    assert hold_padded(g, lambda e: read_pads(e, HW), lambda changes, nbytes: asked.append(nbytes) or False) == 0
    assert asked == [C * SIDE * SIDE * 4] and [n.expr.content_hash() for n in g.op_nodes] == before


def test_gpu_descriptions_pad_nothing() -> None:
    g = _fused()
    assert hold_padded(g, lambda e: read_pads(e, roller.hw.load("h100"))) == 0


def test_an_output_written_padded_keeps_its_rows_apart() -> None:
    op = load_op({"op": "elementwise", "fn": "relu", "shapes": {"X": [2, 8, 6, 6]}})
    assert fusible_groups(op) == [["i0", "i1", "i2", "i3"]]
    padded = write_padded(op, ((0, 0), (0, 0), (0, 1), (0, 1)))   # plain indices into longer rows
    assert padded.output.shape == (2, 8, 7, 7)
    assert fusible_groups(padded) == [["i0", "i1"]]
    x = np.random.default_rng(0).standard_normal((2, 8, 6, 6)).astype(np.float32)
    got = roller.reference(padded, {"X": x})
    np.testing.assert_array_equal(got[:, :, :6, :6], np.maximum(x, 0))
    assert not got[:, :, 6].any() and not got[:, :, :, 6].any()


@needs_device
def test_the_model_runs_without_the_copy_and_matches_onnxruntime() -> None:
    g = _fused()
    assert hold_padded(g, lambda e: read_pads(e, HW)) == 1
    m = roller.compile_model(g, hw=HW)
    (held,) = [v for v in m.graph.values.values() if v.border is not None]
    buf = m.plan.value_buffer[held.name]
    assert m.plan.buffers[buf].role == "padded" and m.plan.buffers[buf].fill == 0.0
    copies = [s for s in m.plan.steps if isinstance(s, CopyStep)]
    assert len(copies) == 1 and all(s.dst != buf for s in copies)   # only x's copy for conv1 is left
    x = _x()
    for _ in range(2):   # the border survives a run
        np.testing.assert_allclose(m.run({"x": x})["y"], _ort(residual(C, SIDE), {"x": x})[0], rtol=1e-4, atol=1e-5)


@needs_device
def test_a_kernel_writing_a_padded_interior_matches_the_reference() -> None:
    op = write_padded(load_op({"op": "conv2d", "N": 1, "C": 4, "F": 16, "H": 9, "W": 9, "KH": 3, "KW": 3,
                               "padding": 1}), ((0, 0), (0, 0), (1, 1), (1, 1)))
    x = roller.ir.reference.random_inputs(op, seed=0)
    ref = roller.reference(op, x)
    progs = construct(op, HW, top_k=4)
    assert progs
    for p in progs:
        y = CL.compile(CL.render(p, HW), HW)([x["X"], x["W"]])
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5, err_msg=p.line())
    k = roller.compile(op, hw=HW, top_k=3, evaluate=True)
    assert k.evaluation is not None and k.evaluation["check"]["ok"]


def _conv_relu():
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, SIDE, SIDE])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, SIDE, SIDE])],
                  {"w": rng.standard_normal((4, C, 3, 3)) * 0.2})


@needs_device
def test_an_input_only_windows_read_is_uploaded_into_its_padding() -> None:
    model = _conv_relu()
    m = roller.compile_model(model, hw=HW)
    assert not [s for s in m.plan.steps if isinstance(s, CopyStep)]
    pad = m.plan.input_pads["x"]
    assert pad.shape == (1, C, SIDE + 2, SIDE + 2) and pad.value == 0.0
    doc = m.plan.to_json()["inputs"][0]
    assert doc["value"] == "x" and doc["pad"] == {"shape": [1, C, SIDE + 2, SIDE + 2], "before": [0, 0, 1, 1],
                                                   "after": [0, 0, 1, 1], "value": 0.0, "dtype": "float32"}
    for seed in (5, 6):   # the host copy kept between runs takes each run's input
        x = np.random.default_rng(seed).standard_normal((1, C, SIDE, SIDE)).astype(np.float32)
        np.testing.assert_allclose(m.run({"x": x})["y"], _ort(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_an_input_read_plain_anywhere_stays_unpadded() -> None:
    # residual(): x is read padded by conv1 and as it is by the residual add.
    g = _fused()
    pads = {kernel_key(n): tuple(InputPad((1, C, SIDE + 2, SIDE + 2), ((0, 0), (0, 0), (1, 1), (1, 1)), 0.0,
                                          "float32") if r == "x" and i == 0 else None
                                 for i, r in enumerate(n.inputs)) for n in g.op_nodes}
    p = plan(g, pads, padded_inputs=True)
    assert not p.input_pads and any(isinstance(s, CopyStep) for s in p.steps)


def _read_both_ways():
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"]), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c1", "r0"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, SIDE, SIDE])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, SIDE, SIDE])],
                  {"w0": rng.standard_normal((C, 4, 1, 1)) * 0.3, "w1": rng.standard_normal((C, C, 3, 3)) * 0.2})


@needs_device
def test_a_value_read_through_a_window_and_as_it_is_is_held_once() -> None:
    model = _read_both_ways()
    g, _ = fuse_stage(import_model(model), Target.resolve(HW), "greedy")
    x = np.random.default_rng(8).standard_normal((1, 4, SIDE, SIDE)).astype(np.float32)
    want = evaluate(g, {"x": x})["y"]
    seen = []
    assert hold_padded(g, lambda e: read_pads(e, HW), 
                       lambda changes, nbytes: seen.append((changes, nbytes)) or True) == 1
    ((changes, nbytes),) = seen
    # the producer, and the reader that also reads the value as it is (the add, fused as conv2's epilogue)
    assert len(changes) == 2 and changes[0][1].output.shape == (1, C, SIDE + 2, SIDE + 2)
    assert nbytes == C * SIDE * SIDE * 4   # one padded read: one copy saved
    g.check()
    np.testing.assert_allclose(evaluate(g, {"x": x})["y"], want, rtol=1e-5, atol=1e-6)
    m = roller.compile_model(g, hw=HW)
    assert not [s for s in m.plan.steps if isinstance(s, CopyStep)]
    np.testing.assert_allclose(m.run({"x": x})["y"], _ort(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
