"""Hypothesis strategies for hostile op files (used by tests/compiler/test_hostile_fuzz.py and scripts/fuzz_run_check.py).

An op is drawn the way a careless or hostile user might write one: index coefficients and constants at the
edges of 32 and 64 bits, axes used only through ``extents``, reductions by every assignment, axis values and
every function in bodies, names that clash with the target languages, float16 and bfloat16, odd pad values.
Most drawn ops are valid; some are not, and must then fail as an InputError.
"""
from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import strategies as st

from roller.backends import for_hw
from roller.construction import construct
from roller.errors import InputError
from roller.hw import load
from roller.ir.expr import BINARY_FUNCS, UNARY_FUNCS

# Index coefficients and constants: mostly small, sometimes at the limits generated code must survive.
EDGES = [2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**40, 2**61, 2**62 - 1, 2**62, 2**63, 10**19]
COEF = st.one_of(st.integers(-3, 3), st.sampled_from(EDGES + [-e for e in EDGES]))
CONST = st.one_of(st.integers(-4, 4), st.sampled_from(EDGES + [-e for e in EDGES]))
TENSORS = ["X", "W", "B2", "fmax", "gamma", "input"] * 4 + ["FLT_MAX", "half2", "mix"]
OUT_AXES = ["i", "j", "m"]
RED_AXES = ["k", "r"]


@st.composite
def index_expr(draw: Any, axes: list[str]) -> str:
    """An affine index over ``axes`` (or a constant)."""
    terms = []
    for a in draw(st.lists(st.sampled_from(axes), max_size=2, unique=True)) if axes else []:
        c = draw(COEF)
        terms.append(a if c == 1 else f"{c}*{a}")
    const = draw(st.one_of(st.just(0), CONST))
    text = " + ".join(terms) or str(const)
    if terms and const:
        text += f" + {const}" if const > 0 else f" - {-const}"
    return text.replace("+ -", "- ")


@st.composite
def op_doc(draw: Any) -> dict[str, Any]:
    """One generic op object."""
    out_axes = draw(st.lists(st.sampled_from(OUT_AXES), max_size=2, unique=True))
    red_axes = draw(st.lists(st.sampled_from(RED_AXES), max_size=2, unique=True))
    axes = out_axes + red_axes
    names = draw(st.lists(st.sampled_from(TENSORS), min_size=1, max_size=3, unique=True))
    shapes: dict[str, list[int]] = {}
    plain: set[str] = set()
    reads: list[str] = []
    for name in names:
        rank = draw(st.integers(0, 3))
        shape, index = [], []
        for _ in range(rank):
            if axes and draw(st.booleans()):
                a = draw(st.sampled_from(axes))  # a plain index: the dimension gives the axis's extent
                plain.add(a)
                index.append(a)
            else:
                index.append(draw(index_expr(axes)))
            shape.append(draw(st.integers(1, 6)))
        shapes[name] = shape
        reads.append(f"{name}[{','.join(index)}]")

    def body(depth: int) -> Any:
        leaf = st.one_of(st.sampled_from(reads), st.sampled_from(["2", "0.5", "inf", "0"]),
                         st.sampled_from(axes) if axes else st.sampled_from(reads))
        if depth == 0:
            return leaf
        sub = body(depth - 1)
        return st.one_of(
            leaf,
            st.tuples(sub, st.sampled_from(["+", "-", "*", "/"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            st.tuples(st.sampled_from(UNARY_FUNCS), sub).map(lambda t: f"{t[0]}({t[1]})"),
            st.tuples(st.sampled_from(BINARY_FUNCS), sub, sub).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
            sub.map(lambda x: f"-{x}"))

    text = draw(body(2))
    # Only what the body uses: shapes and extents of anything else are errors of their own (tested apart).
    used = set(re.findall(r"[A-Za-z_]\w*", text))
    shapes = {n: shp for n, shp in shapes.items() if n in used}
    reducing = any(a in used for a in red_axes)
    assign = draw(st.sampled_from(["+=", "+=", "max=", "min=", "="] if reducing else ["=", "=", "+="]))
    doc: dict[str, Any] = {"name": draw(st.sampled_from(["op", "g", "k2"] * 3 + ["build", "dot"])),
                           "expr": f"Y[{','.join(out_axes)}] {assign} {text}", "shapes": shapes}
    extents = {a: draw(st.integers(1, 5)) for a in axes if a not in plain and (a in used or a in out_axes)}
    if extents:
        doc["extents"] = extents
    if out_axes and draw(st.booleans()):
        doc["shapes"]["Y"] = [extents.get(a, draw(st.integers(1, 6))) for a in out_axes]
    dtype = draw(st.sampled_from(["float32"] * 6 + ["float16", "bfloat16"]))
    if dtype != "float32":
        doc["dtype"] = dtype
    if draw(st.integers(0, 9)) == 0:
        doc["dtypes"] = {names[0]: draw(st.sampled_from(["float16", "float32"]))}
    pad = draw(st.sampled_from([None] * 4 + [0, 1.5, "-inf", "inf", 3.5e38, -1e39]))
    if pad is not None:
        doc["pad_value"] = pad
    return doc


def op_text(doc: dict[str, Any]) -> str:
    return json.dumps(doc)


# Every description with its own backend, and rendered as OpenCL (what runs here).
DESCRIPTIONS = ["a100", "h100", "h200", "ipu-gc2", "ipu-gc200", "mi100", "mi250x", "mi300x", "mi50", "pocl-cpu",
                "v100"]


def build(expr: Any, hw_name: str, backend: str | None) -> Any:
    """Construct the top-1 program of ``expr`` for a description and render it (no compile): the artifact.
    InputError is the only acceptable failure (what a description cannot hold or a backend cannot render)."""
    hw = load(hw_name)
    be = for_hw(hw, backend)
    prog = construct(expr, hw, top_k=1)[0]
    return hw, be, be.render(prog, hw)


__all__ = ["DESCRIPTIONS", "InputError", "build", "index_expr", "op_doc", "op_text"]
