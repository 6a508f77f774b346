"""The independent numpy implementations (tests/support/independent.py) against slow loops, hand-worked values, and the suites."""
from __future__ import annotations

import itertools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.independent import independent_eval, input_shapes, make_inputs, output_shape

REPO = Path(__file__).resolve().parents[2]
SUITES = REPO / "bench" / "suites"
EXAMPLES = REPO / "examples"


# ---------------------------------------------------------------------------------------------------------
# Slow loop versions: bounds checks instead of padded arrays, output size from the TensorFlow rules.


def _out_and_before(size, k, stride, dilation, padding):
    span = (k - 1) * dilation + 1
    if padding == "SAME":
        out = math.ceil(size / stride)
        return out, max((out - 1) * stride + span - size, 0) // 2
    p = 0 if padding == "VALID" else padding
    return (size + 2 * p - span) // stride + 1, p


def loop_conv2d(op, x, w):
    nhwc = op.get("layout", "NCHW") == "NHWC"
    n_, c_, h_, w_, f_ = op["N"], op["C"], op["H"], op["W"], op["F"]
    s, d = op.get("stride", 1), op.get("dilation", 1)
    oh_, pt = _out_and_before(h_, op["KH"], s, d, op["padding"])
    ow_, pl = _out_and_before(w_, op["KW"], s, d, op["padding"])
    y = np.zeros((n_, oh_, ow_, f_) if nhwc else (n_, f_, oh_, ow_))
    for n, f, oh, ow in itertools.product(range(n_), range(f_), range(oh_), range(ow_)):
        acc = 0.0
        for c, r, t in itertools.product(range(c_), range(op["KH"]), range(op["KW"])):
            ih, iw = oh * s - pt + r * d, ow * s - pl + t * d
            if 0 <= ih < h_ and 0 <= iw < w_:
                if nhwc:
                    acc += float(x[n, ih, iw, c]) * float(w[r, t, c, f])
                else:
                    acc += float(x[n, c, ih, iw]) * float(w[f, c, r, t])
        if nhwc:
            y[n, oh, ow, f] = acc
        else:
            y[n, f, oh, ow] = acc
    return y


def loop_depthwise(op, x, w):
    n_, c_, h_, w_ = op["N"], op["C"], op["H"], op["W"]
    s, d = op.get("stride", 1), op.get("dilation", 1)
    oh_, pt = _out_and_before(h_, op["KH"], s, d, op["padding"])
    ow_, pl = _out_and_before(w_, op["KW"], s, d, op["padding"])
    y = np.zeros((n_, c_, oh_, ow_))
    for n, c, oh, ow in itertools.product(range(n_), range(c_), range(oh_), range(ow_)):
        for r, t in itertools.product(range(op["KH"]), range(op["KW"])):
            ih, iw = oh * s - pt + r * d, ow * s - pl + t * d
            if 0 <= ih < h_ and 0 <= iw < w_:
                y[n, c, oh, ow] += float(x[n, c, ih, iw]) * float(w[c, r, t])
    return y


def loop_pool(op, x):
    k = op["K"]
    s = op.get("stride", k)
    padding = op.get("padding", "VALID")
    n_, c_, h_, w_ = x.shape
    oh_, pt = _out_and_before(h_, k, s, 1, padding)
    ow_, pl = _out_and_before(w_, k, s, 1, padding)
    y = np.zeros((n_, c_, oh_, ow_))
    for n, c, oh, ow in itertools.product(range(n_), range(c_), range(oh_), range(ow_)):
        vals = []
        for r, t in itertools.product(range(k), range(k)):
            ih, iw = oh * s - pt + r, ow * s - pl + t
            inside = 0 <= ih < h_ and 0 <= iw < w_
            vals.append(float(x[n, c, ih, iw]) if inside else None)
        if op["op"] == "maxpool2d":
            y[n, c, oh, ow] = max(v for v in vals if v is not None)
        else:
            y[n, c, oh, ow] = sum(v for v in vals if v is not None) / (k * k)
    return y


def loop_matmul(op, a, b):
    m_, n_, k_ = op["M"], op["N"], op["K"]
    y = np.zeros((m_, n_))
    for m, n, k in itertools.product(range(m_), range(n_), range(k_)):
        av = a[k, m] if op.get("transpose_a") else a[m, k]
        bv = b[n, k] if op.get("transpose_b") else b[k, n]
        y[m, n] += float(av) * float(bv)
    return y


def loop_reduce(op, x):
    axes = sorted(a % x.ndim for a in op["axes"])
    keep = [i for i in range(x.ndim) if i not in axes]
    out = {}
    for idx in itertools.product(*[range(d) for d in x.shape]):
        key = tuple(idx[i] for i in keep)
        out.setdefault(key, []).append(float(x[idx]))
    y = np.zeros([x.shape[i] for i in keep])
    fold = {"sum": sum, "max": max, "min": min, "mean": lambda v: sum(v) / len(v)}[op["kind"]]
    for key, vals in out.items():
        y[key] = fold(vals)
    return y


LOOP_CASES = [
    ({"op": "conv2d", "N": 1, "C": 2, "H": 5, "W": 4, "F": 3, "KH": 3, "KW": 2, "stride": 2, "padding": "SAME"},
     loop_conv2d),
    ({"op": "conv2d", "N": 2, "C": 3, "H": 7, "W": 6, "F": 2, "KH": 3, "KW": 3, "stride": 1, "padding": "SAME",
      "dilation": 2}, loop_conv2d),
    ({"op": "conv2d", "N": 1, "C": 2, "H": 6, "W": 5, "F": 2, "KH": 2, "KW": 3, "stride": 3, "padding": 1,
      "layout": "NHWC"}, loop_conv2d),
    ({"op": "conv2d", "N": 1, "C": 1, "H": 7, "W": 7, "F": 2, "KH": 3, "KW": 3, "stride": 2, "padding": "VALID"},
     loop_conv2d),
    ({"op": "depthwise_conv2d", "N": 2, "C": 3, "H": 6, "W": 5, "KH": 3, "KW": 3, "stride": 2,
      "padding": "SAME", "dilation": 1}, loop_depthwise),
    ({"op": "avgpool2d", "N": 1, "C": 2, "H": 5, "W": 5, "K": 3, "stride": 2, "padding": "SAME"}, loop_pool),
    ({"op": "maxpool2d", "N": 1, "C": 2, "H": 6, "W": 5, "K": 2, "stride": 2, "padding": "SAME"}, loop_pool),
    ({"op": "maxpool2d", "N": 1, "C": 1, "H": 5, "W": 5, "K": 2}, loop_pool),
    ({"op": "matmul", "M": 3, "N": 4, "K": 5, "transpose_a": True, "transpose_b": True}, loop_matmul),
    ({"op": "reduce", "kind": "mean", "shape": [2, 3, 4], "axes": [0, 2]}, loop_reduce),
    ({"op": "reduce", "kind": "max", "shape": [3, 4], "axes": [-1]}, loop_reduce),
]


@pytest.mark.parametrize("op,slow", LOOP_CASES, ids=[f"{c[0]['op']}{i}" for i, c in enumerate(LOOP_CASES)])
def test_against_loops(op, slow):
    inputs = make_inputs(op, seed=1)
    assert list(inputs) == list(input_shapes(op))
    for name, arr in inputs.items():
        assert arr.dtype == np.float32 and list(arr.shape) == input_shapes(op)[name]
    y = independent_eval(op, inputs)
    assert y.dtype == np.float32
    expected = slow(op, *inputs.values())
    assert list(y.shape) == output_shape(op) == list(expected.shape)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_same_padding_is_tensorflow_asymmetric():
    # H = 4, K = 3, stride 2: OH = 2, pad_total = 1 -> 0 rows on top, 1 at the bottom.
    op = {"op": "conv2d", "N": 1, "C": 2, "H": 4, "W": 4, "F": 1, "KH": 3, "KW": 3, "stride": 2, "padding": "SAME"}
    y = independent_eval(op, {"X": np.ones((1, 2, 4, 4), np.float32), "W": np.ones((1, 2, 3, 3), np.float32)})
    np.testing.assert_array_equal(y[0, 0], [[18, 12], [12, 8]])


def test_avgpool_counts_padding_and_maxpool_ignores_it():
    x = -np.ones((1, 1, 3, 3), np.float32)
    avg = independent_eval({"op": "avgpool2d", "N": 1, "C": 1, "H": 3, "W": 3, "K": 3, "stride": 1,
                            "padding": "SAME"}, {"X": x})
    assert avg[0, 0, 0, 0] == pytest.approx(-4 / 9) and avg[0, 0, 1, 1] == pytest.approx(-1)
    mx = independent_eval({"op": "maxpool2d", "N": 1, "C": 1, "H": 3, "W": 3, "K": 3, "stride": 1,
                           "padding": "SAME"}, {"X": x})
    np.testing.assert_array_equal(mx, -np.ones((1, 1, 3, 3)))


def test_elementwise_broadcast_transpose_and_batch_matmul():
    op = {"op": "elementwise", "fn": "sub", "shapes": {"A": [2, 1, 3], "B": [4, 1]}}
    inp = make_inputs(op, 3)
    y = independent_eval(op, inp)
    assert y.shape == (2, 4, 3)
    for i, j, k in itertools.product(range(2), range(4), range(3)):
        assert y[i, j, k] == pytest.approx(float(inp["A"][i, 0, k]) - float(inp["B"][j, 0]), abs=1e-6)
    t = {"op": "transpose", "shape": [2, 3, 4], "perm": [2, 0, 1]}
    x = make_inputs(t, 0)["X"]
    yt = independent_eval(t, {"X": x})
    assert yt.shape == (4, 2, 3) and yt[3, 1, 2] == x[1, 2, 3]
    bmm = {"op": "batch_matmul", "B": 2, "M": 3, "N": 2, "K": 4, "transpose_a": True}
    inp = make_inputs(bmm, 0)
    yb = independent_eval(bmm, inp)
    for b in range(2):
        np.testing.assert_allclose(yb[b], loop_matmul({"op": "matmul", "M": 3, "N": 2, "K": 4, "transpose_a": True},
                                                      inp["A"][b], inp["B"][b]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", ["relu", "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "neg"])
def test_unary_functions_are_finite(fn):
    op = {"op": "elementwise", "fn": fn, "shapes": {"X": [5, 7]}}
    x = make_inputs(op, 0)["X"]
    y = independent_eval(op, {"X": x})
    assert np.all(np.isfinite(y))
    scalar = {"relu": lambda v: max(v, 0.0), "exp": math.exp, "log": math.log, "sqrt": math.sqrt,
              "rsqrt": lambda v: 1 / math.sqrt(v), "tanh": math.tanh, "erf": math.erf,
              "sigmoid": lambda v: 1 / (1 + math.exp(-v)), "abs": abs, "neg": lambda v: -v}[fn]
    assert y[2, 3] == pytest.approx(scalar(float(x[2, 3])), rel=1e-6, abs=1e-7)


# ---------------------------------------------------------------------------------------------------------
# Suites and examples


def _ops(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    return data.get("ops", [data])


def test_scaled_suite_runs_fast():
    ops = _ops(SUITES / "scaled.json")
    assert 30 <= len(ops) <= 45
    assert len({op["name"] for op in ops}) == len(ops)
    start = time.perf_counter()
    for i, op in enumerate(ops):
        y = independent_eval(op, make_inputs(op, seed=i))
        assert list(y.shape) == output_shape(op) and np.all(np.isfinite(y)), op["name"]
    assert time.perf_counter() - start < 5.0


def test_named_examples_run():
    for path in sorted(EXAMPLES.glob("*.json")):
        for op in _ops(path):
            if "op" in op:
                y = independent_eval(op, make_inputs(op, 0))
                assert list(y.shape) == output_shape(op), path.name


def test_roller119_shapes():
    ops = _ops(SUITES / "roller119.json")
    assert len(ops) == 119
    prefixes = {}
    for op in ops:
        prefixes[op["name"][0]] = prefixes.get(op["name"][0], 0) + 1
        assert op["dtype"] == "float32"
        assert all(d >= 1 for d in output_shape(op)), op["name"]
        assert all(d >= 1 for shape in input_shapes(op).values() for d in shape), op["name"]
    assert prefixes == {"M": 7, "C": 44, "D": 23, "E": 28, "P": 13, "R": 4}


def test_roller119_is_generated_from_paper_ops():
    source = REPO.parent / "shared" / "reference" / "paper_ops.json"
    if not source.exists():
        pytest.skip(f"{source} not here")
    sys.path.insert(0, str(SUITES))
    try:
        import make_suites
    finally:
        sys.path.remove(str(SUITES))
    assert make_suites.dumps(make_suites.build(source)) == (SUITES / "roller119.json").read_text()
