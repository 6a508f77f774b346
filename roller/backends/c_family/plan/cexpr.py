"""C expressions: constants, affine indices and their integer types, the body and epilogue, and folds.

The text every part of the lowering writes indices and values in, and nothing about which reads, loops or
vectors a kernel has: these functions print what they are given. The IPU backend renders its vertices' bodies
with them too, so they import nothing of the rest of the plan but its data (``types.py``).
"""
from __future__ import annotations

import math
from collections.abc import Callable

from roller.backends.c_family.plan.types import Dialect, TensorPlan
from roller.ir.expr import Affine, AxisValue, BinOp, Call, Const, Expr, Neg, Read
from roller.ir.tensor_expr import TensorExpr


def c_float(v: float, d: Dialect) -> str:
    if math.isinf(v):
        return d.infinity if v > 0 else f"(-{d.infinity})"
    if math.isnan(v):
        return "NAN"
    text = repr(float(v))
    if "e" not in text and "." not in text:
        text += ".0"
    return f"{text}{d.float_suffix}" if d.float_suffix else text


INT32_MAX = 2**31 - 1


def reach(a: Affine, ranges: dict[str, int]) -> int:
    """A bound on the magnitude of an index and of every partial sum C computes it through, for axis values in
    [0, ranges[axis]]."""
    return abs(a.const) + sum(abs(c) * max(ranges.get(ax, 0), 0) for ax, c in a.terms)


def index_types(a: Affine, ranges: dict[str, int], d: Dialect) -> tuple[str, str]:
    """(signed, unsigned) C types an index is computed in: ``int`` where every value it and its partial sums take
    is proven to fit 32 bits (the shapes, coefficients and tile extents are all known here), else the dialect's
    64-bit types. With 32 bits, ``X[4294967296*i+1]`` would wrap to a small index that passes the bounds test
    while the load used all 64 bits of the product (the IR bounds every index by 2^62, so 64 bits always hold)."""
    if reach(a, ranges) <= INT32_MAX and not d.wide_index:
        return "int", "unsigned"
    return d.wide_int, d.wide_uint


def affine_c(a: Affine, var: Callable[[str], str], wide: str = "") -> str:
    """``a`` as C over the axis variables ``var(axis)``; ``wide`` (a 64-bit type) converts each variable first,
    so that the products and sums are computed in 64 bits."""
    parts = []
    for ax, c in a.terms:
        v = f"({wide}){var(ax)}" if wide else var(ax)
        parts.append(v if c == 1 else f"{c} * {v}")
    if a.const or not parts:
        parts.append(str(a.const))
    return " + ".join(parts).replace("+ -", "- ")


def row_major_strides(sizes: list[int] | tuple[int, ...]) -> list[int]:
    out = [1] * len(sizes)
    for i in range(len(sizes) - 2, -1, -1):
        out[i] = out[i + 1] * sizes[i + 1]
    return out


def var_global(ax: str) -> str:
    return f"rl_g_{ax}"


def render_body(e: Expr, d: Dialect, read: Callable[[Read], str], vtype: str = "",
                axis: Callable[[str], str] | None = None) -> str:
    """The body as a C expression; ``axis(name)`` renders an axis's value. With ``vtype`` (a vector type, CPU
    kernels) reads are vectors and a call's arguments are converted to ``vtype`` (a scalar constant broadcast):
    the generated helpers (rl_max_v ...) take vectors only. Function templates name them through ``{v}``."""
    if isinstance(e, Const):
        return c_float(e.value, d)
    if isinstance(e, Read):
        return read(e)
    if isinstance(e, AxisValue):
        if axis is None:
            raise TypeError(f"no rendering for the value of axis {e.axis}")
        return axis(e.axis)
    if isinstance(e, Neg):
        return f"(-{render_body(e.x, d, read, vtype, axis)})"
    if isinstance(e, BinOp):
        return f"({render_body(e.lhs, d, read, vtype, axis)} {e.op} {render_body(e.rhs, d, read, vtype, axis)})"
    if isinstance(e, Call):
        args = [render_body(a, d, read, vtype, axis) for a in e.args]
        if vtype:
            args = [f"(({vtype})({a}))" for a in args]
        return d.funcs[e.fn].format(*args, zero=c_float(0.0, d), one=c_float(1.0, d), v="_v" if vtype else "")
    raise TypeError(e)


def render_epilogue(expr: TensorExpr, d: Dialect, plans: list[TensorPlan], value: str,
                    read: Callable[[TensorPlan, tuple[Affine, ...]], str], vtype: str = "") -> str:
    """The epilogue as a C expression over ``value`` (the reduced value, or a vector of them); ``value`` itself
    where there is none."""
    if expr.epilogue is None:
        return value
    by_name = {tp.name: tp for tp in plans}
    return render_body(expr.epilogue, d, lambda r: value if r.tensor == expr.output.name else
                       read(by_name[r.tensor], r.index), vtype)


def combine_stmt(reduce_op: str | None, d: Dialect, vector: bool = False) -> str:
    """The statement folding ``{val}`` into ``{acc}`` (a template for str.format)."""
    if reduce_op == "sum":
        return "{acc} += {val};"
    if reduce_op in ("max", "min"):
        fold = d.funcs[reduce_op].format("{acc}", "{val}", zero="", one="", v="_v" if vector else "")
        return "{acc} = " + fold + ";"
    return "{acc} = {val};"
