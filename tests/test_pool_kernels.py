"""Pooling windows on a CPU: built with and without a padded copy of the input, ranked by the model (which
charges the copy); the constant divisor of an average taken once per output (plan.hoist_divisor); runs that
cover a vector axis no transaction multiple divides. The kernels run on PoCL against numpy."""
from __future__ import annotations

import pytest

import roller.hw as H
from roller.backends import get
from roller.backends.c_family.plan import hoist_divisor, lower
from roller.backends.opencl import DIALECT
from roller.construction import construct
from roller.evaluate import check_against
from roller.ir import load_op
from roller.numpy_reference import random_inputs

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


@pytest.mark.parametrize("spec", [
    AVG,
    {**AVG, "H": 13, "W": 13, "count_include_pad": False},
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
