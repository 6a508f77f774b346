"""Axis fusion (the paper's irregular-shape pass) and the implicit-GEMM view of convolutions.

Both are one operation, ``regroup``: several axes become one fused axis, and every tensor is then read through
a ``View`` that decodes the fused index into the original axes. Fusion of axes that are adjacent (or absent)
in every tensor is a plain reshape; the implicit GEMM of a convolution is a gather (im2col) on the input.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from roller.ir.expr import Affine, Read, axis_values, gathers
from roller.ir.tensor_expr import Axis, Preparation, TensorDecl, TensorExpr, View


def regroup(expr: TensorExpr, groups: list[list[str]]) -> TensorExpr:
    """Fuse each group of axes (outermost first) into one axis; axes not named stay as they are.

    Every tensor must be accessed with a single index tuple (true for all named ops)."""
    ext = expr.extents
    named = {a for g in groups for a in g}
    all_groups: list[list[str]] = []
    for a in expr.axes:
        if a.name in named:
            g = next(g for g in groups if a.name in g)
            if g not in all_groups:
                all_groups.append(g)
        else:
            all_groups.append([a.name])
    taken = {a.name for a in expr.axes}
    new_axes: list[Axis] = []
    gname: dict[str, str] = {}
    for g in all_groups:
        kinds = {expr.axis(a).reduce for a in g}
        if len(kinds) != 1:
            raise ValueError(f"cannot fuse spatial and reduction axes together: {g}")
        name = g[0] if len(g) == 1 else "".join(g)
        while len(g) > 1 and name in taken:
            name += "_"
        taken.add(name)
        gname.update({a: name for a in g})
        new_axes.append(Axis(name, math.prod(ext[a] for a in g), kinds.pop()))
    new_axes.sort(key=lambda a: a.reduce)  # spatial first, as everywhere else

    def view_of(t: TensorDecl, index: tuple[Affine, ...]) -> tuple[TensorDecl, tuple[Affine, ...]]:
        used = [a for i in index for a in i.axes()]
        order: list[list[str]] = []
        for a in used:  # groups in the order their first axis appears in the tensor's index
            g = next(g for g in all_groups if a in g)
            if g not in order:
                order.append(g)
        dims = tuple(tuple((a, ext[a]) for a in g) for g in order)
        view = View(t.shape if t.view is None else t.view.source_shape, dims, index)
        shape = tuple(math.prod(e for _, e in d) for d in dims)
        new_index = tuple(Affine.axis(gname[g[0]]) for g in order)
        return TensorDecl(t.name, shape, t.dtype, view), new_index

    decls: dict[str, TensorDecl] = {}
    indices: dict[str, tuple[Affine, ...]] = {}
    for t in expr.inputs:
        accs = expr.accesses(t.name)
        if len(accs) != 1:
            raise ValueError(f"{t.name} is read with {len(accs)} different indices; cannot regroup")
        decls[t.name], indices[t.name] = view_of(t, accs[0])
    out, out_index = view_of(expr.output, expr.out_index)
    mapped = expr.remap_reads(lambda r: Read(r.tensor, indices[r.tensor], r.pos), out_index)
    # Output axes must lead in output order: the kernel writes the output tile in that order.
    out_order = [gname[g[0]] for g in _dims_groups(out)]
    new_axes.sort(key=lambda a: (a.reduce, out_order.index(a.name) if a.name in out_order else len(out_order)))
    return replace(mapped, output=out, inputs=tuple(decls[t.name] for t in expr.inputs),
                   axes=tuple(new_axes), source=expr.source or expr,
                   preparation=Preparation("regroup", tuple(tuple(g) for g in groups), _pads_of(expr)))


def _pads_of(expr: TensorExpr) -> tuple[tuple[str, tuple[tuple[int, int], ...]], ...]:
    """The pads an earlier step of the preparation recorded (a fusion keeps them)."""
    return expr.preparation.pads if expr.preparation is not None else ()


def _dims_groups(t: TensorDecl) -> list[list[str]]:
    assert t.view is not None
    return [[a for a, _ in d] for d in t.view.dims]


def fusible_groups(expr: TensorExpr) -> list[list[str]]:
    """Chains of axes that are adjacent, in the same order, or absent in every tensor (plain indices)."""
    accesses = [idx for t in expr.tensors for idx in expr.accesses(t.name)]
    valued = {v.axis for v in axis_values(expr.body)}  # an axis whose value the body uses stays an axis
    # a tensor read through a run-time index keeps its dimensions: the index names one of them by position
    pinned = {ax for g in gathers(expr.body) for i in g.source.index for ax in i.axes()}

    def pair_ok(a: str, b: str) -> bool:
        if expr.axis(a).reduce != expr.axis(b).reduce or {a, b} & (valued | pinned):
            return False
        for idx in accesses:
            plain = [i.plain_axis() for i in idx]
            uses = [set(i.axes()) for i in idx]
            ia = [d for d, u in enumerate(uses) if a in u]
            ib = [d for d, u in enumerate(uses) if b in u]
            if not ia and not ib:
                continue
            if len(ia) != 1 or len(ib) != 1 or plain[ia[0]] != a or plain[ib[0]] != b or ib[0] != ia[0] + 1:
                return False
        return a not in longer and b not in longer

    # Axes indexing a dimension longer than themselves (an output written into a padded buffer's interior):
    # its rows have the dimension's length, so such an axis and its neighbour are not one run of memory.
    longer = {i.plain_axis() for t in expr.tensors for idx in expr.accesses(t.name) for d, i in enumerate(idx)
              if i.plain_axis() is not None and t.shape[d] != expr.axis(str(i.plain_axis())).extent}

    names = [a.name for a in expr.axes]
    groups: list[list[str]] = []
    for a in names:
        for g in groups:
            if pair_ok(g[-1], a):
                g.append(a)
                break
        else:
            groups.append([a])
    return [g for g in groups if len(g) > 1]


def fuse_axes(expr: TensorExpr) -> TensorExpr:
    """The paper's axis-fusion pass: merge adjacent-or-absent axes. Every tensor is only reshaped (same
    memory, row-major), so no gather is needed and other dimensions keep their affine indices."""
    groups = fusible_groups(expr)
    if not groups:
        return expr
    return _fuse(expr, groups)


def _fuse(expr: TensorExpr, groups: list[list[str]]) -> TensorExpr:
    ext = expr.extents
    gname = {}
    for g in groups:
        gname[g[0]] = "".join(g)
    first_of = {a: g[0] for g in groups for a in g}

    def reshape(t: TensorDecl, index: tuple[Affine, ...]) -> tuple[TensorDecl, tuple[Affine, ...]]:
        shape: list[int] = []
        new_index: list[Affine] = []
        for d, i in enumerate(index):
            a = i.plain_axis()
            if a is not None and a in first_of and first_of[a] != a:
                shape[-1] *= t.shape[d]  # a later member of a group: merge into the previous dimension
                continue
            shape.append(t.shape[d])
            new_index.append(Affine.axis(gname[a]) if a is not None and a in gname else i)
        return (replace(t, shape=tuple(shape), orig_shape=t.storage_shape), tuple(new_index))

    decls: dict[str, TensorDecl] = {}
    indices: dict[tuple[str, tuple[Affine, ...]], tuple[Affine, ...]] = {}
    for t in expr.inputs:
        for acc in expr.accesses(t.name):
            decls[t.name], indices[(t.name, acc)] = reshape(t, acc)
    out, out_index = reshape(expr.output, expr.out_index)
    mapped = expr.remap_reads(lambda r: Read(r.tensor, indices[(r.tensor, r.index)], r.pos), out_index)
    axes = []
    for a in expr.axes:
        if a.name in first_of and first_of[a.name] != a.name:
            continue
        if a.name in gname:
            g = next(g for g in groups if g[0] == a.name)
            axes.append(Axis(gname[a.name], math.prod(ext[x] for x in g), a.reduce))
        else:
            axes.append(a)
    return replace(mapped, output=out, inputs=tuple(decls[t.name] for t in expr.inputs),
                   axes=tuple(axes), source=expr.source or expr,
                   preparation=Preparation("fuse", tuple(tuple(g) for g in groups), _pads_of(expr)))


MAX_PAD_GROWTH = 4  # a padded copy holds at most this many times the tensor's elements...
MAX_PAD_SLACK = 4096  # ...plus this many (small images under large windows)


def window_pads(expr: TensorExpr) -> dict[str, tuple[tuple[int, int], ...]]:
    """Per input whose reads can leave it (a window over padding: ``X[h+r-1]``), how much to pad each dimension
    (before, after) so that every read over the axes' extents is inside. Inputs read through a view, and
    plain indices, are left as they are."""
    ext = expr.extents
    out: dict[str, tuple[tuple[int, int], ...]] = {}
    gathered = {g.source.tensor for g in gathers(expr.body)}   # its run-time index counts in its own dimension
    for t in expr.inputs:
        if t.view is not None or t.orig_shape is not None or t.name in gathered:
            continue
        dims = []
        for d, size in enumerate(t.shape):
            lo, hi = 0, size - 1
            for idx in expr.accesses(t.name):
                if idx[d].plain_axis() is None:
                    a, b = idx[d].span(ext)
                    lo, hi = min(lo, a), max(hi, b)
            dims.append((-lo, hi - (size - 1)))
        padded = math.prod(s + b + a for s, (b, a) in zip(t.shape, dims))
        # A window overhangs by about its size; a read that leaves the tensor by far more (an index built to
        # wrap) keeps its bounds tests rather than a copy many times the tensor.
        if any(b or a for b, a in dims) and padded <= MAX_PAD_GROWTH * t.size + MAX_PAD_SLACK:
            out[t.name] = tuple(dims)
    return out


def pad_inputs(expr: TensorExpr, pads: dict[str, tuple[tuple[int, int], ...]]) -> TensorExpr:
    """``expr`` reading padded copies of the inputs in ``pads`` (a copy holds the pad value outside the tensor,
    so the kernel reads it without a bounds test): each such input is declared with its padded shape and its
    indices move by the padding before it. The copies are the caller's to make (``RProgram.pads``)."""
    if not pads:
        return expr
    prep = (expr.preparation or Preparation("none", ())).with_pads(tuple(sorted(pads.items())))
    return replace(read_padded(expr, pads), source=expr.source or expr, preparation=prep)


def read_padded(expr: TensorExpr, pads: dict[str, tuple[tuple[int, int], ...]]) -> TensorExpr:
    """``expr`` reading each input in ``pads`` from the interior of a padded tensor (declared with the padded
    shape, indices moved by the padding before): the same operator, on another layout of its inputs."""
    decls = []
    for t in expr.inputs:
        p = pads.get(t.name)
        decls.append(t if p is None else TensorDecl(t.name, _padded(t.shape, p), t.dtype))

    def moved(r: Read) -> Read:
        p = pads.get(r.tensor)
        return r if p is None else Read(r.tensor, _moved(r.index, p), r.pos)

    return replace(expr.remap_reads(moved), inputs=tuple(decls))


def write_padded(expr: TensorExpr, pads: tuple[tuple[int, int], ...]) -> TensorExpr:
    """``expr`` writing its output into the interior of a padded tensor (what a consumer that reads it through
    a window then reads without a copy); the border is the caller's to fill."""
    out = TensorDecl(expr.output.name, _padded(expr.output.shape, pads), expr.output.dtype)
    return replace(expr.remap_reads(lambda r: r, _moved(expr.out_index, pads)), output=out)


def _padded(shape: tuple[int, ...], pads: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    return tuple(s + b + a for s, (b, a) in zip(shape, pads))


def _moved(index: tuple[Affine, ...], pads: tuple[tuple[int, int], ...]) -> tuple[Affine, ...]:
    return tuple(Affine(i.terms, i.const + b) for i, (b, _) in zip(index, pads))


def implicit_gemm(expr: TensorExpr) -> TensorExpr:
    """Convolution as GEMM: spatial axes other than the output channel fuse into one (N*HO*WO), the
    reduction axes into one (C*KH*KW) in the weight's storage order, so the weight is a reshape and the input
    an im2col gather."""
    if expr.kind != "conv2d":
        return fuse_axes(expr)
    w = expr.inputs[1]
    w_axes = [i.plain_axis() for i in expr.accesses(w.name)[0]]
    f = next(a for a in w_axes if a is not None and not expr.axis(a).reduce)
    spatial = [a.name for a in expr.spatial_axes if a.name != f]
    reduce = [a for a in w_axes if a is not None and expr.axis(a).reduce]
    return regroup(expr, [spatial, reduce])


def prepare(expr: TensorExpr, gemm_conv: bool = True, pad: bool = False,
            row_pads: Mapping[str, tuple[tuple[int, int], ...]] | None = None) -> TensorExpr:
    """The form construction works on: implicit GEMM for convolutions, axis fusion for everything else; with
    ``pad`` (kernels that read global memory directly: a CPU), windows read padded copies of their inputs
    first (``window_pads``), so that no read needs a bounds test; ``row_pads`` pads more (the description's
    alias rule: ``roller.construction.alias_pads``)."""
    if expr.source is not None:
        return expr
    pads = dict(window_pads(expr)) if pad else {}
    for name, extra in (row_pads or {}).items():
        have = pads.get(name, ((0, 0),) * len(extra))
        pads[name] = tuple((max(b, eb), max(a, ea)) for (b, a), (eb, ea) in zip(have, extra))
    if pads:
        return fuse_axes(pad_inputs(expr, pads))
    return implicit_gemm(expr) if gemm_conv else fuse_axes(expr)


def reprepare(src: TensorExpr, prep: Preparation | None) -> TensorExpr:
    """``src`` in the form a stored rProgram recorded (``RProgram.to_json``): the same fusion applied again,
    not decided again, so a program built for any description reloads onto the expression it was built for.
    ValueError when the recorded groups do not name ``src``'s axes."""
    if prep is None:
        return src
    if prep.pads:
        inputs = {t.name: t for t in src.inputs}
        for name, dims in prep.pads:
            if name not in inputs or len(dims) != len(inputs[name].shape) or inputs[name].view is not None:
                raise ValueError(f"recorded pads of {name} do not match the inputs of {src.name}")
        src = pad_inputs(src, dict(prep.pads))
    names = {a.name for a in src.axes}
    groups = [list(g) for g in prep.groups]
    if prep.kind == "none" and not groups:
        return src
    if not groups or any(a not in names for g in groups for a in g):
        raise ValueError(f"recorded preparation {prep.kind} {groups} does not match the axes of {src.name}")
    if prep.kind == "regroup":
        return regroup(src, groups)
    if prep.kind == "fuse":
        return _fuse(src, groups)
    raise ValueError(f"unknown preparation {prep.kind!r}")
