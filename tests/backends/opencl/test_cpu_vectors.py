"""The CPU kernels' vector path (c_family plan.types.VecPlan, docs/opencl.md): which reads become broadcasts, vector
loads or gathered lanes, the edge version for tiles that cross the vector axis's end, the model's matching
test for lane-gathered reads, and roller's PoCL work-group default. Running the kernels is in
tests/backends/opencl/test_suite.py (every candidate of a sample of the suite, and hypothesis-drawn irregular shapes)."""
from __future__ import annotations

import dataclasses
import os

import pytest

import roller.hw as H
from roller.backends import get
from roller.backends.c_family.plan import lower
from roller.backends.opencl import DIALECT as OPENCL_DIALECT
from roller.backends.opencl.env import apply_pocl_defaults
from roller.compiler.check import check_against
from roller.construction import construct
from roller.ir import load_op, load_ops
from roller.ir.fuse import prepare
from roller.ir.reference import random_inputs
from roller.perf.traffic import TileGeometry

# The plans' text with 32-bit indices, as the checks below spell it (the OpenCL dialect computes every index in
# 64 bits on the CPU, Dialect.wide_index: the same plan with "(long)" casts).
DIALECT = dataclasses.replace(OPENCL_DIALECT, wide_index=False)

CPU = H.load("pocl-cpu")
OPENCL = get("opencl")


def _programs(spec: dict, k: int = 10):  # type: ignore[no-untyped-def]
    return construct(load_ops(spec)[0], CPU, top_k=k)


def _with_run(spec: dict, run: int):  # type: ignore[no-untyped-def]
    """A candidate whose thread tile has ``run`` points along the last spatial axis."""
    for p in _programs(spec, 30):
        last = [i for i, a in enumerate(p.expr.axes) if not a.reduce][-1]
        if p.thread_tile.shape[last] == run:
            return p
    raise AssertionError(f"no candidate with a run of {run}")


def test_matmul_inside_and_edge_versions() -> None:
    # N = 29: a 16-point run at n = 16 crosses the end, so the kernel holds both versions.
    p = _with_run({"op": "matmul", "M": 45, "N": 29, "K": 70}, 16)
    plan = lower(p, DIALECT)
    assert plan.vec is not None and plan.vec.width == 16 and plan.vec.axis == "n"
    inside, edge = plan.vec.flavors
    assert inside.cond == "rl_s_n + rl_t_n * 16 + 16 <= 29"
    assert "vload16(0, B + (rl_g_k) * 29 + (rl_g_n))" in inside.body
    assert inside.store_offset == "(rl_g_m) * 29 + (rl_g_n)"
    # Across the end: a vector wholly inside still loads and stores as one, the one across it gathers its
    # lanes through clamped indices and stores them one by one.
    assert "(rl_g_n + 15 < 29 ? vload16(0, B + (rl_g_k) * 29 + (rl_g_n)) : (float16)(" in edge.body
    assert "min((rl_g_n + 15), 28)" in edge.body
    assert edge.store_offset == inside.store_offset and edge.store_test == "rl_g_m < 45 && rl_g_n + 15 < 29"
    assert edge.lane_guard == "rl_g_m < 45 && rl_g_n < 29"
    # The one run across the end starts at n = 16, given as a constant so that the compiler folds the tests.
    assert edge.run_start == 16 and inside.run_start is None
    src = OPENCL.render(p, CPU).files["kernel.cl"]
    assert "float16 rl_vacc[" in src and "vstore16(rl_vr, 0, C +" in src
    assert "const int rl_g_n = 16 + (rl_j / 1) % 16;" in src


@pytest.mark.skipif(not OPENCL.can_run_here(), reason=OPENCL.why_not_here())
def test_runs_past_the_end_skip_and_the_crossing_run_is_right() -> None:
    """Candidates whose blocks leave whole runs past the vector axis's end (a skip version) and one run
    across it (a constant start), run on PoCL against numpy, over several axis lengths."""
    seen = 0
    for n in (40, 72, 100):
        op = load_op({"name": f"mm{n}", "op": "matmul", "M": 9, "N": n, "K": 5})
        x = random_inputs(op, seed=3)
        for p in construct(op, CPU, top_k=200):
            plan = lower(p, DIALECT)
            if plan.vec is None or not any(f.skip for f in plan.vec.flavors):
                continue
            skip = next(f for f in plan.vec.flavors if f.skip)
            assert skip.cond.endswith(f">= {n}") and plan.vec.flavors[-1].run_start is not None
            y = OPENCL.compile(OPENCL.render(p, CPU), CPU)([x[t.name] for t in op.inputs])
            check_against(p.line(), op, x, y)
            seen += 1
            if seen % 3 == 0:
                break
    assert seen >= 3


def test_transposed_b_is_gathered_lane_by_lane() -> None:
    p = _with_run({"op": "matmul", "M": 32, "N": 64, "K": 48, "transpose_b": True}, 16)
    plan = lower(p, DIALECT)
    assert plan.vec is not None and len(plan.vec.flavors) == 1   # 64 is a multiple of every block: no edge
    body = plan.vec.flavors[0].body
    assert "vload16(0, B" not in body and "B[((rl_g_n + 15)) * 48 + (rl_g_k)]" in body
    assert "((float16)((float)(A[(rl_g_m) * 48 + (rl_g_k)])))" in body   # A does not move along n


def test_convolution_reads_a_padded_input_directly() -> None:
    """On a CPU a convolution stays direct over a padded copy of X: a vector of outputs along w loads one
    vector of X, with no bounds test, and the weight every lane shares is one broadcast."""
    p = _with_run({"op": "conv2d", "N": 1, "C": 8, "H": 14, "W": 14, "F": 32, "KH": 3, "KW": 3,
                   "padding": "SAME"}, 8)
    assert p.pads == {"X": ((0, 0), (0, 0), (1, 1), (1, 1))}
    vec = lower(p, DIALECT).vec
    assert vec is not None and vec.axis == "w"
    body = vec.flavors[0].body
    assert body.startswith("(vload8(0, X + ") and "(rl_g_w + rl_g_s)" in body and "unsigned" not in body
    assert "((float8)((float)(W[(rl_g_f) * 72 + (rl_g_c) * 9 + (rl_g_r) * 3 + (rl_g_s)])))" in body
    launch = OPENCL.render(p, CPU).launch
    assert launch["arguments"][0]["shape"] == [1, 8, 16, 16]
    assert launch["arguments"][0]["pad"] == {"shape": [1, 8, 14, 14], "before": [0, 0, 1, 1],
                                             "after": [0, 0, 1, 1], "value": 0.0}


def test_moving_window_loads_a_vector_without_bounds_tests() -> None:
    p = _programs({"op": "depthwise_conv2d", "N": 1, "C": 4, "H": 40, "W": 40, "KH": 3, "KW": 3,
                   "padding": "SAME"}, 1)[0]
    vec = lower(p, DIALECT).vec
    assert vec is not None and vec.axis == "w"
    n = vec.width
    body = vec.flavors[0].body   # runs wholly inside the image: one load from the padded copy (42 wide)
    assert body.startswith(f"(vload{n}(0, X + ") and "* 42 + (rl_g_w + rl_g_s))" in body and "?" not in body


@pytest.mark.skipif(not OPENCL.can_run_here(), reason=OPENCL.why_not_here())
@pytest.mark.parametrize("spec", [
    {"op": "depthwise_conv2d", "N": 1, "C": 3, "H": 13, "W": 13, "KH": 3, "KW": 3, "stride": 2, "padding": "SAME"},
    {"op": "depthwise_conv2d", "N": 1, "C": 2, "H": 40, "W": 40, "KH": 3, "KW": 3, "stride": 2, "padding": "SAME"},
    {"op": "depthwise_conv2d", "N": 1, "C": 3, "H": 33, "W": 33, "KH": 3, "KW": 3, "stride": 2, "padding": "VALID"},
    {"op": "conv2d", "N": 1, "C": 3, "H": 23, "W": 23, "F": 8, "KH": 7, "KW": 7, "stride": 2, "padding": "SAME"},
    {"op": "maxpool2d", "N": 1, "C": 2, "H": 34, "W": 34, "K": 2},
])
def test_stride_two_reads_take_the_even_and_odd_lanes_of_two_loads(spec: dict) -> None:
    """A stride-2 run inside the tensor is two contiguous loads and their even and odd lanes, with no test
    (the inputs are padded copies); the vector across a run's end gathers. Every vector candidate runs right
    on PoCL, odd sizes and the tensor's last element (VALID: the last lane reads it) included."""
    op = load_op({"name": "s2", **spec})
    x = random_inputs(op, seed=5)
    ran = 0
    for p in construct(op, CPU, top_k=12):
        vec = lower(p, DIALECT).vec
        if vec is None or vec.width == 1:
            continue
        inside = vec.flavors[0].body
        assert ".even, vload" in inside and ".odd)" in inside, p.line()
        if vec.flavors[0].cond:   # a thread run wholly inside the axis: no test, no gathered lane
            assert "?" not in inside and "X[" not in inside
        y = OPENCL.compile(OPENCL.render(p, CPU), CPU)([x[t.name] for t in op.inputs])
        check_against(p.line(), op, x, y)
        ran += 1
    assert ran


def test_runs_no_vector_width_divides_stay_scalar() -> None:
    p = _with_run({"op": "reduce", "kind": "min", "shape": [7, 97, 3], "axes": [1]}, 3)
    assert lower(p, DIALECT).vec is None
    assert "vload" not in OPENCL.render(p, CPU).files["kernel.cl"]


def test_gpu_shaped_kernels_have_no_vector_path() -> None:
    p = construct(load_ops({"op": "matmul", "M": 64, "N": 64, "K": 64})[0], H.load("v100"), top_k=1)[0]
    plan = lower(p, DIALECT)
    assert plan.staged and plan.vec is None


@pytest.mark.parametrize("op,gathers", [
    ({"op": "matmul", "M": 8, "N": 8, "K": 8}, False),
    ({"op": "matmul", "M": 8, "N": 8, "K": 8, "transpose_a": True}, False),
    ({"op": "matmul", "M": 8, "N": 8, "K": 8, "transpose_b": True}, True),
    ({"op": "conv2d", "N": 1, "C": 4, "H": 9, "W": 9, "F": 8, "KH": 3, "KW": 3, "padding": "SAME"}, True),
    ({"op": "conv2d", "N": 1, "C": 4, "H": 9, "W": 9, "F": 8, "KH": 3, "KW": 3, "padding": "SAME",
      "layout": "NHWC"}, False),
    ({"op": "depthwise_conv2d", "N": 1, "C": 4, "H": 9, "W": 9, "KH": 3, "KW": 3}, False),
    ({"op": "maxpool2d", "N": 1, "C": 4, "H": 8, "W": 8, "K": 2}, False),   # stride 2, inside: even/odd lanes
    ({"op": "maxpool2d", "N": 1, "C": 4, "H": 9, "W": 9, "K": 2, "padding": "SAME"}, True),   # past the end
    ({"op": "maxpool2d", "N": 1, "C": 4, "H": 9, "W": 9, "K": 3, "stride": 3}, True),
    ({"op": "elementwise", "fn": "relu", "shapes": {"X": [4, 9]}}, False),
])
def test_lane_gathers(op: dict, gathers: bool) -> None:
    assert TileGeometry(prepare(load_op(op))).lane_gathers is gathers   # prepare: what construction sees


def test_pocl_default_keeps_a_users_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POCL_WORK_GROUP_METHOD", raising=False)
    apply_pocl_defaults()
    assert os.environ["POCL_WORK_GROUP_METHOD"] == "loops"
    monkeypatch.setenv("POCL_WORK_GROUP_METHOD", "cbs")
    apply_pocl_defaults()
    assert os.environ["POCL_WORK_GROUP_METHOD"] == "cbs"
