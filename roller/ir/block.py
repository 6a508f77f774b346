"""Channel-blocked layouts of an operator's tensors (NCHW16c and the like): one axis split into an outer and an
inner part, and the tensors that hold it as a plain dimension stored with the inner part innermost.

A CPU kernel computes a register tile of vectors along its last spatial axis. A depthwise convolution over a
7x7 image in NCHW has 7 points there, less than half a 16-lane vector; with its channels in blocks of 16 stored
innermost (``X[n, c/16, h, w, c%16]``) every vector is whole and every read a contiguous line (on PoCL, 960
channels at 7x7: 68 us in NCHW, 22 us blocked). ``roller.graph.blocking`` decides which values are stored so.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

import numpy as np

from roller.ir.expr import Affine, Read, axis_values, gathers
from roller.ir.identifiers import check_name
from roller.ir.tensor_expr import Axis, TensorDecl, TensorExpr


def split_names(expr: TensorExpr, axis: str) -> tuple[str, str]:
    """Names for the outer and inner parts of ``axis`` that no axis or tensor of ``expr`` has and that generated
    source may use (an axis ``d`` would make ``do``, a keyword)."""
    taken = {a.name for a in expr.axes} | {t.name for t in expr.tensors} | {st.name for st in expr.stages}
    k = 0
    while True:
        outer, inner = (f"{axis}o", f"{axis}i") if k == 0 else (f"{axis}o{k}", f"{axis}i{k}")
        if not ({outer, inner} & taken) and check_name(outer, "tensor") is None \
                and check_name(inner, "tensor") is None:
            return outer, inner
        k += 1


def blocked_dim(expr: TensorExpr, tensor: str, axis: str) -> int | None:
    """The dimension of ``tensor`` that every access indexes by ``axis`` alone, or None: the axis appears
    elsewhere in its indices, or not at all."""
    dims: set[int] = set()
    for idx in expr.accesses(tensor):
        for d, i in enumerate(idx):
            if i.plain_axis() == axis:
                dims.add(d)
            elif axis in i.coefs:
                return None
    return dims.pop() if len(dims) == 1 else None


def blockable(expr: TensorExpr, axis: str, lanes: int) -> bool:
    """Whether ``split_axis`` can split ``axis`` of ``expr`` into blocks of ``lanes``: it divides the axis, and
    no run-time index (a gather) or value of the axis (``AxisValue``) needs it whole."""
    if lanes < 2 or axis not in expr.extents or expr.extents[axis] % lanes or expr.stages:
        return False   # a row kernel's stages are read by their own index, which would need splitting too
    bodies = [expr.body] + ([expr.epilogue] if expr.epilogue is not None else [])
    return not any(gathers(b) for b in bodies) and not any(v.axis == axis for b in bodies for v in axis_values(b))


def split_axis(expr: TensorExpr, axis: str, lanes: int, blocked: Collection[str]) -> TensorExpr:
    """``expr`` with ``axis`` (extent E) split into ``axis``o (E / lanes) and ``axis``i (``lanes``), the same
    function of its inputs: each tensor named in ``blocked`` (inputs or the output; ``blocked_dim`` must find
    its dimension) is stored with that dimension's blocks and the ``lanes`` inner points as a new innermost
    dimension; every other index of the axis reads ``lanes x outer + inner``. The inner axis comes last among
    the axes of its kind, where a CPU kernel puts its vectors. ``blockable`` must hold."""
    assert blockable(expr, axis, lanes), (expr.name, axis, lanes)
    outer, inner = split_names(expr, axis)
    dims = {}
    for name in blocked:
        d = blocked_dim(expr, name, axis)
        assert d is not None, (expr.name, name, axis)
        dims[name] = d

    def index_of(tensor: str, index: tuple[Affine, ...]) -> tuple[Affine, ...]:
        d = dims.get(tensor)
        if d is not None:
            return (*index[:d], Affine.axis(outer), *index[d + 1:], Affine.axis(inner))
        return tuple(_split_affine(i, axis, outer, inner, lanes) for i in index)

    def decl(t: TensorDecl) -> TensorDecl:
        d = dims.get(t.name)
        assert t.view is None and t.orig_shape is None, (expr.name, t.name)
        return t if d is None else TensorDecl(t.name, blocked_shape(t.shape, d, lanes), t.dtype)

    def read(r: Read) -> Read:
        return Read(r.tensor, index_of(r.tensor, r.index), r.pos)

    old = expr.axis(axis)
    axes: list[Axis] = []
    for a in expr.axes:
        axes.extend([Axis(outer, old.extent // lanes, old.reduce)] if a.name == axis else [a])
    last = max(i for i, a in enumerate(axes) if a.reduce == old.reduce)
    axes.insert(last + 1, Axis(inner, lanes, old.reduce))
    out_index = index_of(expr.output.name, expr.out_index)
    return replace(expr.remap_reads(read, out_index), axes=tuple(axes), output=decl(expr.output),
                   inputs=tuple(decl(t) for t in expr.inputs), source=None, preparation=None)


def _split_affine(i: Affine, axis: str, outer: str, inner: str, lanes: int) -> Affine:
    c = i.coefs.get(axis)
    if c is None:
        return i
    terms: list[tuple[str, int]] = []
    for a, k in i.terms:
        terms.extend([(outer, k * lanes), (inner, k)] if a == axis else [(a, k)])
    return Affine(tuple(terms), i.const)


def blocked_shape(shape: tuple[int, ...], dim: int, lanes: int) -> tuple[int, ...]:
    """``shape`` with ``dim`` in blocks of ``lanes`` and the ``lanes`` points as a new innermost dimension."""
    return (*shape[:dim], shape[dim] // lanes, *shape[dim + 1:], lanes)


def block_array(a: np.ndarray, dim: int, lanes: int) -> np.ndarray:
    """``a`` stored as ``split_axis`` stores a blocked tensor: ``dim`` in blocks, ``lanes`` points innermost."""
    shape = a.shape[:dim] + (a.shape[dim] // lanes, lanes) + a.shape[dim + 1:]
    return np.ascontiguousarray(np.moveaxis(a.reshape(shape), dim + 1, -1))


def unblock_array(a: np.ndarray, dim: int) -> np.ndarray:
    """The inverse of ``block_array``."""
    moved = np.moveaxis(a, -1, dim + 1)
    return np.ascontiguousarray(moved.reshape(moved.shape[:dim] + (-1,) + moved.shape[dim + 2:]))
