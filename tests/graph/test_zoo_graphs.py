"""The small test graphs of tests/support/zoo_graphs.py: valid ONNX, shapes as declared, deterministic, runnable in
onnxruntime with finite outputs, and computing what their docstrings say they compute."""
from __future__ import annotations

import copy
from types import ModuleType

import numpy as np
import onnx
import pytest

from tests.support.zoo_graphs import ALL, Graph

# graphs whose output shape onnx's own shape inference cannot work out (it does not propagate values through
# Slice bounds computed from a Shape): an importer has to fold the shape arithmetic itself to get them
INFERENCE_STOPS = {"chunk_slices"}


def _ort() -> ModuleType:
    return pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (it is in the dev extra)")


def _run(graph: Graph) -> dict[str, np.ndarray]:
    ort = _ort()
    model, inputs = graph
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, inputs)))


def _declared(model: onnx.ModelProto) -> dict[str, list[int]]:
    return {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}


@pytest.mark.parametrize("name", ALL)
def test_graph_is_valid_onnx_with_the_declared_shapes(name: str) -> None:
    model, inputs = ALL[name]()
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 17
    assert [i.name for i in model.graph.input] == list(inputs)
    # infer the output shapes afresh (declared ones removed) and compare: the declarations are not echoed back
    bare = copy.deepcopy(model)
    for out in bare.graph.output:
        out.type.tensor_type.ClearField("shape")
    inferred = _declared(onnx.shape_inference.infer_shapes(bare, check_type=True, strict_mode=True,
                                                           data_prop=True))
    declared = _declared(model)
    assert all(all(d > 0 for d in dims) for dims in declared.values())
    if name in INFERENCE_STOPS:
        # the same rank, and whatever dims onnx could work out agree
        assert {k: len(v) for k, v in inferred.items()} == {k: len(v) for k, v in declared.items()}
        assert all(i in (0, d) for k in declared for i, d in zip(inferred[k], declared[k]))
    else:
        assert inferred == declared


@pytest.mark.parametrize("name", ALL)
def test_graph_is_the_same_on_every_call(name: str) -> None:
    (m1, in1), (m2, in2) = ALL[name](), ALL[name]()
    assert m1.SerializeToString() == m2.SerializeToString()
    assert in1.keys() == in2.keys() and all(np.array_equal(in1[k], in2[k]) for k in in1)


@pytest.mark.parametrize("name", ALL)
def test_graph_runs_in_onnxruntime_with_finite_outputs(name: str) -> None:
    graph = ALL[name]()
    outs = _run(graph)
    assert {k: list(v.shape) for k, v in outs.items()} == _declared(graph[0])
    for k, v in outs.items():
        assert v.dtype == np.float32 and np.all(np.isfinite(v)), k
        assert np.std(v) > 0, f"{k} is constant: the graph computes nothing worth testing"


# -- the graphs compute what they say ----------------------------------------------------------------------

def test_shape_arithmetic_is_a_flatten_times_three_plus_half() -> None:
    graph = ALL["shape_arithmetic"]()
    x = graph[1]["x"]
    np.testing.assert_allclose(_run(graph)["y"], x.reshape(2, -1) * 3 + 0.5, rtol=1e-6)


def test_classifier_head_gives_probabilities() -> None:
    y = _run(ALL["classifier_head"]())["y"]
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)
    assert np.all(y > 0)


def test_pooling_variants_differ_where_they_should() -> None:
    out = _run(ALL["pooling_zoo"]())
    # ceil_mode adds a last row and column; the first 7x7 are the same windows
    np.testing.assert_array_equal(out["max_ceil"][..., :7, :7], out["max_floor"])
    inc, exc = out["avg_include_pad"], out["avg_exclude_pad"]
    np.testing.assert_allclose(inc[..., 1:, 1:], exc[..., 1:, 1:], rtol=1e-5)   # windows inside the input
    # a corner window covers 4 real pixels of 9: counting the padding divides by 9 instead of 4
    np.testing.assert_allclose(inc[..., 0, 0], exc[..., 0, 0] * 4 / 9, rtol=1e-5)


def test_channel_shuffle_interleaves_the_halves() -> None:
    graph = ALL["channel_shuffle"]()
    x, y = graph[1]["x"], _run(graph)["y"]
    np.testing.assert_array_equal(y[:, 0::2], x[:, :8])   # the untouched half goes to the even channels
    assert np.all(y[:, 1::2] >= 0)                        # the Relu'd half to the odd ones


def test_chunk_slices_swaps_the_halves() -> None:
    graph = ALL["chunk_slices"]()
    x = graph[1]["x"]
    np.testing.assert_array_equal(_run(graph)["y"], np.concatenate([x[:, 3:], x[:, :3]], axis=1))


def test_layernorm_decomposed_normalises_the_last_axis() -> None:
    model, inputs = ALL["layernorm_decomposed"]()
    x = inputs["x"]
    gamma, beta = (onnx.numpy_helper.to_array(t) for t in model.graph.initializer[-2:])
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12) * gamma + beta
    np.testing.assert_allclose(_run((model, inputs))["y"], want, rtol=1e-4, atol=1e-5)


def test_attention_mask_silences_the_padded_tokens() -> None:
    model, inputs = ALL["attention_block"]()
    y = _run((model, inputs))["y"]
    changed = {**inputs, "x": inputs["x"].copy()}
    changed["x"][:, -1] += 1.0   # a masked token: only its own row may change
    y2 = _run((model, changed))["y"]
    np.testing.assert_allclose(y2[:, :-1], y[:, :-1], rtol=1e-4, atol=1e-5)
    assert not np.allclose(y2[:, -1], y[:, -1])
