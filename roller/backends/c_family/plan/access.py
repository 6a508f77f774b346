"""Tensor access: a tensor's plan, and its scalar reads from global memory with their bounds tests.

How one point of a tensor is addressed (row-major offsets, a view's gathered index), which of its indices can
leave the tensor (``index_span``, ``is_guarded``) and what such a read gives (the pad value). The scalar paths
print their reads with these, the vector path (``vector.py``) builds on them, and the schedule (``schedule.py``)
asks the same bounds questions when it decides a kernel's interior version.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from roller.backends.c_family.plan.cexpr import affine_c, c_float, index_types, row_major_strides
from roller.backends.c_family.plan.types import Dialect, TensorPlan, ViewPlan
from roller.dtypes import dtype as dtype_of
from roller.errors import InputError
from roller.ir.expr import Affine
from roller.ir.tensor_expr import TensorDecl


def tensor_plan(t: TensorDecl, d: Dialect) -> TensorPlan:
    # A view that is a plain row-major reshape (the weight of an implicit GEMM) needs no decode.
    if t.view is not None and not t.view.is_reshape():
        v = t.view
        subs = [list(reversed(dim)) for dim in v.dims]
        # Sub-axis values come from decoding a virtual index: each lies in [0, its extent).
        sub_ranges = {name: ext - 1 for dim in v.dims for name, ext in dim}
        types = [index_types(i, sub_ranges, d) for i in v.index]
        src = [affine_c(i, lambda a: f"rl_v_{a}", "" if it == "int" else it) for i, (it, _) in zip(v.index, types)]
        vp = ViewPlan(subs, src, list(v.source_shape), row_major_strides(v.source_shape), list(t.shape),
                      [it for it, _ in types], [ut for _, ut in types])
        return TensorPlan(t.name, d.ctype[t.dtype], list(t.shape), row_major_strides(t.shape), vp,
                          raw=dtype_of(t.dtype).integral)
    return TensorPlan(t.name, d.ctype[t.dtype], list(t.shape), row_major_strides(t.shape),
                      raw=dtype_of(t.dtype).integral)


def flat_coef(idx: tuple[Affine, ...] | list[Affine], strides: list[int], axis: str) -> int:
    """How far one step along ``axis`` moves the flat (row-major) offset of a plain tensor index."""
    return sum(i.coefs.get(axis, 0) * s for i, s in zip(idx, strides))


def axis_maxes(tp: TensorPlan, clamp: dict[str, int] | None,
               exact: dict[str, int] | None = None) -> dict[str, int]:
    """The largest value each axis variable takes in a read: an axis in ``clamp`` is clamped to its extent
    (points past the end compute values that are never stored), an axis in ``exact`` stays inside its extent
    on its own (a vector run wholly inside), others run to the end of their tiles (``tp.ranges``)."""
    out = dict(tp.ranges)
    for ax, n in {**(clamp or {}), **(exact or {})}.items():
        out[ax] = min(out.get(ax, n - 1), n - 1)
    return out


def is_guarded(tp: TensorPlan, dim: int, i: Affine, maxes: dict[str, int]) -> bool:
    """Whether an index can leave the tensor for axis values in [0, ``maxes``] (a window over padding, an
    offset, a stride past the end): it is tested, and outside reads give the pad value. An input read from a
    padded copy (``RProgram.pads``) never leaves it, so its windows need no test."""
    lo, hi = index_span(i, tp.lows, maxes)
    return lo < 0 or hi >= tp.sizes[dim]


def index_span(i: Affine, lows: Mapping[str, int], maxes: Mapping[str, int]) -> tuple[int, int]:
    """The least and greatest value of ``i`` for each axis in [``lows`` (default 0), ``maxes``]."""
    lo = hi = i.const
    for ax, c in i.terms:
        ends = (c * lows.get(ax, 0), c * max(maxes.get(ax, 0), 0))
        lo += min(ends)
        hi += max(ends)
    return lo, hi


def global_address(tp: TensorPlan, idx: tuple[Affine, ...], var: Callable[[str], str],
                    clamp: dict[str, int] | None, d: Dialect,
                    exact: dict[str, int] | None = None) -> tuple[list[str], str]:
    """(bounds tests, flat offset) of a plain tensor's read. Axis variables in ``clamp`` are clamped into
    their extent wherever they appear (an overhanging tile's reads stay where the tile's last point reads)."""
    conds = []
    offs = []
    maxes = axis_maxes(tp, clamp, exact)
    clamped = (lambda ax: f"min({var(ax)}, {clamp[ax] - 1})" if ax in clamp else var(ax)) if clamp else var
    for dim, i in enumerate(idx):
        itype, utype = index_types(i, tp.ranges, d)
        plain = i.plain_axis()
        wide = "" if itype == "int" else itype
        c = (f"({wide}){clamped(plain)}" if wide else clamped(plain)) if plain is not None else \
            affine_c(i, clamped, wide)
        if is_guarded(tp, dim, i, maxes):
            conds.append(f"({utype})({c}) < {tp.sizes[dim]}u")
        offs.append(f"({c}) * {tp.strides[dim]}" if tp.strides[dim] != 1 else f"({c})")
    return conds, " + ".join(offs) or "0"


def global_read(tp: TensorPlan, idx: tuple[Affine, ...], var: Callable[[str], str], pad: float,
                 d: Dialect, clamp: dict[str, int] | None = None) -> str:
    """A read straight from global memory: plain indices of clamped axes are clamped into range, other
    indices that can leave the tensor are guarded and read as the pad value."""
    if tp.view is not None:
        return _view_read(tp, idx, var, pad, d, clamp)
    conds, off = global_address(tp, idx, var, clamp, d)
    load = element(tp, f"{tp.name}[{off}]", d)
    if not conds:
        return load
    return f"({' && '.join(conds)} ? {load} : {pad_literal(tp, pad, d)})"


def element(tp: TensorPlan, at: str, d: Dialect) -> str:
    """An element as the body reads it: converted to float32, or as it is stored for a typed body's integer and
    bool tensors."""
    return at if tp.raw else d.load(tp.ctype, at)


def pad_literal(tp: TensorPlan, pad: float, d: Dialect) -> str:
    """The value a read outside the tensor gives, in the type the read has."""
    if not tp.raw:
        return c_float(pad, d)
    if not math.isfinite(pad):
        raise InputError(f"tensor {tp.name} ({tp.ctype}) is read through a window padded with {pad} (integers "
                         "have no infinity)", field="pad_value")
    return f"(({tp.ctype}){int(pad)})"


def _view_read(tp: TensorPlan, idx: tuple[Affine, ...], var: Callable[[str], str], pad: float, d: Dialect,
               clamp: dict[str, int] | None) -> str:
    """A gathered read (an im2col view) as one expression: the virtual index is decoded into sub-axes inline
    (the compiler shares the repeated divisions), then the source index is guarded against the pad region."""
    assert tp.view is not None
    v = tp.view
    subs: dict[str, str] = {}
    for dim, (i, parts) in enumerate(zip(idx, v.subs)):
        plain = i.plain_axis()
        itype, _ = index_types(i, tp.ranges, d)
        virt = f"min({var(plain)}, {clamp[plain] - 1})" if plain and clamp and plain in clamp else \
            affine_c(i, var, "" if itype == "int" else itype)
        div = 1
        for name, ext in parts:
            subs[name] = f"((({virt}) / {div}) % {ext})" if div > 1 else f"(({virt}) % {ext})"
            div *= ext
    conds, offs = [], []
    for dim, e in enumerate(v.src_index):
        c = e
        for name, text in sorted(subs.items(), key=lambda kv: -len(kv[0])):
            c = c.replace(f"rl_v_{name}", text)
        conds.append(f"({v.src_utypes[dim]})({c}) < {v.src_sizes[dim]}u")
        offs.append(f"({c}) * {v.src_strides[dim]}" if v.src_strides[dim] != 1 else f"({c})")
    load = element(tp, f"{tp.name}[{' + '.join(offs)}]", d)
    return f"({' && '.join(conds)} ? {load} : {pad_literal(tp, pad, d)})"
