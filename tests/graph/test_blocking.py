"""Activations stored with their channels in blocks (roller.ir.block, roller.graph.blocking): the split of one
operator against numpy, the graph pass against the graph it rewrote, and a model on PoCL against onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import roller
from roller.backends import get
from roller.compiler.model import block_stage, fuse_stage
from roller.compiler.target import Target
from roller.construction import channel_lanes
from roller.frontends.onnx import import_model
from roller.graph import Graph
from roller.graph.blocking import block_channels
from roller.graph.ir import ViewNode
from roller.graph.reference import evaluate
from roller.ir import load_op
from roller.ir.block import block_array, blockable, blocked_dim, split_axis, split_names, unblock_array
from roller.ir.tensor_expr import TensorExpr
from tests.compiler.test_models import _model, _ort

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
HW = roller.hw.load("pocl-cpu")
LANES = 16


def _op(expr: str, shapes: dict[str, list[int]]) -> TensorExpr:
    return load_op({"expr": expr, "shapes": shapes, "pad_value": 0})


def _split_matches(op: TensorExpr, axis: str, blocked: list[str]) -> TensorExpr:
    """``op`` split, checked against ``op`` itself on random inputs stored blocked."""
    rng = np.random.default_rng(0)
    inputs = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in op.inputs}
    want = roller.reference(op, inputs)
    split = split_axis(op, axis, LANES, blocked)
    dims = {name: blocked_dim(op, name, axis) for name in blocked}
    got = roller.reference(split, {k: block_array(v, dims[k], LANES) if k in dims else v   # type: ignore[arg-type]
                                   for k, v in inputs.items()})
    out = op.output.name
    if out in dims:
        assert got.shape == split.output.shape
        got = unblock_array(got, dims[out])   # type: ignore[arg-type]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return split


def test_a_depthwise_convolution_split_computes_the_same() -> None:
    op = _op("Y[n,c,h,w] += X[n,c,h+r-1,w+s-1] * W[c,r,s]", {"X": [1, 32, 7, 7], "W": [32, 3, 3], "Y": [1, 32, 7, 7]})
    split = _split_matches(op, "c", ["X", "W", "Y"])
    assert split.statement() == "Y[n,co,h,w,ci] += X[n,co,h+r-1,w+s-1,ci] * W[co,r,s,ci]"
    assert [a.name for a in split.spatial_axes] == ["n", "co", "h", "w", "ci"]   # the lanes innermost


def test_a_reduction_over_blocked_channels_and_a_plain_input_read_across_blocks() -> None:
    op = _op("Y[n,f,p] += X[n,c,p] * W[f,c]", {"X": [1, 48, 5], "W": [32, 48], "Y": [1, 32, 5]})
    split = _split_matches(op, "c", ["X"])   # W stays as it is: read at 16*co+ci
    assert "W[f,16*co+ci]" in split.statement() and split.reduce_axes[-1].name == "ci"
    _split_matches(op, "c", ["X", "W"])
    _split_matches(op, "f", ["Y", "W"])


def test_two_axes_split_in_turn_compute_the_same() -> None:
    """A 1x1 convolution between two blocked images, as the graph pass splits it: the reduction, then the
    output channels, the weight blocked along both with the output's lanes innermost."""
    op = _op("Y[n,f,p] += X[n,c,p] * W[f,c]", {"X": [1, 48, 5], "W": [32, 48], "Y": [1, 32, 5]})
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 48, 5)).astype(np.float32), rng.standard_normal((32, 48)).astype(np.float32)
    both = split_axis(split_axis(op, "c", LANES, ["X", "W"]), "f", LANES, ["Y", "W"])
    assert both.statement() == "Y[n,fo,p,fi] += X[n,co,p,ci] * W[fo,co,ci,fi]"
    wb = block_array(block_array(w, 1, LANES), 0, LANES)
    got = roller.reference(both, {"X": block_array(x, 1, LANES), "W": wb})
    np.testing.assert_allclose(unblock_array(got, 1), roller.reference(op, {"X": x, "W": w}), rtol=1e-5, atol=1e-5)


def test_split_axes_get_names_generated_source_may_use() -> None:
    op = _op("Y[n,d,p] += X[n,d,p,k] * W[d,k]", {"X": [1, 32, 5, 3], "W": [32, 3], "Y": [1, 32, 5]})
    assert split_names(op, "d") == ("do1", "di1")   # "do" is a keyword in every target language
    _split_matches(op, "d", ["X", "Y", "W"])


def test_what_cannot_be_split_is_said() -> None:
    op = _op("Y[n,c,h,w] += X[n,c,h+r-1,w+s-1] * W[c,r,s]", {"X": [1, 24, 7, 7], "W": [24, 3, 3], "Y": [1, 24, 7, 7]})
    assert not blockable(op, "c", LANES)                 # 24 channels
    assert blockable(op, "c", 8)
    assert blocked_dim(op, "X", "h") is None             # h also appears in h+r-1 (a window)
    row = _op("M[r] max= X[r,c]; S[r] += exp(X[r,c] - M[r]); Y[r,c] = exp(X[r,c] - M[r]) / S[r]",
              {"X": [32, 32], "Y": [32, 32]})
    assert row.stages and not any(blockable(row, a.name, LANES) for a in row.axes)   # read by the stages' index


def _mobile_block(c: int = 16, expand: int = 4, side: int = 7) -> object:
    """MobileNetV2's inverted residual: expand 1x1 + ReLU6, depthwise 3x3 + ReLU6, project 1x1, residual add;
    then a squeeze-and-excitation's global pool through a Squeeze and an Unsqueeze (views)."""
    rng = np.random.default_rng(0)
    e = c * expand
    inits = {"w1": rng.standard_normal((e, c, 1, 1)) * 0.3, "b1": rng.standard_normal(e) * 0.1,
             "w2": rng.standard_normal((e, 1, 3, 3)) * 0.3, "b2": rng.standard_normal(e) * 0.1,
             "w3": rng.standard_normal((c, e, 1, 1)) * 0.2, "lo": np.array(0.0), "hi": np.array(6.0),
             "axes": np.array([2, 3])}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["e1"]),
             helper.make_node("Clip", ["e1", "lo", "hi"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["d1"], group=e, pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["d1", "lo", "hi"], ["r2"]),
             helper.make_node("ReduceMean", ["r2"], ["m"], axes=[2, 3], keepdims=0),
             helper.make_node("Unsqueeze", ["m", "axes"], ["m4"]),
             helper.make_node("Mul", ["r2", "m4"], ["se"]),
             helper.make_node("Conv", ["se", "w3"], ["p1"]),
             helper.make_node("Add", ["p1", "x"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, side, side])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, side, side])], inits, opset=17)
    for init in model.graph.initializer:
        if init.name == "axes":
            init.data_type = TensorProto.INT64
            init.raw_data = np.array([2, 3], np.int64).tobytes()
    return model


def _fused(model: object) -> Graph:
    g, _ = fuse_stage(import_model(model), Target.resolve(HW), "greedy")
    return g


def _x(c: int = 16, side: int = 7) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((1, c, side, side)).astype(np.float32)


def test_the_pass_blocks_the_images_around_a_depthwise_convolution_and_computes_the_same() -> None:
    g = _fused(_mobile_block())
    want = evaluate(g, {"x": _x()})["y"]
    asked: list[int] = []
    assert block_channels(g, LANES, lambda changes: asked.append(len(changes)) or True) == 1
    g.check()
    blocked = {k: v.shape for k, v in g.values.items() if k.endswith(f".c{LANES}")}
    # the expanded images (64 channels) and the pooled vector, through the views, are blocked; the graph's own
    # input and output (16 channels, read and written by the user) are not
    assert blocked and all(s[-1] == LANES for s in blocked.values())
    assert g.values["x"].shape == (1, 16, 7, 7) and g.values["y"].shape == (1, 16, 7, 7)
    assert any(isinstance(n, ViewNode) and n.input.endswith(f".c{LANES}") for n in g.nodes)
    assert asked and asked[0] >= 4
    np.testing.assert_allclose(evaluate(g, {"x": _x()})["y"], want, rtol=1e-4, atol=1e-4)


def test_a_group_the_model_turns_down_is_left_alone() -> None:
    g = _fused(_mobile_block())
    before = [n.expr.content_hash() for n in g.op_nodes]
    asked: list[int] = []
    assert block_channels(g, LANES, lambda changes: asked.append(len(changes)) and False) == 0
    # asked once: what the depthwise convolution's images force (the pool, through the views, and the scaling
    # that reads it) is all there is to reach, the graph's input and output staying as they are
    assert len(asked) == 1
    assert [n.expr.content_hash() for n in g.op_nodes] == before


def _chain() -> object:
    """expand 1x1 (16 -> 32), depthwise 3x3, 1x1 (32 -> 32), 1x1 (32 -> 16): the third's output is an image
    the depthwise convolution's group may reach, not one it must."""
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((32, 16, 1, 1)) * 0.3, "w2": rng.standard_normal((32, 1, 3, 3)) * 0.3,
             "w3": rng.standard_normal((32, 32, 1, 1)) * 0.2, "w4": rng.standard_normal((16, 32, 1, 1)) * 0.2}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["e"]),
             helper.make_node("Conv", ["e", "w2"], ["d"], group=32, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["d", "w3"], ["p"]),
             helper.make_node("Conv", ["p", "w4"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 7, 7])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 7, 7])], inits)


def test_a_group_turned_down_as_far_as_it_reaches_is_tried_as_the_window_s_own_images() -> None:
    g = _fused(_chain())
    want = evaluate(g, {"x": _x()})["y"]
    asked: list[int] = []
    assert block_channels(g, LANES, lambda changes: asked.append(len(changes)) or len(changes) <= 3) == 1
    assert asked == [4, 3]   # expand, depthwise and both 1x1 convolutions after it; then without the last
    assert {k for k in g.values if k.endswith(f".c{LANES}")} == {f"e.c{LANES}", f"d.c{LANES}"}
    np.testing.assert_allclose(evaluate(g, {"x": _x()})["y"], want, rtol=1e-4, atol=1e-4)


def test_channels_that_the_lanes_do_not_divide_stay_as_they_are() -> None:
    g = _fused(_mobile_block(c=12, expand=2))   # 24 channels around the depthwise convolution
    assert block_channels(g, LANES, lambda changes: True) == 0


def test_only_descriptions_whose_kernels_read_through_a_cache_block_channels(monkeypatch: pytest.MonkeyPatch
                                                                              ) -> None:
    assert channel_lanes(HW) == LANES and channel_lanes(roller.hw.load("h100")) == 0
    g = _fused(_mobile_block())
    assert block_stage(g, Target.resolve("h100")) is g
    monkeypatch.setenv("ROLLER_BLOCK_CHANNELS", "0")
    assert block_stage(g, Target.resolve(HW)) is g
    monkeypatch.setenv("ROLLER_BLOCK_CHANNELS", "1")
    assert block_stage(g, Target.resolve(HW)) is not g   # the model takes it: depthwise 3x3 over 7x7


@needs_device
def test_a_blocked_model_runs_on_pocl_as_onnxruntime_does() -> None:
    model = _mobile_block()
    m = roller.compile_model(model, hw=HW, progress=False)
    assert any(v.endswith(f".c{LANES}") for v in m.stages.blocked.values)
    feeds = {"x": _x()}
    (want,) = _ort(model, feeds)
    np.testing.assert_allclose(m.run(feeds)["y"], want, rtol=1e-4, atol=1e-4)
