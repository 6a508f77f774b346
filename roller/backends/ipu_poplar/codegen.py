"""Rendering a graph plan as the Poplar sources: codelets, the plan header, the host program and a Makefile.

Every file comes from a Jinja2 template in ``templates/``; this module only prepares what they print: the
body of one point as a C++ expression (with the shared C-family expression printer), and per tensor the
one-line index expressions. The vertex fields are listed once (``fields``) so that the host program sets
exactly the fields the codelet declares.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from roller.backends.c_family.plan import INT32_MAX, Dialect, reach, render_body
from roller.backends.ipu_poplar.plan import AxisMap, GraphPlan, TensorMap, dumps, interval
from roller.ir.expr import Affine, Const, Read
from roller.ir.tensor_expr import TensorExpr

TEMPLATES = Path(__file__).parent / "templates"

# Codelets are plain C++ compiled by popc (or by g++ against the test stand-in): <cmath> in float.
DIALECT = Dialect(
    ctype={"float32": "float"},
    funcs={"exp": "std::exp({0})", "log": "std::log({0})", "sqrt": "std::sqrt({0})",
           "rsqrt": "({one} / std::sqrt({0}))", "tanh": "std::tanh({0})", "erf": "std::erf({0})",
           "sigmoid": "({one} / ({one} + std::exp(-({0}))))", "relu": "rl_relu({0})",
           "abs": "std::fabs({0})", "max": "rl_max({0}, {1})", "min": "rl_min({0}, {1})",
           "cos": "std::cos({0})", "sin": "std::sin({0})",
           "round": "std::nearbyint({0})", "pow": "std::pow({0}, {1})", "fmod": "std::fmod({0}, {1})"},
    to_acc="{x}", from_acc="{x}")

FILES = ("codelets.cpp", "host.cpp", "graph_plan.hpp", "graph_plan.json", "Makefile")

_ENV: jinja2.Environment | None = None


def environment() -> jinja2.Environment:
    global _ENV
    if _ENV is None:
        _ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                                  undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                  trim_blocks=True, lstrip_blocks=True, autoescape=False)
    return _ENV


@dataclass(frozen=True)
class Field:
    """A scalar vertex field and where its value comes from in a ``VertexPlan`` (graph_plan.hpp)."""

    name: str
    source: str
    comment: str


def fields(p: GraphPlan) -> list[Field]:
    out = [Field(f"rl_o_{a.name}", f"origin[{i}]", f"first {a.name} of the block tile")
           for i, a in enumerate(p.spatial)]
    for t in p.tensors:
        for d in range(len(t.shape)):
            if not t.output:
                out.append(Field(f"rl_lo_{t.name}_{d}", f"box_{t.name}.begin[{d}]",
                                 f"first index of the {t.name} slice in dimension {d}"))
            out.append(Field(f"rl_n_{t.name}_{d}", f"box_{t.name}.extent({d})",
                             f"extent of the {t.name} slice in dimension {d}"))
    return out


def _affine(i: Affine, var: str = "rl_g_", wide: str = "") -> str:
    """``i`` as C++ over ``var<axis>``; ``wide`` (a 64-bit type) converts each variable first."""
    cast = f"({wide})" if wide else ""
    parts = [f"{cast}{var}{a}" if c == 1 else f"{c} * {cast}{var}{a}" for a, c in i.terms]
    if i.const or not parts:
        parts.append(str(i.const))
    return " + ".join(parts).replace("+ -", "- ")


def _bound(i: Affine, low: bool) -> str:
    """The lowest (or highest) value of an index over the block's ranges ``rl_lo_<axis>``..``rl_hi_<axis>``."""
    parts = []
    for a, c in i.terms:
        end = "lo" if (c > 0) == low else "hi"
        parts.append(f"rl_{end}_{a}" if c == 1 else f"{c} * rl_{end}_{a}")
    if i.const or not parts:
        parts.append(str(i.const))
    return " + ".join(parts).replace("+ -", "- ")


def _read(t: TensorMap, r: Read, extents: dict[str, int], pad: str) -> str:
    offs, conds = [], []
    full = {a: (0, e - 1) for a, e in extents.items()}
    for d, i in enumerate(r.index):
        # 32 bits where every value of the index (and its partial sums) is proven to fit, else 64 (an IPU's int
        # and long are 32 bits): a wrapped index would pass the bounds test and read elsewhere.
        wide = reach(i, {a: e - 1 for a, e in extents.items()}) > INT32_MAX
        itype, utype = ("long long", "unsigned long long") if wide else ("int", "unsigned")
        local = f"({_affine(i, wide=itype if wide else '')} - ({itype})rl_lo_{t.name}_{d})"
        offs.append(local if d == len(r.index) - 1 else f"{local} * rl_s_{t.name}_{d}")
        lo, hi = interval(i, full)
        if lo < 0 or hi >= t.shape[d]:
            conds.append(f"({utype}){local} < rl_n_{t.name}_{d}")
    load = f"{t.name}[{' + '.join(offs) or '0'}]"
    return f"({' && '.join(conds)} ? {load} : {pad})" if conds else load


def _combine(reduce_op: str | None) -> tuple[str, str]:
    """(initial accumulator, statement folding ``rl_v`` into ``rl_acc[rl_j]``)."""
    if reduce_op == "sum":
        return "0.0f", "rl_acc[rl_j] += rl_v;"
    if reduce_op == "max":
        return "(-INFINITY)", "rl_acc[rl_j] = rl_max(rl_acc[rl_j], rl_v);"
    if reduce_op == "min":
        return "INFINITY", "rl_acc[rl_j] = rl_min(rl_acc[rl_j], rl_v);"
    return "0.0f", "rl_acc[rl_j] = rl_v;"


def _point(a: AxisMap) -> str:
    """Coordinate along spatial axis ``a`` of register point ``rl_j`` of this worker's thread tile."""
    text = f"(int)rl_o_{a.name} + rl_t_{a.name}"
    if a.thread > 1:
        text += f" + (int)((rl_j / {a.jdiv}u) % {a.thread}u)"
    return text


def context(p: GraphPlan, expr: TensorExpr, hw_target: str) -> dict[str, Any]:
    tensors = {t.name: t for t in p.tensors}
    pad = render_body(Const(p.pad_value), DIALECT, lambda r: "")
    body = render_body(expr.body, DIALECT, lambda r: _read(tensors[r.tensor], r, expr.extents, pad),
                       axis=lambda a: f"((float)rl_g_{a})")
    # The epilogue (a fused bias, activation...) over the reduced value, read from the same block slices.
    epilogue = "rl_acc[rl_j]" if expr.epilogue is None else render_body(
        expr.epilogue, DIALECT, lambda r: "rl_acc[rl_j]" if r.tensor == expr.output.name else
        _read(tensors[r.tensor], r, expr.extents, pad))
    init, combine = _combine(expr.reduce_op if p.reduce else None)
    out_axes = [i.plain_axis() for i in expr.out_index]
    out_offs = []
    for d, a in enumerate(out_axes):
        local = f"(rl_g_{a} - (int)rl_o_{a})"
        out_offs.append(local if d == len(out_axes) - 1 else f"{local} * rl_s_{p.output.name}_{d}")
    strides = {t.name: [" * ".join(f"rl_n_{t.name}_{e}" for e in range(d + 1, len(t.shape)))
                        for d in range(len(t.shape) - 1)] for t in p.tensors}
    slices = {t.name: [(" , ".join(_bound(i, True) for i in accs), ", ".join(_bound(i, False) for i in accs),
                        len(accs) > 1) for accs in t.dims] for t in p.tensors}
    cycles = max(1, p.thread_points * p.reduce_points * max(1, expr.flops_per_point))
    return {
        "p": p, "fields": fields(p), "body": body, "epilogue": epilogue, "acc_init": init, "combine": combine,
        "out_offset": " + ".join(out_offs) or "0", "strides": strides, "slices": slices,
        "guard": " || ".join(f"rl_g_{a.name} >= {a.extent}" for a in p.spatial if a.partial),
        "point": {a.name: _point(a) for a in p.spatial}, "target": hw_target, "cycles": cycles, "ns": f"rl_{p.op}",
        "reshaped": {t.name: t.shape != t.storage_shape for t in p.tensors},
    }


def render_all(p: GraphPlan, expr: TensorExpr) -> dict[str, str]:
    env = environment()
    ctx = context(p, expr, p.target)
    files = {name: env.get_template(f"{name}.j2").render(**ctx) for name in FILES if name != "graph_plan.json"}
    files["graph_plan.json"] = dumps(p.to_json())
    return {name: files[name] for name in FILES}
