"""ScatterND/ScatterElements (a KV cache written at run-time positions), TopK and GatherND with several index
columns as device operators, against onnxruntime: every reduction, duplicate and negative indices, indices
outside the data (no write, or a clamped read: never an access outside a tensor), NaN in TopK's order, both of
TopK's strategies, and the refusals."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper
from onnx.reference import ReferenceEvaluator

import roller
from roller.errors import InputError
from roller.frontends.onnx import import_model, positions
from tests.frontends.test_onnx_typed import T, assert_same, model, needs_device, onnxruntime


def scatter(op: str, data: list[int], ind: list[int], upd: list[int], **attrs: object) -> onnx.ModelProto:
    return model([helper.make_node(op, ["d", "i", "u"], ["y"], name="s", **attrs)],
                 {"d": (T.FLOAT, data), "i": (T.INT64, ind), "u": (T.FLOAT, upd)}, {"y": (T.FLOAT, data)})


@needs_device
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_and_elements_match_onnxruntime(reduction: str) -> None:
    """Several index columns, negative and repeated indices (repeats combine by the reduction; onnxruntime
    leaves repeats under ``none`` undefined, so those cases have none)."""
    rng = np.random.default_rng(1)
    repeat = reduction != "none"
    cases = [
        (scatter("ScatterND", [4, 3, 5], [3, 2], [3, 5], reduction=reduction),
         np.array([[1, 2], [-1, 0], [1, 2] if repeat else [0, -3]])),
        (scatter("ScatterND", [4, 3], [2, 1], [2, 3], reduction=reduction), np.array([[3], [1 if repeat else 0]])),
        (scatter("ScatterElements", [3, 4], [2, 4], [2, 4], axis=0, reduction=reduction),
         np.array([[0, 2, -1, 1], [2 if repeat else 1, 0, 1, 2]])),
        (scatter("ScatterElements", [2, 6], [2, 3], [2, 3], axis=1, reduction=reduction),
         np.array([[5, -1, 0], [1, 3 if repeat else 2, 3]])),
    ]
    for m, ind in cases:
        shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in m.graph.input}
        feeds = {"d": rng.standard_normal(shapes["d"]).astype(np.float32), "i": ind,
                 "u": rng.standard_normal(shapes["u"]).astype(np.float32)}
        cm = roller.compile_model(m, hw="pocl-cpu")
        np.testing.assert_allclose(cm.run(feeds)["y"], onnxruntime(m, feeds)["y"], rtol=1e-6, atol=1e-6)
        assert cm.kernels


@needs_device
def test_kv_cache_written_at_a_run_time_position() -> None:
    """The cache update of a decoder step: the new key row written at the position the model is given
    (``ScatterND`` into ``[context, heads, dim]``), each position by the same kernels; a position outside the
    cache writes nothing (ONNX leaves it undefined; onnxruntime refuses it)."""
    m = model([helper.make_node("ScatterND", ["cache", "pos", "new"], ["out"])],
              {"cache": (T.FLOAT, [8, 2, 4]), "pos": (T.INT64, [1, 1]), "new": (T.FLOAT, [1, 2, 4])},
              {"out": (T.FLOAT, [8, 2, 4])})
    cm = roller.compile_model(m, hw="pocl-cpu")
    rng = np.random.default_rng(2)
    cache = rng.standard_normal((8, 2, 4)).astype(np.float32)
    new = rng.standard_normal((1, 2, 4)).astype(np.float32)
    kernels = list(cm.kernels)
    for p in (0, 5, -1):
        feeds = {"cache": cache, "pos": np.array([[p]]), "new": new}
        np.testing.assert_array_equal(cm.run(feeds)["out"], onnxruntime(m, feeds)["out"])
    assert cm.kernels == kernels
    np.testing.assert_array_equal(cm.run({"cache": cache, "pos": np.array([[8]]), "new": new})["out"], cache)


def top_k(shape: list[int], k: int, dtype: int = T.FLOAT, **attrs: object) -> onnx.ModelProto:
    axis = int(attrs.get("axis", -1))   # type: ignore[call-overload]
    out = list(shape)
    out[axis] = k
    return model([helper.make_node("TopK", ["x", "k"], ["v", "i"], name="t", **attrs)], {"x": (dtype, shape)},
                 {"v": (dtype, out), "i": (T.INT64, out)}, {"k": np.array([k], np.int64)})


NAN_ROWS = np.array([[1, np.nan, 3, np.nan, -np.inf, 2, 3], [np.nan, -np.inf, 0, 1, np.nan, -np.inf, np.inf]],
                    np.float32)


@needs_device
@pytest.mark.parametrize("picks", [False, True], ids=["ranks", "picks"])
@pytest.mark.parametrize("largest", [1, 0])
def test_top_k_orders_ties_and_nan_as_onnx_reference(monkeypatch: pytest.MonkeyPatch, picks: bool,
                                                    largest: int) -> None:
    """Equal values by index, NaN above every number (onnx.reference's sort; onnxruntime leaves NaN
    unordered), k up to the axis size; the same answers from ranking every element and from picking k."""
    if picks:
        monkeypatch.setattr(positions, "RANK_ALL_UP_TO", 2)
    rng = np.random.default_rng(3)
    cases = [(top_k([2, 7], 7, largest=largest), NAN_ROWS), (top_k([2, 7], 3, largest=largest), NAN_ROWS),
             (top_k([3, 5, 4], 2, axis=1, largest=largest), rng.integers(0, 3, (3, 5, 4)).astype(np.float32)),
             (top_k([3, 6], 4, T.INT32, largest=largest), rng.integers(-2, 2, (3, 6)).astype(np.int32)),
             (top_k([2, 5], 5, T.INT64, axis=-1, largest=largest), np.array([[2**62, -2**63, 0, 2**62, 5]] * 2))]
    for m, x in cases:
        cm = roller.compile_model(m, hw="pocl-cpu")
        got, (v, i) = cm.run({"x": x}), ReferenceEvaluator(m).run(None, {"x": x})
        np.testing.assert_array_equal(got["i"], i)
        np.testing.assert_array_equal(got["v"], v)
        assert got["v"].dtype == x.dtype


@needs_device
def test_top_k_of_a_vocabulary_picks_and_matches_onnxruntime() -> None:
    """The top 5 of GPT-2's 50257 logits: picked one after another (a few O(n) reductions each), not ranked
    (n^2 comparisons), the same as onnxruntime's."""
    m = top_k([1, 50257], 5)
    cm = roller.compile_model(m, hw="pocl-cpu")
    assert len(cm.kernels) > 5   # the picks, not the three ranking operators
    x = np.random.default_rng(5).standard_normal((1, 50257)).astype(np.float32)
    assert_same(cm.run({"x": x}), onnxruntime(m, {"x": x}))


@needs_device
def test_gather_nd_with_several_columns_clamps_each() -> None:
    """GatherND through two index columns after a batch axis matches onnxruntime; a column outside its axis
    reads the nearest end of that axis (not the next row, as one index into the flattened axes would)."""
    m = model([helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1)],
              {"x": (T.FLOAT, [2, 3, 4, 5]), "i": (T.INT64, [2, 3, 2])}, {"y": (T.FLOAT, [2, 3, 5])})
    cm = roller.compile_model(m, hw="pocl-cpu")
    x = np.random.default_rng(6).standard_normal((2, 3, 4, 5)).astype(np.float32)
    ind = np.array([[[0, 0], [2, -1], [-3, 2]], [[1, 3], [0, 1], [2, 2]]])
    assert_same(cm.run({"x": x, "i": ind}), onnxruntime(m, {"x": x, "i": ind}))
    bad = np.array([[[0, 9], [2, -1], [5, 0]], [[1, 3], [0, 1], [2, 2]]])
    got = cm.run({"x": x, "i": bad})["y"]
    np.testing.assert_array_equal(got[0, 0], x[0, 0, 3])   # column 1 clamped to 3, not row 1's start
    np.testing.assert_array_equal(got[0, 2], x[0, 2, 0])


def test_refusals_name_the_node() -> None:
    cases = [
        (scatter("ScatterND", [4, 3], [2, 1], [2, 4]), r"node 's' \(ScatterND\): indices \[2, 1\] and updates"),
        (scatter("ScatterElements", [3, 4], [2, 3], [2, 3], axis=0), r"must have one shape, the data's \[3, 4\] off"),
        (scatter("ScatterND", [80, 3], [65, 1], [65, 3], reduction="mul"), r"reduction 'mul' over 65 update rows"),
        (scatter("ScatterND", [4, 3], [2, 1], [2, 3], reduction="avg"), r"reduction 'avg' \(one of none, add"),
        (top_k([2, 5], 6), r"node 't' \(TopK\): K \[6\] must be one value from 1 to the axis size 5"),
    ]
    for m, message in cases:
        with pytest.raises(InputError, match=message):
            import_model(m)
