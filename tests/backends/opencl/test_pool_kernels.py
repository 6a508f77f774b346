"""Pooling windows on a CPU: built with and without a padded copy of the input, ranked by the model (which
charges the copy); the constant divisor of an average taken once per output (plan.schedule.hoist_divisor); runs that
cover a vector axis no transaction multiple divides. The kernels run on PoCL against numpy."""
from __future__ import annotations

import pytest

import roller.hw as H
from roller.backends import get
from roller.backends.c_family.plan import hoist_divisor, lower
from roller.backends.opencl import DIALECT
from roller.compiler.check import check_against
from roller.construction import construct
from roller.ir import load_op
from roller.ir.reference import random_inputs

CPU = H.load("pocl-cpu")
OPENCL = get("opencl")
AVG = {"name": "avg", "op": "avgpool2d", "N": 2, "C": 8, "H": 56, "W": 56, "K": 3, "stride": 1, "padding": "SAME"}


def _padded(p) -> bool:  # type: ignore[no-untyped-def]
    prep = p.expr.preparation
    return prep is not None and bool(prep.pads)


def test_a_pooling_window_reads_its_input_unpadded() -> None:
    # Both forms are built; where the window's input outgrows the cache (3 MiB here), the copy into a padded
    # buffer doubles the traffic, so the unpadded ones rank first. (A small one, which the cache holds, pays
    # for its bounds tests instead, and takes the padded copy.)
    progs = construct(load_op({**AVG, "N": 8, "C": 32}), CPU, top_k=2000)
    assert not _padded(progs[0]) and any(_padded(p) for p in progs)
    progs = construct(load_op(AVG), CPU, top_k=2000)
    # A run of 56 columns as seven 8-wide vectors covers the row: no vector across its end.
    w = [a.name for a in progs[0].expr.axes].index("w")
    assert progs[0].thread_tile.shape[w] == 56


def test_a_convolution_keeps_its_padded_copy() -> None:
    conv = load_op({"op": "conv2d", "N": 1, "C": 8, "H": 28, "W": 28, "F": 16, "KH": 3, "KW": 3, "padding": "SAME"})
    assert all(_padded(p) for p in construct(conv, CPU, top_k=10))


def test_the_divisor_is_taken_once_per_output() -> None:
    p = construct(load_op(AVG), CPU, top_k=1)[0]
    src = OPENCL.render(p, CPU).files["kernel.cl"]
    assert src.count("/ 9.0f") == src.count("rl_vr = (rl_vr0 / 9.0f)") >= 1
    fused = load_op({"name": "f", "expr": "Y[i] += X[i,k] / 4.0; Y[i] = relu(Y[i] + B[i])",
                     "shapes": {"X": [8, 4], "B": [8]}})
    assert str(hoist_divisor(fused).epilogue) == "relu(Y[i] / 4.0 + B[i])"
    assert hoist_divisor(load_op({"op": "maxpool2d", "N": 1, "C": 1, "H": 4, "W": 4, "K": 2})).epilogue is None


def test_threads_whose_windows_stay_inside_read_without_bounds_tests() -> None:
    p = construct(load_op({**AVG, "N": 8, "C": 32}), CPU, top_k=1)[0]   # unpadded (see above)
    assert not _padded(p)
    h = [a.name for a in p.expr.axes].index("h")
    run = p.thread_tile.shape[h]
    plan = lower(p, DIALECT)
    assert plan.vec is not None
    first, rest = plan.vec.flavors[0], plan.vec.flavors[1:]
    assert first.cond == f"rl_s_h + rl_t_h * {run} >= 1 && rl_s_h + rl_t_h * {run} + {run - 1} <= 54"
    row_test = "(long)rl_g_h + (long)rl_g_r - 1) < 56u"
    assert row_test not in first.body and all(row_test in f.body for f in rest)


def test_a_windows_vectors_across_the_edge_load_whole() -> None:
    p = construct(load_op({**AVG, "N": 8, "C": 32}), CPU, top_k=1)[0]
    plan = lower(p, DIALECT)
    assert plan.vec is not None and plan.vec.width == 8
    for f in plan.vec.flavors:
        # the run's first vector at s = 0 has one lane left of the row, its last at s = 2 one right of it
        assert "== -1 ? (float8)(0.0f, vload8(" in f.body and ".s567, 0.0f)" in f.body
        assert "(float)(X[" not in f.body   # no lane gathered one by one


@pytest.mark.parametrize("spec", [
    {"name": "p5", "op": "avgpool2d", "N": 2, "C": 16, "H": 20, "W": 40, "K": 5, "stride": 1, "padding": "SAME"},
    {"name": "m7", "op": "maxpool2d", "N": 2, "C": 16, "H": 19, "W": 48, "K": 7, "stride": 1, "padding": "SAME"},
    {"name": "dil", "expr": "Y[c,h,w] += X[c,h+r-1,w+3*s-3]", "shapes": {"X": [16, 24, 64], "Y": [16, 22, 64]},
     "extents": {"r": 3, "s": 3}},
    {"name": "wide", "expr": "Y[c,h,w] max= X[c,h,w+s-20]", "shapes": {"X": [16, 8, 64], "Y": [16, 8, 64]},
     "extents": {"s": 41}},   # up to 20 lanes outside, more than a vector: gathered beyond 15
])
def test_windows_across_the_edges_match_numpy(spec: dict) -> None:
    op = load_op(spec)
    x = random_inputs(op, seed=9)
    # the best candidates that read the input unpadded, with bounds tests (small inputs rank the copy first)
    unpadded = [p for p in construct(op, CPU, top_k=2000) if not _padded(p)][:3]
    assert unpadded
    for p in unpadded:
        check_against(p.line(), op, x, OPENCL.compile(OPENCL.render(p, CPU), CPU)([x[t.name] for t in op.inputs]))


def test_a_strided_window_is_inside_where_every_offset_is() -> None:
    # 2h + r - 1 for r in 0..2 stays in 0..30 for h in 1..14; w + s - 2 for s in 0..4 in 0..39 for w in 2..37
    op = load_op({"name": "win", "expr": "Y[c,h,w] += X[c, 2*h+r-1, w+s-2]", "shapes": {"X": [4, 31, 40], "Y": [4, 15, 40]},
                  "extents": {"r": 3, "s": 5}})
    conds = set()
    x = random_inputs(op, seed=3)
    for p in construct(op, CPU, top_k=6):
        plan = lower(p, DIALECT)
        if plan.vec is not None and plan.vec.flavors[0].cond:
            conds.add(plan.vec.flavors[0].cond)
        check_against(p.line(), op, x, OPENCL.compile(OPENCL.render(p, CPU), CPU)([x["X"]]))
    assert any(">= 1" in c and "<= 14" in c for c in conds), conds


@pytest.mark.parametrize("spec", [
    AVG,
    {**AVG, "H": 13, "W": 13, "count_include_pad": False},
    {**AVG, "H": 29, "W": 31, "K": 3, "stride": 2, "padding": "SAME"},
    {**AVG, "K": 2, "stride": 2, "padding": "VALID"},
    {"name": "mx", "op": "maxpool2d", "N": 2, "C": 4, "H": 56, "W": 56, "K": 3, "stride": 1, "padding": "SAME"},
    {"name": "mean", "op": "reduce", "kind": "mean", "shape": [3, 40, 5], "axes": [1]},
])
def test_pooling_kernels_match_numpy(spec: dict) -> None:
    op = load_op(spec)
    x = random_inputs(op, seed=7)
    for p in construct(op, CPU, top_k=4):
        lower(p, DIALECT)
        y = OPENCL.compile(OPENCL.render(p, CPU), CPU)([x[t.name] for t in op.inputs])
        check_against(p.line(), op, x, y)
