"""roller.reference (the numpy evaluator every backend is checked against) against separately written numpy.

The named ops are compared with tests/support/independent.py (written from docs/opjson.md without importing roller);
generic expressions with explicit loops and np.einsum written here.
"""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

import roller
from roller.errors import InputError
from roller.ir import parse_ops
from roller.ir.fuse import prepare
from tests.support.independent import independent_eval, make_inputs

REPO = Path(__file__).resolve().parents[2]
SCALED = REPO / "bench" / "suites" / "scaled.json"
EXAMPLES = REPO / "examples"


def _scaled_ops() -> list[dict]:
    if not SCALED.exists():
        return []
    return json.loads(SCALED.read_text())["ops"]


def _close(got, want, tol=1e-4):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    assert np.allclose(got, want, rtol=tol, atol=tol, equal_nan=False), float(np.max(np.abs(got - want)))


# ---- the scaled suite -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", _scaled_ops(), ids=[o["name"] for o in _scaled_ops()])
def test_scaled_suite_matches_independent(op):
    inputs = make_inputs(op, seed=3)
    got = roller.reference(op, inputs)
    want = independent_eval(op, inputs)
    assert got.dtype == np.float32
    _close(got, want)
    # Inputs by position (right-hand-side order) give the same answer.
    expr = roller.load_op(op)
    assert np.array_equal(roller.reference(op, [inputs[t.name] for t in expr.inputs]), got)


def test_scaled_suite_exists_and_covers_every_kind():
    if not SCALED.exists():
        pytest.skip("bench/suites/scaled.json is not there yet")
    kinds = {o["op"] for o in _scaled_ops()}
    assert {"matmul", "batch_matmul", "conv2d", "depthwise_conv2d", "avgpool2d", "maxpool2d", "reduce",
            "elementwise", "transpose"} <= kinds


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.stem)
def test_examples_match_independent(path):
    doc = json.loads(path.read_text())
    for op in doc["ops"] if "ops" in doc else [doc]:
        if "op" not in op:
            continue  # generic examples are covered below
        inputs = make_inputs(op, seed=1)
        _close(roller.reference(op, inputs), independent_eval(op, inputs))


# ---- every named kind, small, including the corners the scaled suite may not have --------------------------

NAMED = [
    {"op": "matmul", "M": 5, "N": 3, "K": 4},
    {"op": "matmul", "M": 5, "N": 3, "K": 4, "transpose_a": True, "transpose_b": True},
    {"op": "batch_matmul", "B": 2, "M": 3, "N": 4, "K": 5, "transpose_a": True},
    {"op": "conv2d", "N": 2, "C": 3, "H": 7, "W": 6, "F": 4, "KH": 3, "KW": 2, "stride": 2, "padding": "SAME",
     "dilation": 2},
    {"op": "conv2d", "N": 1, "C": 2, "H": 6, "W": 6, "F": 3, "KH": 3, "KW": 3, "padding": 1, "layout": "NHWC"},
    {"op": "conv2d", "N": 1, "C": 2, "H": 9, "W": 8, "F": 3, "KH": 4, "KW": 4, "stride": 3, "padding": "VALID"},
    {"op": "depthwise_conv2d", "N": 1, "C": 3, "H": 7, "W": 7, "KH": 3, "KW": 3, "stride": 2},
    {"op": "depthwise_conv2d", "N": 2, "C": 2, "H": 5, "W": 5, "KH": 3, "KW": 3, "layout": "NHWC"},
    {"op": "avgpool2d", "N": 1, "C": 2, "H": 7, "W": 7, "K": 3, "stride": 2, "padding": "SAME"},
    {"op": "maxpool2d", "N": 2, "C": 2, "H": 7, "W": 7, "K": 3, "stride": 2, "padding": "SAME"},
    {"op": "maxpool2d", "N": 1, "C": 1, "H": 6, "W": 6, "K": 2},
    {"op": "reduce", "kind": "sum", "shape": [3, 4, 5], "axes": [1]},
    {"op": "reduce", "kind": "mean", "shape": [3, 4, 5], "axes": [0, 2]},
    {"op": "reduce", "kind": "max", "shape": [3, 4, 5], "axes": [-1]},
    {"op": "reduce", "kind": "min", "shape": [3, 4, 5], "axes": [0, 1, 2]},
    {"op": "transpose", "shape": [2, 3, 4], "perm": [2, 0, 1]},
    {"op": "elementwise", "fn": "sub", "shapes": {"A": [2, 3, 4], "B": [3, 1]}},
    {"op": "elementwise", "fn": "div", "shapes": {"A": [4, 1], "B": [1, 5]}},
    {"op": "elementwise", "fn": "max", "shapes": {"A": [6], "B": [6]}},
    {"op": "elementwise", "fn": "min", "shapes": {"A": [6], "B": [1]}},
    {"op": "elementwise", "fn": "mul", "shapes": {"A": [3, 1], "B": [3, 4]}, "dtype": "float16"},
] + [{"op": "elementwise", "fn": fn, "shapes": {"X": [3, 5]}}
     for fn in ("relu", "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "neg", "cos", "sin", "round")]


@pytest.mark.parametrize("op", NAMED, ids=lambda o: f"{o['op']}-{o.get('fn', o.get('kind', ''))}")
def test_named_kinds_match_independent(op):
    inputs = make_inputs(op, seed=7)
    got = roller.reference(op, inputs)
    want = independent_eval(op, inputs)
    tol = 2e-3 if op.get("dtype") == "float16" else 1e-4
    assert got.dtype == (np.float16 if op.get("dtype") == "float16" else np.float32)
    _close(got.astype(np.float64), want.astype(np.float64), tol)


def test_matmul_against_plain_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    _close(roller.reference({"op": "matmul", "M": 6, "N": 5, "K": 4}, {"A": a, "B": b}), a @ b)
    _close(roller.reference({"op": "matmul", "M": 6, "N": 5, "K": 4, "transpose_a": True},
                            {"A": a.T.copy(), "B": b}), a @ b)


# ---- generic expressions against hand-written loops ------------------------------------------------------------

def _loops(op_obj, inputs, point_value, reduce="sum", init=0.0):
    """Y[spatial] = reduce over reduction axes of point_value(env), by brute force."""
    (op,) = parse_ops(op_obj, None)
    out = np.full(op.output.shape, init, dtype=np.float64)
    fn = {"sum": lambda a, b: a + b, "max": max, "min": min, None: lambda a, b: b}[reduce]
    names = [a.name for a in op.axes]
    for point in itertools.product(*[range(a.extent) for a in op.axes]):
        env = dict(zip(names, point))
        o = tuple(env[a.name] for a in op.spatial_axes)
        out[o] = fn(out[o], point_value(env))
    return out


def _get(x, *idx, pad=0.0):
    if all(0 <= i < s for i, s in zip(idx, x.shape)):
        return float(x[idx])
    return pad


def test_generic_maxpool_with_minus_inf_padding():
    op = {"expr": "Y[n,c,h,w] max= X[n,c,2*h+r-1,2*w+s-1]", "shapes": {"X": [1, 2, 7, 7], "Y": [1, 2, 4, 4]},
          "extents": {"r": 3, "s": 3}, "pad_value": "-inf"}
    rng = np.random.default_rng(0)
    x = (-np.abs(rng.standard_normal((1, 2, 7, 7))) - 1).astype(np.float32)  # all negative: a 0 pad would win
    got = roller.reference(op, {"X": x})
    want = _loops(op, {"X": x}, lambda e: _get(x, e["n"], e["c"], 2 * e["h"] + e["r"] - 1, 2 * e["w"] + e["s"] - 1,
                                               pad=-np.inf), "max", -np.inf)
    _close(got, want)
    assert np.all(got < 0)
    # With pad 0 instead, the corner windows see the padding.
    got0 = roller.reference({**op, "pad_value": 0}, {"X": x})
    assert got0[0, 0, 0, 0] == 0.0 and np.all(got0[:, :, 1:-1, 1:-1] == got[:, :, 1:-1, 1:-1])


def test_generic_min_with_inf_padding():
    op = {"expr": "Y[i] min= X[i+r-2]", "shapes": {"X": [6], "Y": [6]}, "extents": {"r": 5}, "pad_value": "inf"}
    x = np.arange(6, dtype=np.float32) + 10
    got = roller.reference(op, {"X": x})
    want = [min(x[max(i - 2, 0):i + 3]) for i in range(6)]
    _close(got, want)


def test_generic_padded_conv():
    op = {"expr": "Y[n,f,h,w] += X[n,c,h+r-1,w+s-1] * W[f,c,r,s]",
          "shapes": {"X": [2, 3, 5, 6], "W": [4, 3, 3, 3], "Y": [2, 4, 5, 6]}}
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 3, 5, 6)), rng.standard_normal((4, 3, 3, 3))
    got = roller.reference(op, {"X": x.astype(np.float32), "W": w.astype(np.float32)})
    xp = np.pad(x.astype(np.float32).astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((2, 4, 5, 6))
    for r, s in itertools.product(range(3), range(3)):
        want += np.einsum("nchw,fc->nfhw", xp[:, :, r:r + 5, s:s + 6], w.astype(np.float32)[:, :, r, s])
    _close(got, want)


def test_generic_flipped_correlation():
    op = {"expr": "Y[i] += X[i-k+4] * K[k]", "shapes": {"X": [12], "K": [5], "Y": [8]}}
    x, k = np.arange(12, dtype=np.float32), np.array([1, 2, 3, 4, 5], dtype=np.float32)
    want = np.convolve(x, k, mode="full")[4:12]
    _close(roller.reference(op, {"X": x, "K": k}), want)


def test_generic_functions_and_arithmetic():
    op = {"expr": "Y[i,j] = max(relu(X[i,j]), -abs(Z[j])) * sigmoid(tanh(X[i,j])) + erf(sqrt(abs(X[i,j]))) "
                  "- log(exp(Z[j]) + 1.0) / 2.5 - -X[i,j]",
          "shapes": {"X": [3, 4], "Z": [4]}}
    rng = np.random.default_rng(4)
    x, z = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    xd, zd = x.astype(np.float64), z.astype(np.float64)
    erf = np.vectorize(math.erf)
    want = (np.maximum(np.maximum(xd, 0), -np.abs(zd)) * (1 / (1 + np.exp(-np.tanh(xd))))
            + erf(np.sqrt(np.abs(xd))) - np.log(np.exp(zd) + 1.0) / 2.5 + xd)
    _close(roller.reference(op, {"X": x, "Z": z}), want)


def test_generic_rsqrt_and_division():
    op = {"expr": "Y[i] = rsqrt(X[i]) / (X[i] * 2.0)", "shapes": {"X": [5]}}
    x = np.array([1, 2, 4, 8, 16], dtype=np.float32)
    _close(roller.reference(op, {"X": x}), 1 / np.sqrt(x) / (2 * x))


def test_generic_non_product_reduction():
    # Not a product of reads: the evaluator's general path, against einsum-free numpy.
    op = {"expr": "Y[i] += exp(X[i,k]) - W[k]", "shapes": {"X": [4, 6], "W": [6]}}
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    _close(roller.reference(op, {"X": x, "W": w}), np.exp(x.astype(np.float64)).sum(1) - w.sum())


def test_generic_scaled_product_uses_constants():
    op = {"expr": "C[m,n] += A[m,k] * 0.5 * B[k,n] / 4.0", "shapes": {"A": [3, 2], "B": [2, 5]}}
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal((2, 5)).astype(np.float32)
    _close(roller.reference(op, {"A": a, "B": b}), a.astype(np.float64) @ b / 8.0)


def test_generic_repeated_axis_diagonal():
    op = {"expr": "Y[i] = X[i,i]", "shapes": {"X": [4, 4]}}
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    _close(roller.reference(op, {"X": x}), np.diag(x))


def test_generic_scalar_output():
    op = {"expr": "Y[] += X[i,j] * X[i,j]", "shapes": {"X": [3, 4]}}
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = roller.reference(op, {"X": x})
    assert got.shape == () and float(got) == float((x.astype(np.float64) ** 2).sum())


def test_generic_broadcast_with_constant_index():
    op = {"expr": "Y[i,j] = X[i,0] + Z[0,j]", "shapes": {"X": [3, 1], "Z": [1, 4]}}
    x, z = np.arange(3, dtype=np.float32).reshape(3, 1), 10 * np.arange(4, dtype=np.float32).reshape(1, 4)
    _close(roller.reference(op, {"X": x, "Z": z}), x + z)


def test_generic_transpose_reshape_3d():
    op = {"expr": "Y[k,i,j] = X[i,j,k]", "shapes": {"X": [2, 3, 4]}}
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert np.array_equal(roller.reference(op, {"X": x}), x.transpose(2, 0, 1))


def test_float16_ops():
    op = {"expr": "Y[i] = X[i] * W[i]", "shapes": {"X": [4], "W": [4]}, "dtype": "float16"}
    x = np.array([1.5, -2, 3, 0.25], dtype=np.float16)
    w = np.array([2, 2, -1, 4], dtype=np.float16)
    got = roller.reference(op, {"X": x, "W": w})
    assert got.dtype == np.float16 and np.array_equal(got, (x * w))


def test_per_tensor_dtypes_set_output_dtype():
    op = {"expr": "C[m,n] += A[m,k] * B[k,n]", "shapes": {"A": [2, 3], "B": [3, 4]}, "dtype": "float16",
          "dtypes": {"C": "float32"}}
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((2, 3)).astype(np.float16), rng.standard_normal((3, 4)).astype(np.float16)
    got = roller.reference(op, {"A": a, "B": b})
    assert got.dtype == np.float32
    _close(got, a.astype(np.float64) @ b.astype(np.float64), 1e-5)  # accumulated in float64, not float16


def test_random_inputs_follow_dtypes():
    op = {"expr": "C[m,n] += A[m,k] * B[k,n]", "shapes": {"A": [2, 3], "B": [3, 4]}, "dtypes": {"B": "float16"}}
    ins = roller.random_inputs(op, seed=0)
    assert ins["A"].dtype == np.float32 and ins["B"].dtype == np.float16
    assert ins["A"].shape == (2, 3) and ins["B"].shape == (3, 4)
    again = roller.random_inputs(op, seed=0)
    assert all(np.array_equal(ins[k], again[k]) for k in ins)


# ---- prepared forms evaluate like their sources -----------------------------------------------------------------

@pytest.mark.parametrize("op", [
    {"op": "conv2d", "N": 2, "C": 3, "H": 6, "W": 6, "F": 4, "KH": 3, "KW": 3, "stride": 2},
    {"op": "maxpool2d", "N": 2, "C": 3, "H": 6, "W": 6, "K": 2},
    {"op": "elementwise", "fn": "relu", "shapes": {"X": [2, 3, 4]}},
    {"op": "transpose", "shape": [2, 3, 4, 5], "perm": [0, 2, 3, 1]},
], ids=lambda o: o["op"])
def test_reference_of_prepared_form(op):
    (expr,) = parse_ops(op, None)
    inputs = make_inputs(op, seed=9)
    _close(roller.reference(prepare(expr), inputs), independent_eval(op, inputs))


# ---- binding inputs ---------------------------------------------------------------------------------------------

def test_input_shape_checked():
    with pytest.raises(InputError) as info:
        roller.reference({"op": "matmul", "M": 2, "N": 3, "K": 4}, {"A": np.zeros((2, 4)), "B": np.zeros((3, 4))})
    assert str(info.value) == "input 'B' has shape [3, 4], expected [4, 3]"


def test_missing_and_unknown_inputs():
    op = {"op": "matmul", "M": 2, "N": 3, "K": 4}
    with pytest.raises(InputError, match="missing input 'B' of matmul"):
        roller.reference(op, {"A": np.zeros((2, 4))})
    with pytest.raises(InputError, match=r"matmul has no input 'Z' \(inputs: A, B\)"):
        roller.reference(op, {"A": np.zeros((2, 4)), "B": np.zeros((4, 3)), "Z": np.zeros(1)})
    with pytest.raises(InputError, match=r"matmul takes 2 inputs \(A, B\), got 3"):
        roller.reference(op, [np.zeros((2, 4)), np.zeros((4, 3)), np.zeros(1)])
