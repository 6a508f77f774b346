"""Runtime extents: one kernel serves every value of a symbol that is not the op's leading axis.

Attention's key length is an inner axis of its scores and a reduced axis of its context: a kernel built for
the greatest length and launched on a prefix of its grid (``roller.construction.generic``) would compute the
wrong thing there. Instead the kernel takes the symbol's value ``n`` as an argument (``RProgram.runtime``):
every tensor keeps the layout it has at the greatest value ``G`` (a dimension of the symbol is ``G`` long in
memory, its first ``n`` entries meaningful), the grid covers ``n`` along each spatial axis of the symbol, and
reductions along it stop at ``n``. Points the last block computes past ``n`` read and write that layout's
padding, which nobody reads as data. So one compiled kernel serves every ``n``, and the model picks among a
few such kernels per size (the kernel set of ``generic``).

Exact when every dimension that grows with the symbol is indexed by one axis of the symbol, plainly (no
offset, stride or window: a point inside ``n`` then reads only entries inside ``n``, with no bounds test that
would differ between ``n`` and ``G``), and that axis grows with no other factor.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from roller.construction import prepared
from roller.hw import HardwareDesc
from roller.ir.expr import Affine
from roller.ir.symbolic import SymbolicOp
from roller.ir.tensor_expr import TensorDecl, TensorExpr
from roller.program import RProgram, launch_counts


@dataclass(frozen=True)
class RuntimeAxes:
    """How the symbol shows in the prepared op: the axes that run to its value (``axes``, each with factor 1)
    and, per tensor, the dimensions they index (tensor -> ((dimension, axis), ...)) and the same dimensions
    in the tensor as written (before axis fusion: tensor -> (dimension, ...), in the same order)."""

    symbol: str
    axes: tuple[str, ...]
    dims: tuple[tuple[str, tuple[tuple[int, str], ...]], ...]
    greatest: int
    written: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def runtime(self) -> tuple[tuple[str, int], ...]:
        """``RProgram.runtime`` of a program of this op."""
        return tuple((a, 1) for a in self.axes)

    @property
    def tensors(self) -> tuple[str, ...]:
        return tuple(t for t, _ in self.dims)


def _indices(expr: TensorExpr, name: str) -> list[tuple[Affine, ...]]:
    return [expr.out_index] if name == expr.output.name else expr.accesses(name)


def reduced(expr: TensorExpr) -> set[str]:
    """The axes a kernel walks whole: the reduction's, or a row kernel's columns."""
    if expr.stages:
        return {a.name for a in expr.axes} - set(expr.row_axes)
    return {a.name for a in expr.reduce_axes}


@dataclass(frozen=True)
class TwoSizes:
    """An op's one varying symbol, as written and prepared at its greatest value ``hi`` and at ``other``: how
    a kernel set finds what changes with it."""

    symbol: str
    hi: int
    other: int
    src_top: TensorExpr
    src_low: TensorExpr
    top: TensorExpr
    low: TensorExpr


def two_sizes(op: SymbolicOp, hw: HardwareDesc, what: str) -> TwoSizes | str:
    """``op`` at its symbol's greatest value and at another (2, or the least), or why not (``what`` serves
    one symbol)."""
    varying = [s for s, (lo, hi) in op.ranges.items() if lo < hi]
    if len(varying) != 1:
        return f"{len(varying)} symbols vary; {what} one" if varying else "no symbol varies"
    sym = varying[0]
    lo, hi = op.ranges[sym]
    other = max(lo, 2) if hi > max(lo, 2) else lo
    base = {s: r[1] for s, r in op.ranges.items()}
    src_top, src_low = op.instantiate(base), op.instantiate({**base, sym: other})
    return TwoSizes(sym, hi, other, src_top, src_low, prepared(src_top, hw, align=False),
                    prepared(src_low, hw, align=False))


def runtime_axes(op: SymbolicOp, hw: HardwareDesc, at: TwoSizes | None = None) -> RuntimeAxes | str:
    """The symbol's axes where one kernel with runtime extents serves every size, else why not (``at``: the op
    at two sizes, when the caller has prepared them already)."""
    sizes = at or two_sizes(op, hw, "a kernel with runtime extents takes")
    if isinstance(sizes, str):
        return sizes
    at = sizes
    sym, hi, other = at.symbol, at.hi, at.other
    src_top, src_low, top, low = at.src_top, at.src_low, at.top, at.low
    if top.preparation != low.preparation or len(top.axes) != len(low.axes):
        return f"{sym} changes how the op is prepared"
    if top.preparation is not None and top.preparation.pads:
        return "the op reads padded copies of its inputs (their padding would move with the size)"
    axes = []
    for a, b in zip(top.axes, low.axes):
        if (a.name, a.reduce) != (b.name, b.reduce):
            return f"{sym} changes the op's axes"
        if a.extent != b.extent:
            if (a.extent, b.extent) != (hi, other):
                return f"axis {a.name} grows with {sym} by a factor (fused with other axes)"
            axes.append(a.name)
    if not axes:
        return f"no axis of the op grows with {sym}"
    same = ("name", "kind", "out_index", "reduce_op", "body", "pad_value", "acc_dtype", "epilogue", "stages",
            "row_axes")
    if any(getattr(top, f) != getattr(low, f) for f in same):
        return f"the op's statement changes with {sym}"
    grown = set(axes)
    dims = []
    written = []
    for t, u in zip(top.tensors, low.tensors):
        w_top, w_low = src_top.tensor(t.name), src_low.tensor(t.name)
        if (t.name, t.dtype, len(t.shape)) != (u.name, u.dtype, len(u.shape)):
            return f"tensor {t.name} changes with {sym} other than in its sizes"
        indices = _indices(top, t.name)
        if t.view is not None:
            if t != u or any(grown & set(i.coefs) for idx in indices for i in idx):
                return f"tensor {t.name} is read through a view along {sym}"
            continue
        by_dim = []
        for d, (x, y) in enumerate(zip(t.shape, u.shape)):
            if x == y:
                if any(grown & set(idx[d].coefs) for idx in indices):
                    return f"tensor {t.name} is read along {sym} in a dimension that does not grow with it"
                continue
            plain = {idx[d].plain_axis() for idx in indices}
            if (x, y) != (hi, other) or len(plain) != 1 or not plain <= grown:
                return f"tensor {t.name}'s dimension {d} grows with {sym} but is not indexed by its axis alone"
            by_dim.append((d, plain.pop() or ""))
        as_written = tuple(d for d, (x, y) in enumerate(zip(w_top.storage_shape, w_low.storage_shape)) if x != y)
        if len(as_written) != len(by_dim) or any((w_top.storage_shape[d], w_low.storage_shape[d]) != (hi, other)
                                                 for d in as_written):
            return f"tensor {t.name} as written grows with {sym} other than the dimensions its axes index"
        if by_dim:
            dims.append((t.name, tuple(by_dim)))
            written.append((t.name, as_written))
    return RuntimeAxes(sym, tuple(axes), tuple(dims), hi, tuple(written))


def at_extents(top: TensorExpr, ra: RuntimeAxes, extents: Mapping[str, int], source: TensorExpr) -> TensorExpr:
    """The prepared op ``top`` (at the greatest size) with its runtime axes at ``extents`` (axis -> extent) and
    the dimensions they index sized alike: the same form, as a kernel of the set computes it at a size (the
    model predicts it so)."""
    by_tensor = dict(ra.dims)
    as_written = dict(ra.written)

    def grow(t: TensorDecl) -> TensorDecl:
        if t.name not in by_tensor:
            return t
        shape = list(t.shape)
        orig = list(t.orig_shape) if t.orig_shape is not None else None
        for (d, a), w in zip(by_tensor[t.name], as_written[t.name]):
            shape[d] = extents[a]
            if orig is not None:
                orig[w] = extents[a]
        return dataclasses.replace(t, shape=tuple(shape), orig_shape=tuple(orig) if orig is not None else None)

    axes = tuple(dataclasses.replace(a, extent=extents[a.name]) if a.name in extents else a for a in top.axes)
    return dataclasses.replace(top, axes=axes, output=grow(top.output), inputs=tuple(grow(t) for t in top.inputs),
                               source=source)


def covered(prog: RProgram, ra: RuntimeAxes, value: int) -> dict[str, int]:
    """The extent each runtime axis is computed to at ``value``: a spatial axis to the end of its last block
    (at most the greatest size's extent), a reduced axis exactly."""
    out = {}
    walked = reduced(prog.expr)
    for a, b in zip(prog.expr.axes, prog.block_tile.shape):
        if a.name in ra.axes:
            out[a.name] = value if a.name in walked else min(-(-value // b) * b, a.extent)
    return out


def waste(prog: RProgram, ra: RuntimeAxes, value: int) -> float:
    """How many times the points the size has a program computes at ``value`` (its partial blocks)."""
    ratio = 1.0
    for extent in covered(prog, ra, value).values():
        ratio *= extent / value
    return ratio


def blocks(prog: RProgram, ra: RuntimeAxes, value: int) -> int:
    """The grid at ``value``: the blocks covering ``value`` along each runtime spatial axis, times the others."""
    expr = dataclasses.replace(prog.expr, axes=tuple(dataclasses.replace(a, extent=value) if a.name in ra.axes
                                                     else a for a in prog.expr.axes))
    from roller.construction import row_proxy

    grid, _ = launch_counts(row_proxy(expr) if expr.stages else expr, prog.block_tile, prog.thread_tile,
                            prog.reduce_threads)
    return grid


def rows(prog: RProgram, ra: RuntimeAxes, value: int) -> int:
    """Entries of the symbol's dimensions the launched blocks reach at ``value`` (a tensor whose rows of the
    symbol lead it is held at a capacity of at least this many)."""
    return max([value, *covered(prog, ra, value).values()])
