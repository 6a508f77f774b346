"""HIP and OpenCL kernels of the same rProgram come from the same kernel plan, so the OpenCL runs of every AMD
description's programs on PoCL (tests/backends/opencl/test_suite.py) vouch for the HIP kernels' indexing: decode
divisors, tile origins, staged-buffer strides and padding, bounds guards, output indices.

The plans differ only in how each language spells a type or a math function (``fmaxf`` / ``fmax``,
``_Float16`` / ``half``); the comparison maps those spellings and then requires every field to be equal.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

import roller.hw as H
from roller.backends import get
from roller.backends.opencl import DIALECT as CL
from roller.backends.rocm_hip import DIALECT as HIP
from roller.construction import construct
from roller.ir import load_ops

ROOT = Path(__file__).resolve().parents[3]
SCALED = load_ops(ROOT / "bench/suites/scaled.json")
AMD = ("mi50", "mi100", "mi250x", "mi300x")


def _spelling() -> dict[str, str]:
    """HIP word -> OpenCL word, from the two dialects' own tables."""
    words = {HIP.ctype[d]: CL.ctype[d] for d in HIP.ctype}
    for fn, text in HIP.funcs.items():
        for h, c in zip(re.findall(r"[A-Za-z_]\w*", text), re.findall(r"[A-Za-z_]\w*", CL.funcs[fn])):
            words[h] = c
    return {h: c for h, c in words.items() if h != c}


SPELLING = _spelling()
WORD = re.compile(r"[A-Za-z_]\w*")
# OpenCL converts a float16 element (held as ushort bits) with a function where HIP casts: the same conversion,
# spelled as the call's name instead of a cast, from the dialects' tables.
CONVERSIONS = {load.split("{")[0]: CL.to_acc.split("{")[0] for load, _ in CL.conversions.values()}
CONVERSIONS.update({store.split("{")[0]: CL.from_acc.format(ctype=ctype, x="\0").split("\0")[0]
                    for ctype, (_, store) in CL.conversions.items()})
# and stores a vector of them through its own conversion (Dialect.vector_io), where HIP renders no vectors
CONVERSIONS = {CL.vstore_format(CL.ctype["float16"]): HIP.vstore_format(HIP.ctype["float16"]), **CONVERSIONS}


def cl_casts(value: Any) -> Any:
    """An OpenCL plan with its float16 conversions spelled as casts."""
    if isinstance(value, str):
        for call, cast in CONVERSIONS.items():
            value = value.replace(call, cast)
        return value
    if isinstance(value, dict):
        return {k: cl_casts(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cl_casts(v) for v in value)
    return value


def as_opencl(value: Any) -> Any:
    if isinstance(value, str):
        return WORD.sub(lambda m: SPELLING.get(m.group(0), m.group(0)), value)
    if isinstance(value, dict):
        return {k: as_opencl(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(as_opencl(v) for v in value)
    return value


def plans(op, hw, top: int = 1):  # type: ignore[no-untyped-def]
    """(program, HIP plan, OpenCL plan) of the top programs. The OpenCL plan is lowered with 32-bit indices
    where they fit, as HIP's is: the OpenCL dialect widens every index for the CPU (``Dialect.wide_index``),
    a difference of types, not of indexing."""
    from roller.backends.c_family.plan import lower

    narrow = dataclasses.replace(CL, wide_index=False)
    for prog in construct(op, hw, top_k=top)[:top]:
        yield prog, get("hip").render(prog, hw).extra["plan"], lower(prog, narrow)


@pytest.mark.parametrize("device", AMD)
def test_hip_and_opencl_share_the_plan(device: str) -> None:
    hw = H.load(device)
    for op in SCALED:
        for prog, hip, cl in plans(op, hw, top=3):
            assert as_opencl(dataclasses.asdict(hip)) == dataclasses.asdict(cl), f"{op.name}: {prog.line()}"


def test_float16_plans_differ_only_in_spelling() -> None:
    hw = H.load("mi250x")
    op = load_ops({"op": "conv2d", "N": 2, "C": 8, "H": 9, "W": 9, "F": 16, "KH": 3, "KW": 3,
                   "dtype": "float16"})[0]
    for prog, hip, cl in plans(op, hw, top=3):
        assert "_Float16" in str(dataclasses.asdict(hip))
        assert as_opencl(dataclasses.asdict(hip)) == cl_casts(dataclasses.asdict(cl)), prog.line()


def test_the_comparison_sees_an_indexing_difference() -> None:
    """Negative control: a plan whose staged-buffer stride differs by one is caught."""
    hw = H.load("mi50")
    op = next(o for o in SCALED if o.kind == "matmul")
    _, hip, cl = next(plans(op, hw))
    staged = next(i for i, t in enumerate(hip.inputs) if t.smem_strides and t.smem_strides[0] > 1)
    hip.inputs[staged].smem_strides[0] += 1
    assert as_opencl(dataclasses.asdict(hip)) != dataclasses.asdict(cl)


def test_the_hip_source_uses_the_plan_indexing() -> None:
    """The plan's index expressions reach the HIP source verbatim (the template adds no indexing of its own)."""
    hw = H.load("mi100")
    for op in SCALED[::5]:
        prog = construct(op, hw, top_k=1)[0]
        art = get("hip").render(prog, hw)
        plan = art.extra["plan"]
        for t in plan.inputs:
            for dp in t.dims:
                assert f"= {dp.origin} + rl_d" in art.source, (op.name, dp.origin)
        assert plan.body in art.source or not plan.reduce
