"""Timing candidates on the device (``roller.compiler.tune``): early stopping and operators evaluated together."""
from __future__ import annotations

from pathlib import Path

import pytest

from roller.backends import get
from roller.compiler.target import Target
from roller.compiler.tune import FIRST_ROUND, evaluate, evaluate_many
from roller.construction import construct
from roller.ir.opfile import load_op

needs_cl = pytest.mark.skipif(not get("opencl").can_run_here(), reason=get("opencl").why_not_here())

MM = {"name": "mm_tune", "op": "matmul", "M": 96, "N": 80, "K": 64}
CONV = {"name": "conv_tune", "op": "conv2d", "N": 1, "C": 16, "H": 14, "W": 14, "F": 24, "KH": 3, "KW": 3}


def _programs(spec: dict, top_k: int = 10) -> tuple:
    op = load_op(spec)
    target = Target.resolve("pocl-cpu")
    return op, construct(op, target.hw, top_k=top_k), target


def _agrees_with_early_stop(cands: list) -> None:
    """Every candidate timed after the first round was asked for by the one before it (the fastest so far);
    the ones never reached come after every timed one and say why."""
    timed = [c for c in cands if c.measured_s is not None]
    assert len(timed) >= min(FIRST_ROUND, len(cands))
    last = max(i for i, c in enumerate(cands) if c.measured_s is not None or c.error and
               not c.error.startswith("not timed"))
    for i in range(FIRST_ROUND, last + 1):
        before = [c.measured_s for c in cands[:i] if c.measured_s is not None]
        assert cands[i - 1].measured_s is None or cands[i - 1].measured_s <= min(before), (i, before)
    for c in cands[last + 1:]:
        assert c.measured_s is None and c.error.startswith("not timed")
    if last + 1 < len(cands):   # it stopped: the last one timed did not beat an earlier one
        ran = [c.measured_s for c in cands[:last + 1] if c.measured_s is not None]
        assert cands[last].measured_s is not None and cands[last].measured_s > min(ran)


@needs_cl
def test_early_stop_times_in_rank_order_until_the_ranking_holds():
    op, progs, target = _programs(MM)
    ev = evaluate(op, progs, target.hw, target.backend, repeat=3, progress=False)
    _agrees_with_early_stop(ev.candidates)
    assert ev.chosen.measured_s == min(c.measured_s for c in ev.candidates if c.measured_s is not None)
    assert ev.check["ok"] is True
    js = ev.to_json()
    assert [c["measured_ms"] is None for c in js["candidates"]] == [c.measured_s is None for c in ev.candidates]


@needs_cl
def test_without_early_stop_every_candidate_is_timed():
    op, progs, target = _programs(MM, top_k=5)
    ev = evaluate(op, progs, target.hw, target.backend, repeat=2, progress=False, early_stop=False)
    assert all(c.measured_s is not None for c in ev.candidates)


@needs_cl
def test_operators_evaluated_together_each_get_their_own_choice():
    (mm, mm_progs, target), (conv, conv_progs, _) = _programs(MM, 6), _programs(CONV, 6)
    found = evaluate_many([(mm, mm_progs), (conv, conv_progs)], target.hw, target.backend, repeat=2,
                          progress=False)
    assert len(found) == 2
    for ev, op in zip(found, (mm, conv)):
        assert not isinstance(ev, Exception), ev
        assert ev.op is op and ev.check["ok"] is True
        _agrees_with_early_stop(ev.candidates)
        assert ev.chosen.program.expr.name == op.name


def test_nothing_to_evaluate_together_is_no_evaluation():
    target = Target.resolve("pocl-cpu")
    assert evaluate_many([], target.hw, target.backend) == []


@needs_cl
def test_a_timed_model_builds_again_from_the_cache():
    """The second evaluate=True build of a model finds every kernel and every layout's time in the cache, and
    decides as the first did."""
    import numpy as np

    import roller

    path = Path(__file__).parents[2] / "examples" / "models" / "mini_resnet.onnx"
    first = roller.compile_model(path, "pocl-cpu", top_k=4, evaluate=True, progress=False)
    again = roller.compile_model(path, "pocl-cpu", top_k=4, evaluate=True, progress=False)
    assert again.cache_hits == len(again.by_key) > 0
    x = first.random_inputs(0)
    for a, b in zip(first.run(x).values(), again.run(x).values()):
        np.testing.assert_array_equal(a, b)
    assert list(first.by_key) == list(again.by_key)
    assert [k.chosen for k in first.by_key.values()] == [k.chosen for k in again.by_key.values()]
