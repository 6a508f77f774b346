"""Integer and bool tensors on the device through the ONNX path: typed model inputs and outputs, the translations
of comparisons, logic, Where, Mod and Cast against onnxruntime, the executor's input checks, the fusion rules
for typed operators, and the ONNX backend that no longer folds token ids and masks into the model."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper

import roller
import roller.compiler.onnx_backend as backend
from roller.backends import get
from roller.errors import CheckError, InputError
from roller.frontends.onnx import import_model
from roller.ir.types import WEAK_INT, BodyTypes

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
T = TensorProto


def model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, list[int]]],
          outputs: dict[str, tuple[int, list[int]]], inits: dict[str, np.ndarray] | None = None,
          opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "typed", [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
                              [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
                              [numpy_helper.from_array(a, n) for n, a in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def onnxruntime(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    for name, w in want.items():
        assert got[name].dtype == w.dtype, (name, got[name].dtype, w.dtype)
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(got[name], w, rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(got[name], w)


INTS = np.array([[7, -7, 7, -7, 0, 5], [-9223372036854775807 - 1, 9223372036854775807, 3, -3, 13, -13]])
DIVS = np.array([[2, 2, -2, -2, 3, 7], [1, -1, 5, 5, -4, 4]])


@needs_device
@pytest.mark.parametrize("fmod", [0, 1])
def test_integer_arithmetic_and_mod_match_onnxruntime(fmod: int) -> None:
    """Add wraps at int64's ends, Div truncates toward zero, Mod takes the divisor's (fmod=0) or the dividend's
    (fmod=1) sign: exactly onnxruntime's results, int64 in and out."""
    m = model([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Div", ["a", "b"], ["q"]),
               helper.make_node("Mod", ["a", "b"], ["r"], fmod=fmod), helper.make_node("Mul", ["a", "one"], ["p"])],
              {"a": (T.INT64, [2, 6]), "b": (T.INT64, [2, 6])},
              {n: (T.INT64, [2, 6]) for n in "sqrp"}, {"one": np.array(3, np.int64)})
    cm = roller.compile_model(m, hw="pocl-cpu")
    feeds = {"a": INTS, "b": DIVS}
    assert_same(cm.run(feeds), onnxruntime(m, feeds))
    assert cm.on_device and cm.kernels


REALS = [0.0, -0.0, 0.0, -0.0, 5.5, -5.5, np.inf, 1.0, -1.0, np.nan, 7.0, -4.25, 6e4, -3.0e-3, 0.3, 2.0**-20]
REAL_DIVS = [3.0, 3.0, -3.0, -3.0, -2.0, 2.0, 2.0, np.inf, np.inf, 1.0, 0.0, -0.75, 7.0, 1e-3, 0.1, -2.0**-22]


@needs_device
@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize(("onnx_type", "np_type"), [(T.FLOAT, np.float32), (T.FLOAT16, np.float16),
                                                    (T.DOUBLE, np.float64)])
def test_floating_point_mod_is_numpys_bit_for_bit(fmod: int, onnx_type: int, np_type: type) -> None:
    """fmod=1 is C's fmod (the dividend's sign), fmod=0 numpy's mod (the divisor's sign, a zero with its sign):
    equal to numpy's in every bit but NaN's, signed zeros, infinities and a zero divisor included (the
    reference onnx.reference and the node tests use, whose comparisons do not see a zero's sign)."""
    n = len(REALS)
    m = model([helper.make_node("Mod", ["a", "b"], ["r"], fmod=fmod)], {"a": (onnx_type, [n]), "b": (onnx_type, [n])},
              {"r": (onnx_type, [n])})
    a, b = np.array(REALS, np_type), np.array(REAL_DIVS, np_type)
    got = roller.compile_model(m, hw="pocl-cpu").run({"a": a, "b": b})["r"]
    with np.errstate(invalid="ignore"):
        want = np.fmod(a, b) if fmod else np.mod(a, b)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    real = ~np.isnan(want)
    assert np.array_equal(got[real], want[real]) and np.array_equal(np.signbit(got[real]), np.signbit(want[real]))


@needs_device
def test_comparisons_logic_where_and_casts_match_onnxruntime() -> None:
    nodes = [helper.make_node("Less", ["x", "y"], ["lt"]), helper.make_node("Equal", ["i", "j"], ["eq"]),
             helper.make_node("GreaterOrEqual", ["i", "j"], ["ge"]), helper.make_node("And", ["lt", "eq"], ["both"]),
             helper.make_node("Xor", ["lt", "m"], ["either"]), helper.make_node("Not", ["m"], ["nm"]),
             helper.make_node("Where", ["m", "x", "y"], ["w"]), helper.make_node("IsNaN", ["x"], ["nan"]),
             helper.make_node("IsInf", ["x"], ["pinf"], detect_negative=0),
             helper.make_node("Cast", ["x"], ["xi"], to=T.INT32), helper.make_node("Cast", ["i"], ["i8"], to=T.INT8),
             helper.make_node("Cast", ["i"], ["ib"], to=T.BOOL), helper.make_node("Cast", ["m"], ["mf"], to=T.FLOAT)]
    shape = [3, 4]
    m = model(nodes, {"x": (T.FLOAT, shape), "y": (T.FLOAT, [4]), "i": (T.INT64, shape), "j": (T.INT64, [1, 4]),
                      "m": (T.BOOL, shape)},
              {"lt": (T.BOOL, shape), "eq": (T.BOOL, shape), "ge": (T.BOOL, shape), "both": (T.BOOL, shape),
               "either": (T.BOOL, shape), "nm": (T.BOOL, shape), "w": (T.FLOAT, shape), "nan": (T.BOOL, shape),
               "pinf": (T.BOOL, shape), "xi": (T.INT32, shape), "i8": (T.INT8, shape), "ib": (T.BOOL, shape),
               "mf": (T.FLOAT, shape)})
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 100).astype(np.float32)
    x[0, :3] = [np.inf, -np.inf, np.nan]
    feeds = {"x": x, "y": rng.standard_normal(4).astype(np.float32), "i": rng.integers(-300, 300, shape),
             "j": rng.integers(-3, 3, (1, 4)), "m": rng.integers(0, 2, shape).astype(bool)}
    feeds["i"][1] = feeds["j"][0]
    cm = roller.compile_model(m, hw="pocl-cpu")
    got, want = cm.run(feeds), onnxruntime(m, feeds)
    del want["xi"], got["xi"]   # onnxruntime's cast of inf and NaN to int32 is undefined; compared below
    assert_same(got, want)
    xi = cm.run(feeds)["xi"]
    np.testing.assert_array_equal(xi[0, :3], [2**31 - 1, -(2**31), 0])   # saturating, NaN to 0 (documented)
    np.testing.assert_array_equal(xi[1:], np.trunc(x[1:]).astype(np.int32))


@needs_device
def test_masked_scores_run_with_new_masks_without_compiling() -> None:
    """A bool mask selecting scores before a softmax: a run-time input (not folded), so a second call with
    another mask compiles nothing and still matches onnxruntime; the check compares a bool output exactly."""
    w = np.random.default_rng(2).standard_normal((8, 8)).astype(np.float32)
    m = model([helper.make_node("MatMul", ["x", "W"], ["s"]), helper.make_node("Where", ["mask", "s", "low"], ["t"]),
               helper.make_node("Softmax", ["t"], ["p"], axis=-1), helper.make_node("Not", ["mask"], ["hidden"])],
              {"x": (T.FLOAT, [4, 8]), "mask": (T.BOOL, [4, 8])},
              {"p": (T.FLOAT, [4, 8]), "hidden": (T.BOOL, [4, 8])},
              {"W": w, "low": np.array(-1e9, np.float32)})
    cm = roller.compile_model(m, hw="pocl-cpu")
    kernels = len(cm.kernels)
    for seed in range(2):
        rng = np.random.default_rng(seed)
        feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32), "mask": rng.integers(0, 2, (4, 8)).astype(bool)}
        assert_same(cm.run(feeds), onnxruntime(m, feeds))
        assert cm.check(feeds)["ok"]
    assert len(cm.kernels) == kernels
    assert "mask" in cm.input_names
    with pytest.raises(CheckError, match="'hidden' differs .* first at"):
        cm.check(feeds, outputs={**cm.run(feeds), "hidden": ~cm.run(feeds)["hidden"]})


@needs_device
def test_typed_inputs_are_checked() -> None:
    """A float array fed where int64 is declared, an int array for a bool, values outside int32: one line each,
    never a silent conversion."""
    m = model([helper.make_node("Cast", ["i"], ["f"], to=T.FLOAT), helper.make_node("Not", ["b"], ["nb"])],
              {"i": (T.INT32, [4]), "b": (T.BOOL, [4])}, {"f": (T.FLOAT, [4]), "nb": (T.BOOL, [4])})
    cm = roller.compile_model(m, hw="pocl-cpu")
    good = {"i": np.arange(4, dtype=np.int32), "b": np.ones(4, bool)}
    assert cm.run(good)["nb"].tolist() == [False] * 4
    assert cm.run({**good, "i": np.arange(4, dtype=np.int64)})["f"].tolist() == [0, 1, 2, 3]   # fits: converted
    with pytest.raises(InputError, match="input 'i' has dtype float32, the model takes int32"):
        cm.run({**good, "i": np.arange(4, dtype=np.float32)})
    with pytest.raises(InputError, match="input 'b' has dtype int64, the model takes bool"):
        cm.run({**good, "b": np.ones(4, np.int64)})
    with pytest.raises(InputError, match=r"input 'i' holds 4294967296, outside int32's range"):
        cm.run({**good, "i": np.array([0, 1, 2, 2**32])})


def test_typed_graph_values_and_constant_outputs() -> None:
    """Integer and bool inputs are graph inputs of their own types; a constant int64 output keeps its type and
    its rank (a scalar stays rank 0)."""
    m = model([helper.make_node("Equal", ["ids", "pad"], ["is_pad"]), helper.make_node("Size", ["ids"], ["n"])],
              {"ids": (T.INT64, [2, 5])}, {"is_pad": (T.BOOL, [2, 5]), "n": (T.INT64, [])},
              {"pad": np.array(0, np.int64)})
    g = import_model(m)
    assert g.values["ids"].dtype == "int64" and g.values["is_pad"].dtype == "bool"
    assert g.values["n"].shape == () and g.constants["n"].dtype == np.int64 and g.constants["n"].shape == ()
    expr = g.op_nodes[0].expr
    types = BodyTypes({t.name: t.dtype for t in expr.tensors})
    literal = expr.body.args[1]
    assert str(expr.body).startswith("eq(") and types.of(literal) == WEAK_INT   # an integer literal, not a float


def test_refusals_name_the_node() -> None:
    cast = model([helper.make_node("Cast", ["x"], ["z"], name="c", to=T.INT16)],
                 {"x": (T.INT64, [3])}, {"z": (T.INT16, [3])})
    with pytest.raises(InputError, match=r"node 'c' \(Cast\): a cast of a computed tensor to INT16"):
        import_model(cast)
    wide = model([helper.make_node("Neg", ["x"], ["z"])], {"x": (T.INT16, [3])}, {"z": (T.INT16, [3])})
    with pytest.raises(InputError, match="input 'x' has element type INT16; model inputs are float64, float32, .*bool"):
        import_model(wide)


def test_narrowing_and_typed_reductions_stay_apart_in_fusion() -> None:
    """An int64 sum stored as int32 is not inlined into its reader (inlining would skip the wrap), and no typed
    operator becomes an epilogue or a row kernel stage (those compute in float)."""
    from roller.graph.fusion import fuse

    m = model([helper.make_node("MatMul", ["x", "W"], ["s"]), helper.make_node("Where", ["mask", "s", "low"], ["t"]),
               helper.make_node("Softmax", ["t"], ["p"], axis=-1)],
              {"x": (T.FLOAT, [4, 8]), "mask": (T.BOOL, [4, 8])}, {"p": (T.FLOAT, [4, 8])},
              {"W": np.ones((8, 8), np.float32), "low": np.array(-1e9, np.float32)})
    fused, _ = fuse(import_model(m))
    for n in fused.op_nodes:
        assert not (n.expr.typed and (n.expr.epilogue is not None or n.expr.stages)), n.expr
    from roller.graph.fusion import _narrowing
    from roller.ir.build import build_expr

    wide = build_expr("narrow", "Y[i] = A[i] + B[i]", {"A": [4], "B": [4], "Y": [4]},
                      dtypes={"A": "int64", "B": "int64", "Y": "int32"})
    same = build_expr("same", "Y[i] = A[i] + B[i]", {"A": [4], "B": [4], "Y": [4]},
                      dtypes={"A": "int32", "B": "int32", "Y": "int32"})
    assert _narrowing(wide) and not _narrowing(same)


@needs_device
def test_onnx_backend_keeps_integer_inputs_and_folds_what_shapes_need() -> None:
    """Token ids stay inputs of one compiled model (no specialisation per value); an integer input that a Pad's
    pads are computed from is folded (the inputs behind the needed value), and the float data is not."""
    ids = model([helper.make_node("Equal", ["ids", "pad"], ["keep"]), helper.make_node("Cast", ["keep"], ["k"],
                                                                                         to=T.FLOAT)],
                {"ids": (T.INT64, [1, 6])}, {"k": (T.FLOAT, [1, 6])}, {"pad": np.array(0, np.int64)})
    rep = backend.prepare(ids, "CPU")
    for seed in range(2):
        x = np.random.default_rng(seed).integers(0, 3, (1, 6))
        np.testing.assert_array_equal(rep.run([x])[0], (x == 0).astype(np.float32))
    assert rep.specialised_inputs == [] and "ids" in rep.model.input_names
    pads = model([helper.make_node("Concat", ["zero", "n"], ["pads"], axis=0),
                  helper.make_node("Pad", ["x", "pads"], ["y"])],
                 {"x": (T.FLOAT, [3]), "n": (T.INT64, [1])}, {"y": (T.FLOAT, [None])},
                 {"zero": np.array([0], np.int64)})
    rep = backend.prepare(pads, "CPU")
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(rep.run([x, np.array([2])])[0], [0, 1, 2, 0, 0])
    assert rep.specialised_inputs == ["n"] and rep.model.input_names == ["x"]


@needs_device
@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_of_a_mask_and_of_floats_matches_onnxruntime(exclusive: int, reverse: int) -> None:
    """Position ids from an attention mask (``mask.cumsum(-1) - 1``, int64) and a float running sum."""
    m = model([helper.make_node("CumSum", ["mask", "axis"], ["pos"], exclusive=exclusive, reverse=reverse),
               helper.make_node("CumSum", ["x", "axis0"], ["run"], exclusive=exclusive, reverse=reverse)],
              {"mask": (T.INT64, [2, 9]), "x": (T.FLOAT, [5, 3])}, {"pos": (T.INT64, [2, 9]), "run": (T.FLOAT, [5, 3])},
              {"axis": np.array(-1, np.int64), "axis0": np.array(0, np.int32)})
    rng = np.random.default_rng(4)
    feeds = {"mask": rng.integers(0, 2, (2, 9)), "x": rng.standard_normal((5, 3)).astype(np.float32)}
    got, want = roller.compile_model(m, hw="pocl-cpu").run(feeds), onnxruntime(m, feeds)
    np.testing.assert_array_equal(got["pos"], want["pos"])
    np.testing.assert_allclose(got["run"], want["run"], rtol=1e-5, atol=1e-6)


@needs_device
def test_greedy_next_token_by_argmax() -> None:
    """ArgMax over logits with ties (the first index, or the last with select_last_index) and keepdims=0, as a
    greedy decoding loop takes the next token."""
    logits = np.array([[[0.5, 2.0, 2.0, -1.0], [3.0, 3.0, 0.0, 3.0]]], np.float32)
    m = model([helper.make_node("ArgMax", ["l"], ["first"], axis=-1, keepdims=0),
               helper.make_node("ArgMax", ["l"], ["last"], axis=-1, select_last_index=1),
               helper.make_node("ArgMin", ["l"], ["low"], axis=1)],
              {"l": (T.FLOAT, [1, 2, 4])}, {"first": (T.INT64, [1, 2]), "last": (T.INT64, [1, 2, 1]),
                                           "low": (T.INT64, [1, 1, 4])})
    assert_same(roller.compile_model(m, hw="pocl-cpu").run({"l": logits}), onnxruntime(m, {"l": logits}))


@needs_device
def test_gather_nd_and_gather_elements_match_onnxruntime() -> None:
    """GatherND with one index column after a batch axis (the last token's row of each sequence, as decoders
    pick the logits to sample from) and GatherElements along the last axis, negative indices included."""
    m = model([helper.make_node("GatherND", ["h", "last"], ["row"], batch_dims=1),
               helper.make_node("GatherElements", ["h", "pick"], ["el"], axis=2)],
              {"h": (T.FLOAT, [2, 5, 3]), "last": (T.INT64, [2, 1]), "pick": (T.INT64, [2, 5, 2])},
              {"row": (T.FLOAT, [2, 3]), "el": (T.FLOAT, [2, 5, 2])})
    rng = np.random.default_rng(6)
    feeds = {"h": rng.standard_normal((2, 5, 3)).astype(np.float32), "last": np.array([[4], [-2]]),
             "pick": rng.integers(-3, 3, (2, 5, 2))}
    assert_same(roller.compile_model(m, hw="pocl-cpu").run(feeds), onnxruntime(m, feeds))
