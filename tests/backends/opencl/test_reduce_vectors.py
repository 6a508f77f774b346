"""Reductions walked in vectors along their innermost axis on a CPU (roller.ir.vector.reduction_vector,
c_family plan.types.ReduceVecPlan): which ops take that form, and its kernels run on PoCL against numpy, every
top-5 candidate, over lengths with and without a scalar tail, partial tiles and several reduction axes."""
from __future__ import annotations

import pytest

import roller.hw as H
from roller.backends import get
from roller.backends.c_family.plan import lower
from roller.backends.opencl import DIALECT
from roller.compiler.check import check_against
from roller.construction import construct
from roller.ir import load_op
from roller.ir.fuse import prepare
from roller.ir.reference import random_inputs
from roller.ir.vector import reduction_vector
from roller.perf.traffic import TileGeometry

CPU = H.load("pocl-cpu")
OPENCL = get("opencl")


@pytest.mark.parametrize("op,form", [
    ({"op": "reduce", "kind": "sum", "shape": [64, 1024], "axes": [1]}, ("i1", 16)),
    ({"op": "reduce", "kind": "mean", "shape": [2, 8, 7, 7], "axes": [2, 3]}, ("i2i3", 16)),
    ({"op": "reduce", "kind": "max", "shape": [500], "axes": [0]}, ("i0", 16)),
    ({"op": "reduce", "kind": "sum", "shape": [33, 12], "axes": [1]}, ("i1", 8)),
    # the rows are the vector axis already (contiguous), too short a reduction, reuse between outputs, strides
    ({"op": "reduce", "kind": "sum", "shape": [64, 1024], "axes": [0]}, None),
    ({"op": "reduce", "kind": "sum", "shape": [64, 6], "axes": [1]}, None),
    ({"op": "matmul", "M": 64, "N": 64, "K": 64, "transpose_b": True}, None),
    ({"op": "maxpool2d", "N": 1, "C": 4, "H": 8, "W": 8, "K": 2}, None),
])
def test_which_reductions_walk_vectors(op: dict, form: tuple[str, int] | None) -> None:
    expr = prepare(load_op(op))
    assert reduction_vector(expr) == form
    geo = TileGeometry(expr)
    assert (geo.reduce_vector, geo.lane_gathers and form is not None) == (form, False)


@pytest.mark.parametrize("spec", [
    {"op": "reduce", "kind": "sum", "shape": [77, 1000], "axes": [1]},      # 62 vectors and an 8-point tail
    {"op": "reduce", "kind": "max", "shape": [40, 64], "axes": [1]},
    {"op": "reduce", "kind": "min", "shape": [19, 3, 37], "axes": [0, 2]},  # an outer reduction loop
    {"op": "reduce", "kind": "mean", "shape": [3, 5, 9, 9], "axes": [2, 3]},
    {"op": "reduce", "kind": "sum", "shape": [1000], "axes": [0]},          # no spatial axis
    {"name": "dot_rows", "expr": "Y[i] += A[i,k] * B[i,k]", "shapes": {"A": [50, 300], "B": [50, 300]}},
])
def test_vector_walks_match_numpy(spec: dict) -> None:
    op = load_op({"name": "r", **spec})
    x = random_inputs(op, seed=5)
    progs = construct(op, CPU, top_k=5)
    for p in progs:
        plan = lower(p, DIALECT)
        assert plan.rvec is not None and plan.vec is None
        src = OPENCL.render(p, CPU).files["kernel.cl"]
        assert f"vload{plan.rvec.width}(0, " in src
        y = OPENCL.compile(OPENCL.render(p, CPU), CPU)([x[t.name] for t in op.inputs])
        check_against(p.line(), op, x, y)


def test_gpu_plans_keep_their_form() -> None:
    op = load_op({"op": "reduce", "kind": "sum", "shape": [64, 1024], "axes": [1]})
    for hw in ("v100", "mi100"):
        p = construct(op, H.load(hw), top_k=1)[0]
        assert lower(p, DIALECT).rvec is None
