"""Generated hostile ops: whatever ``roller op check`` accepts must build for every description, and run and
check correctly here; whatever it rejects must be an InputError. Nothing may escape as another exception.

10,000 ops go through op check and construction + rendering (every description, its own backend or OpenCL);
a smaller sample runs on the local OpenCL device under ``run --check``'s check. scripts/fuzz_run_check.py
runs the large version of the latter (see the report in its docstring).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roller.backends import require_device
from roller.compiler.check import check_against
from roller.errors import InputError
from roller.ir.opdoc import read_json
from roller.ir.opfile import parse_ops
from roller.ir.reference import random_inputs
from tests.support.fuzz_ops import DESCRIPTIONS, build, op_doc

FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=list(HealthCheck))


def op_check(doc: dict) -> object | None:
    """What ``roller op check`` does with this op file's text: the parsed op, or None when rejected (only as
    an InputError: anything else propagates and fails the test)."""
    text = json.dumps(doc)
    try:
        return parse_ops(read_json(text, "fuzz.json"), "fuzz.json")[0]
    except InputError:
        return None


@settings(FUZZ, max_examples=10_000)
@given(doc=op_doc(), where=st.sampled_from(DESCRIPTIONS), opencl=st.booleans())
def test_op_check_and_build(doc: dict, where: str, opencl: bool) -> None:
    expr = op_check(doc)
    if expr is None:
        return
    try:
        build(expr, where, "opencl" if opencl else None)
    except InputError as err:
        # What a description or a backend cannot take, said in one line: too large for an IPU tile, a
        # matrix-instruction program for OpenCL, a dtype the backend has no type for.
        assert any(s in str(err) for s in ("no program fits", "warp-level matrix", "no type for",
                                           "generates float32 codelets only", "gather view")), str(err)


_DEVICE_OK = True
try:
    from roller.backends import get

    require_device(get("opencl"))
except Exception:  # noqa: BLE001 - no OpenCL device: the run half is skipped
    _DEVICE_OK = False


@pytest.mark.skipif(not _DEVICE_OK, reason="no OpenCL device")
@settings(FUZZ, max_examples=150)
@given(doc=op_doc(), where=st.sampled_from(DESCRIPTIONS))
def test_op_check_build_run_check(doc: dict, where: str) -> None:
    expr = op_check(doc)
    if expr is None:
        return
    try:
        hw, be, art = build(expr, where, "opencl")
    except InputError:
        return
    x = random_inputs(expr, seed=1)
    # A compile failure (exit 3) or a check failure (exit 4) of an op that op check accepted is a bug.
    out = be.compile(art, hw)([x[t.name] for t in expr.inputs])
    check_against(f"{expr.name} on {where}: {expr.statement()}", expr, x, np.asarray(out))
