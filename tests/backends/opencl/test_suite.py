"""Every op of the scaled suite, as constructed for every bundled description, rendered as OpenCL and run on
the local OpenCL device (PoCL), matches roller.reference; plus hypothesis-generated irregular shapes."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import roller.hw as H
from roller.backends import get
from roller.compiler.check import check_output
from roller.construction import construct
from roller.ir import load_ops
from roller.ir.reference import bound, random_inputs

ROOT = Path(__file__).resolve().parents[3]
SCALED = load_ops(ROOT / "bench/suites/scaled.json")
BACKEND = get("opencl")
pytestmark = pytest.mark.skipif(not BACKEND.can_run_here(), reason=BACKEND.why_not_here())


def run_and_check(op, hw, top: int = 1) -> None:
    x = random_inputs(op, seed=1)
    b = bound(op, x)  # the check of run --check, computed once for the candidates
    for p in construct(op, hw, top_k=top)[:top]:
        art = BACKEND.render(p, hw)
        y = BACKEND.compile(art, hw)([x[t.name] for t in op.inputs])
        check_output(f"{op.name} on {hw.name}: {p.line()}", y, b.ref, op.output.dtype, bound=b)


@pytest.mark.slow
@pytest.mark.parametrize("device", H.list_bundled())
def test_scaled_suite_on_pocl(device: str) -> None:
    hw = H.load(device)
    for op in SCALED:
        run_and_check(op, hw)


@pytest.mark.slow
def test_top10_candidates_all_correct() -> None:
    """Not just the top-1: every candidate of the top-10 computes the right thing."""
    hw = H.load("v100")
    for op in SCALED[::6]:
        run_and_check(op, hw, top=10)


@pytest.mark.slow
def test_top10_candidates_all_correct_cpu_vectors() -> None:
    """CPU kernels take the vector path (plan.types.VecPlan): inside/edge flavors, broadcast, contiguous, windowed
    and gathered reads, views, max/min reductions, elementwise bodies; every top-10 candidate is right."""
    hw = H.load("pocl-cpu")
    for op in SCALED[1::4]:
        run_and_check(op, hw, top=10)


dims = st.sampled_from([1, 2, 3, 5, 7, 13, 17, 31, 33, 61, 97])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=dims, n=dims, k=dims, device=st.sampled_from(["v100", "mi50", "h100", "pocl-cpu"]))
def test_matmul_irregular_shapes(m: int, n: int, k: int, device: str) -> None:
    op = load_ops({"op": "matmul", "M": m, "N": n, "K": k})[0]
    run_and_check(op, H.load(device))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.sampled_from([1, 3, 5]), hw_=st.sampled_from([1, 7, 13]), f=st.sampled_from([1, 4, 7]),
       k=st.sampled_from([1, 3, 5]), stride=st.sampled_from([1, 2]), pad=st.sampled_from(["SAME", "VALID"]))
@pytest.mark.parametrize("device", ["a100", "pocl-cpu"])
def test_conv_irregular_shapes(c: int, hw_: int, f: int, k: int, stride: int, pad: str, device: str) -> None:
    if pad == "VALID" and k > hw_:
        return
    op = load_ops({"op": "conv2d", "N": 2, "C": c, "H": hw_, "W": hw_ + 2, "F": f, "KH": k, "KW": k,
                   "stride": stride, "padding": pad})[0]
    run_and_check(op, H.load(device))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.sampled_from([1, 2, 3, 7, 11]), min_size=1, max_size=4), data=st.data())
@pytest.mark.parametrize("device", ["mi100", "pocl-cpu"])
def test_reduce_irregular_shapes(shape: list[int], data, device: str) -> None:  # type: ignore[no-untyped-def]
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
    kind = data.draw(st.sampled_from(["sum", "max", "min", "mean"]))
    op = load_ops({"op": "reduce", "kind": kind, "shape": shape, "axes": axes})[0]
    run_and_check(op, H.load(device))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op=st.sampled_from(["depthwise_conv2d", "maxpool2d", "avgpool2d"]), hw_=st.sampled_from([5, 17, 33]),
       k=st.sampled_from([2, 3, 5]), stride=st.sampled_from([1, 2]), pad=st.sampled_from(["SAME", "VALID"]))
@pytest.mark.slow
def test_window_irregular_shapes_cpu(op: str, hw_: int, k: int, stride: int, pad: str) -> None:
    """Windows that move with the vector lanes: one vector load inside the image, gathered lanes at borders."""
    spec = {"op": op, "N": 1, "C": 3, "H": hw_, "W": hw_ + 3, "stride": stride, "padding": pad}
    spec.update({"KH": k, "KW": k} if op == "depthwise_conv2d" else {"K": k})
    run_and_check(load_ops(spec)[0], H.load("pocl-cpu"), top=3)
