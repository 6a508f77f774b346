"""Ops that move or reinterpret data: views where the memory stays as it is (reshape, flatten, squeeze,
unsqueeze), device copies where whole boxes move (concat, split, slice with step 1, gather of constant
indices), and Roller operators where each element moves on its own (transpose, pad, strided slice, expand)."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import onnx

from roller.errors import InputError
from roller.frontends.onnx.context import Context, NeedsConstant, translates
from roller.frontends.onnx.elementwise import axes, broadcast_shape, read
from roller.graph.ir import Piece, Value


def _axis(ctx: Context, node: onnx.NodeProto, axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise ctx.error(node, f"axis {axis} out of range for rank {rank}")
    return a


# -- views -------------------------------------------------------------------------------------------------------

@translates("Reshape")
def reshape(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    target = [int(d) for d in ctx.const_input(node, 1, "shape").reshape(-1)]
    allow_zero = bool(ctx.attr(node, "allowzero", 0))
    shape = []
    for i, d in enumerate(target):
        if d == 0 and not allow_zero:
            if i >= len(x.shape):
                raise ctx.error(node, f"shape {target}: a 0 at position {i} copies a dimension the input lacks")
            d = x.shape[i]
        shape.append(d)
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise ctx.error(node, f"shape {target} is not a valid target shape")
    if -1 in shape:
        rest = math.prod(d for d in shape if d != -1)
        if rest == 0 or x.size % rest:
            raise ctx.error(node, f"cannot reshape {list(x.shape)} to {target}")
        shape[shape.index(-1)] = x.size // rest
    if math.prod(shape) != x.size:
        raise ctx.error(node, f"cannot reshape {list(x.shape)} ({x.size} elements) to {shape}")
    ctx.view(node, x.name, node.output[0], shape)


@translates("Flatten")
def flatten(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    axis = int(ctx.attr(node, "axis", 1))
    a = axis + rank if axis < 0 else axis
    if not 0 <= a <= rank:
        raise ctx.error(node, f"axis {axis} out of range for rank {rank}")
    ctx.view(node, x.name, node.output[0], [math.prod(x.shape[:a]), math.prod(x.shape[a:])])


def _axes_arg(ctx: Context, node: onnx.NodeProto) -> list[int] | None:
    if ctx.opset >= 13:
        return [int(a) for a in ctx.const_input(node, 1, "axes").reshape(-1)] if ctx.has(node, 1) else None
    v = ctx.attr(node, "axes", None)
    return [int(a) for a in v] if v is not None else None


@translates("Squeeze")
def squeeze(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    given = _axes_arg(ctx, node)
    drop = {_axis(ctx, node, a, rank) for a in given} if given is not None else \
        {d for d, s in enumerate(x.shape) if s == 1}
    if any(x.shape[d] != 1 for d in drop):
        raise ctx.error(node, f"cannot squeeze axes {sorted(drop)} of {list(x.shape)}: not of size 1")
    ctx.view(node, x.name, node.output[0], [s for d, s in enumerate(x.shape) if d not in drop])


@translates("Unsqueeze")
def unsqueeze(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    given = _axes_arg(ctx, node)
    if not given:
        raise ctx.error(node, "axes are required")
    rank = len(x.shape) + len(given)
    add = sorted(_axis(ctx, node, a, rank) for a in given)
    if len(set(add)) != len(add):
        raise ctx.error(node, f"repeated axes {given}")
    shape, it = [], iter(x.shape)
    for d in range(rank):
        shape.append(1 if d in add else next(it))
    ctx.view(node, x.name, node.output[0], shape)


# -- shape queries (answered at import: shapes are static) ---------------------------------------------------

@translates("Shape")
def shape_of(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.value(node.input[0]) if node.input[0] in ctx.graph.values else None
    shape = list(x.shape) if x is not None else list(ctx.const(node.input[0]).shape)  # type: ignore[union-attr]
    start = int(ctx.attr(node, "start", 0))
    end = ctx.attr(node, "end", None)
    ctx.fold(node.output[0], np.array(shape[start:end], dtype=np.int64))


@translates("Size")
def size_of(ctx: Context, node: onnx.NodeProto) -> None:
    ctx.fold(node.output[0], np.array(ctx.value(node.input[0]).size, dtype=np.int64))


# -- copies of boxes -----------------------------------------------------------------------------------------

@translates("Concat")
def concat(ctx: Context, node: onnx.NodeProto) -> None:
    srcs = [ctx.device_value(node, i) for i in range(len(node.input)) if ctx.has(node, i)]
    rank = len(srcs[0].shape)
    axis = _axis(ctx, node, int(ctx.attr(node, "axis")), rank)
    for s in srcs:
        if len(s.shape) != rank or any(s.shape[d] != srcs[0].shape[d] for d in range(rank) if d != axis):
            raise ctx.error(node, f"inputs {', '.join(str(list(v.shape)) for v in srcs)} differ outside axis {axis}")
    shape = list(srcs[0].shape)
    shape[axis] = sum(s.shape[axis] for s in srcs)
    pieces, off = [], 0
    for s in srcs:
        if s.shape[axis]:
            start = [0] * rank
            start[axis] = off
            pieces.append(Piece(s.name, (0,) * rank, tuple(start), s.shape))
        off += s.shape[axis]
    if len(pieces) == 1 and pieces[0].shape == tuple(shape):
        # Everything else is empty (a cache of no positions before the first token): the one input as it is.
        ctx.view(node, pieces[0].source, node.output[0], shape)
        return
    ctx.copy(node, pieces, node.output[0], shape)


@translates("Split")
def split(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    axis = _axis(ctx, node, int(ctx.attr(node, "axis", 0)), rank)
    outs = [o for o in node.output]
    if ctx.opset >= 13 and ctx.has(node, 1):
        sizes = [int(s) for s in ctx.const_input(node, 1, "split").reshape(-1)]
    elif ctx.opset < 13 and ctx.attr(node, "split", None) is not None:
        sizes = [int(s) for s in ctx.attr(node, "split")]
    else:
        parts = int(ctx.attr(node, "num_outputs", len(outs)))
        step = -(-x.shape[axis] // parts)
        sizes = [min(step, x.shape[axis] - i * step) for i in range(parts)]
    if len(sizes) != len(outs) or sum(sizes) != x.shape[axis] or any(s < 0 for s in sizes):
        raise ctx.error(node, f"split sizes {sizes} do not cut axis {axis} of {list(x.shape)} into {len(outs)} parts")
    off = 0
    for out, size in zip(outs, sizes):
        shape = list(x.shape)
        shape[axis] = size
        start = [0] * rank
        start[axis] = off
        off += size
        if out:
            ctx.copy(node, [Piece(x.name, tuple(start), (0,) * rank, tuple(shape))], out, shape)


@translates("Slice")
def slice_(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    if ctx.opset < 10:
        starts, ends = ctx.ints(node, "starts"), ctx.ints(node, "ends")
        ax = ctx.ints(node, "axes") or list(range(len(starts)))
        steps = [1] * len(starts)
    else:
        starts = [int(v) for v in ctx.const_input(node, 1, "starts").reshape(-1)]
        ends = [int(v) for v in ctx.const_input(node, 2, "ends").reshape(-1)]
        ax = [int(v) for v in ctx.const_input(node, 3, "axes").reshape(-1)] if ctx.has(node, 3) else \
            list(range(len(starts)))
        steps = [int(v) for v in ctx.const_input(node, 4, "steps").reshape(-1)] if ctx.has(node, 4) else \
            [1] * len(starts)
    first, count, step = [0] * rank, list(x.shape), [1] * rank
    for a, s, e, st in zip(ax, starts, ends, steps):
        d = _axis(ctx, node, a, rank)
        if st == 0:
            raise ctx.error(node, "a step of 0")
        lo, hi, _ = slice(s, e, st).indices(x.shape[d])
        n = len(range(lo, hi, st))
        first[d], count[d], step[d] = lo, n, st   # an empty slice is an empty value (``Context.empty``)
    if all(s == 1 for s in step):
        ctx.copy(node, [Piece(x.name, tuple(first), (0,) * rank, tuple(count))], node.output[0], count)
        return
    # Strided: the step-1 dims are cropped by a copy first, so that every index of the operator either spans
    # its whole dimension or moves by a step (an index never reads a prefix of a longer dimension).
    src = x.name
    if any(step[d] == 1 and count[d] != x.shape[d] for d in range(rank)):
        crop_first = [first[d] if step[d] == 1 else 0 for d in range(rank)]
        crop_count = [count[d] if step[d] == 1 else x.shape[d] for d in range(rank)]
        src = ctx.copy(node, [Piece(x.name, tuple(crop_first), (0,) * rank, tuple(crop_count))],
                       ctx.fresh(node.output[0] + ":crop"), crop_count)
    names = axes(rank)
    idx = [names[d] if step[d] == 1 else f"{step[d]}*{names[d]}+{first[d]}" for d in range(rank)]
    ctx.kernel(node, f"Y[{','.join(names)}] = X[{','.join(idx).replace('+-', '-')}]", {"X": src},
               node.output[0], count, kind="slice")


@translates("Gather")
def gather(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    axis = _axis(ctx, node, int(ctx.attr(node, "axis", 0)), rank)
    idx = ctx.const(node.input[1])
    if idx is None:
        _gather_run_time(ctx, node, x, axis)
        return
    flat = [int(i) + x.shape[axis] if int(i) < 0 else int(i) for i in idx.reshape(-1)]
    if any(not 0 <= i < x.shape[axis] for i in flat):
        raise ctx.error(node, f"indices {flat} out of range for axis {axis} of size {x.shape[axis]}")
    out_shape = list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:])
    if not flat:
        ctx.empty(node.output[0], out_shape, x.dtype)
        return
    box = list(x.shape)
    box[axis] = len(flat)
    # Consecutive indices are one box (position ids arange(s) take the first s rows in one piece, whatever s:
    # a model over an open length then has the same steps at every length).
    runs: list[list[int]] = []   # [first index, first destination, length]
    for k, i in enumerate(flat):
        if runs and i == runs[-1][0] + runs[-1][2]:
            runs[-1][2] += 1
        else:
            runs.append([i, k, 1])
    pieces = []
    for i, k, n in runs:
        src, dst, shape = [0] * rank, [0] * rank, list(x.shape)
        src[axis], dst[axis], shape[axis] = i, k, n
        pieces.append(Piece(x.name, tuple(src), tuple(dst), tuple(shape)))
    if out_shape == box:
        ctx.copy(node, pieces, node.output[0], box)
    else:
        tmp = ctx.copy(node, pieces, ctx.fresh(node.output[0] + ":g"), box)
        ctx.view(node, tmp, node.output[0], out_shape)


def _gather_run_time(ctx: Context, node: onnx.NodeProto, x: Value, axis: int) -> None:
    """Gather through indices the model computes or takes (token ids into an embedding): one operator reading
    ``X[..., I[j...], ...]``, whose indices wrap once when negative and are clamped into the axis (an index
    outside it reads the nearest end: roller.ir.expr.Gather)."""
    ind = ctx.device_value(node, 1)
    if ind.dtype not in ("int64", "int32"):
        raise ctx.error(node, f"indices of type {ind.dtype} (int64 or int32 expected)")
    irank, rank = len(ind.shape), len(x.shape)
    out_shape = list(x.shape[:axis]) + list(ind.shape) + list(x.shape[axis + 1:])
    if not irank:   # one index: read as the element of a [1] view
        ind = ctx.value(ctx.view(node, ind.name, ctx.fresh(ind.name + ":1"), [1]))
    names = axes(len(out_shape) if out_shape else 1)
    at = [names[d] for d in range(axis)]
    at.append(f"I[{','.join(names[axis:axis + irank]) or '0'}]")
    at += [names[d + irank - 1] for d in range(axis + 1, rank)]
    text = f"Y[{','.join(names)}] = X[{','.join(at)}]"
    if out_shape:
        ctx.kernel(node, text, {"X": x.name, "I": ind.name}, node.output[0], out_shape, dtype=x.dtype,
                   kind="gather")
    else:
        tmp = ctx.kernel(node, text, {"X": x.name, "I": ind.name}, ctx.fresh(node.output[0] + ":1"), [1],
                         dtype=x.dtype, kind="gather")
        ctx.view(node, tmp, node.output[0], [])


@translates("GatherND")
def gather_nd(ctx: Context, node: onnx.NodeProto) -> None:
    """GatherND: each index row picks a position along the ``q`` axes after ``batch_dims`` leading axes the two
    share (``X[b..., I[b..., j..., 0], ...]`` for one column). Indices wrap once when negative and are
    clamped, as Gather's. Several columns are first made one index into the ``q`` axes seen as one (each
    column clamped into its own axis, so a bad index never reaches into the next row)."""
    x = ctx.device_value(node, 0)
    ind = ctx.device_value(node, 1)
    if ind.dtype not in ("int64", "int32"):
        raise ctx.error(node, f"indices of type {ind.dtype} (int64 or int32 expected)")
    b = int(ctx.attr(node, "batch_dims", 0))
    q, r = len(ind.shape), len(x.shape)
    cols = int(ind.shape[-1]) if q else 0
    if not 0 <= b < min(q, r) or list(ind.shape[:b]) != list(x.shape[:b]) or not 1 <= cols <= r - b:
        raise ctx.error(node, f"batch_dims={b} does not fit data {list(x.shape)} and indices {list(ind.shape)}")
    out_shape = list(ind.shape[:-1]) + list(x.shape[b + cols:])
    if not out_shape:
        raise ctx.error(node, "a scalar result (one index into a vector) is not supported")
    src = x.name
    if cols > 1:
        picked = list(x.shape[b:b + cols])
        src = ctx.view(node, x.name, ctx.fresh(x.name + ":rows"),
                       [*x.shape[:b], math.prod(picked), *x.shape[b + cols:]])
        inames = axes(q - 1)
        terms = []
        stride = math.prod(picked)
        for c, size in enumerate(picked):
            stride //= size
            col = f"I[{','.join([*inames, str(c)])}]"
            clamped = f"min(max(where(lt({col}, 0), {col} + {size}, {col}), 0), {size - 1})"
            terms.append(f"{clamped} * {stride}" if stride > 1 else clamped)
        linear = ctx.kernel(node, f"Y[{','.join([*inames, 'z'])}] = {' + '.join(terms)}", {"I": ind.name},
                            ctx.fresh(node.output[0] + ":row"), [*ind.shape[:-1], 1], extents={"z": 1},
                            dtype="int64", kind="index")
        ind = ctx.value(linear)
    names = axes(len(out_shape))
    picked_at = f"I[{','.join(names[:q - 1] + ['0'])}]"
    at = names[:b] + [picked_at] + names[q - 1:]
    ctx.kernel(node, f"Y[{','.join(names)}] = X[{','.join(at)}]", {"X": src, "I": ind.name}, node.output[0],
               out_shape, dtype=x.dtype, kind="gather")


@translates("GatherElements")
def gather_elements(ctx: Context, node: onnx.NodeProto) -> None:
    """Y[j...] = X[j... with I[j...] at the axis]: the output has the indices' shape (each of its sizes at most
    the input's); indices wrap once when negative and are clamped into the axis, as Gather's."""
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    axis = _axis(ctx, node, int(ctx.attr(node, "axis", 0)), rank)
    ind = ctx.device_value(node, 1)
    if ind.dtype not in ("int64", "int32"):
        raise ctx.error(node, f"indices of type {ind.dtype} (int64 or int32 expected)")
    if len(ind.shape) != rank or any(ind.shape[d] > x.shape[d] for d in range(rank) if d != axis):
        raise ctx.error(node, f"indices {list(ind.shape)} do not fit the input {list(x.shape)} (the same rank, "
                              "no size above the input's off the axis)")
    names = axes(rank)
    at = [f"I[{','.join(names)}]" if d == axis else names[d] for d in range(rank)]
    ctx.kernel(node, f"Y[{','.join(names)}] = X[{','.join(at)}]", {"X": x.name, "I": ind.name}, node.output[0],
               ind.shape, dtype=x.dtype, kind="gather")


# -- operators that move elements one by one -------------------------------------------------------------------

@translates("Transpose")
def transpose(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    perm = ctx.ints(node, "perm") or list(range(rank))[::-1]
    if sorted(perm) != list(range(rank)):
        raise ctx.error(node, f"perm {perm} is not a permutation of {rank} axes")
    permute(ctx, node, x.name, list(x.shape), perm, node.output[0])


def permute(ctx: Context, node: onnx.NodeProto, src: str, shape: list[int], perm: list[int], out: str) -> str:
    """``src`` with its axes in the order ``perm``: a view where only unit dimensions move (the memory order
    stays), else a transpose operator."""
    out_shape = [shape[p] for p in perm]
    moved = [p for p in perm if shape[p] != 1]
    if moved == sorted(moved):
        return ctx.view(node, src, out, out_shape)
    names = axes(len(shape))
    return ctx.kernel(node, f"Y[{','.join(names[p] for p in perm)}] = X[{','.join(names)}]", {"X": src}, out,
                      out_shape, kind="transpose")


@translates("DepthToSpace", "SpaceToDepth")
def depth_space(ctx: Context, node: onnx.NodeProto) -> None:
    """Views around one transpose, as ONNX defines them (modes DCR and CRD)."""
    x = ctx.device_value(node, 0)
    if len(x.shape) != 4:
        raise ctx.error(node, f"expected an input [N, C, H, W], got {list(x.shape)}")
    b = int(ctx.attr(node, "blocksize", 0))
    mode = ctx.text(node, "mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise ctx.error(node, f"mode={mode!r} is not supported (DCR, CRD)")
    n, c, h, w = x.shape
    if node.op_type == "DepthToSpace":
        if b <= 0 or c % (b * b):
            raise ctx.error(node, f"blocksize {b} does not divide the {c} channels into blocks of {b}x{b}")
        k = c // (b * b)
        split, perm = ([n, b, b, k, h, w], [0, 3, 4, 1, 5, 2]) if mode == "DCR" else \
            ([n, k, b, b, h, w], [0, 1, 4, 2, 5, 3])
        final = [n, k, h * b, w * b]
    else:
        if b <= 0 or h % b or w % b:
            raise ctx.error(node, f"blocksize {b} does not divide the spatial size {h}x{w}")
        split = [n, c, h // b, b, w // b, b]
        perm = [0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4]
        final = [n, c * b * b, h // b, w // b]
    src = ctx.view(node, x.name, ctx.fresh(x.name + ":blocks"), split)
    moved = permute(ctx, node, src, split, perm, ctx.fresh(node.output[0] + ":t"))
    ctx.view(node, moved, node.output[0], final)


@translates("Tile")
def tile(ctx: Context, node: onnx.NodeProto) -> None:
    """x viewed with a unit axis before each of its axes, broadcast to the repeats there, viewed as the result:
    one operator."""
    x = ctx.device_value(node, 0)
    reps = [int(r) for r in ctx.const_input(node, 1, "repeats").reshape(-1)]
    if len(reps) != len(x.shape) or any(r < 1 for r in reps):
        raise ctx.error(node, f"repeats {reps} must give a positive count for each of the {len(x.shape)} axes")
    final = [d * r for d, r in zip(x.shape, reps)]
    if all(r == 1 for r in reps):
        ctx.view(node, x.name, node.output[0], final)
        return
    inter = [v for d in x.shape for v in (1, d)]
    wide = [v for d, r in zip(x.shape, reps) for v in (r, d)]
    src = ctx.view(node, x.name, ctx.fresh(x.name + ":unit"), inter)
    names = axes(len(wide))
    y = ctx.kernel(node, f"Y[{','.join(names)}] = {read('X', inter, wide)}", {"X": src},
                   ctx.fresh(node.output[0] + ":wide"), wide, kind="tile")
    ctx.view(node, y, node.output[0], final)


@translates("Pad")
def pad(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    mode = ctx.text(node, "mode", "constant")
    if mode != "constant":
        raise ctx.error(node, f"mode={mode!r} is not supported (constant)")
    if ctx.opset < 11:
        pads = ctx.ints(node, "pads")
        value = float(ctx.attr(node, "value", 0.0))
        pad_axes = list(range(rank))
    else:
        pads = [int(p) for p in ctx.const_input(node, 1, "pads").reshape(-1)]
        value = float(ctx.const_input(node, 2, "constant_value").reshape(-1)[0]) if ctx.has(node, 2) else 0.0
        pad_axes = [_axis(ctx, node, int(a), rank) for a in ctx.const_input(node, 3, "axes").reshape(-1)] \
            if ctx.has(node, 3) else list(range(rank))
    if len(pads) != 2 * len(pad_axes):
        raise ctx.error(node, f"pads {pads} must have 2 entries per padded axis ({len(pad_axes)})")
    before, after = [0] * rank, [0] * rank
    for k, a in enumerate(pad_axes):
        before[a], after[a] = pads[k], pads[k + len(pad_axes)]
    shape = [x.shape[d] + before[d] + after[d] for d in range(rank)]
    if any(s <= 0 for s in shape):
        raise ctx.error(node, f"pads {pads} leave nothing of {list(x.shape)}")
    if np.isnan(value):
        raise ctx.error(node, "constant_value must not be NaN")
    pad_kernel(ctx, node, x.name, list(x.shape), before, shape, value, node.output[0])


def pad_kernel(ctx: Context, node: onnx.NodeProto, src: str, shape: list[int], before: list[int],
               out_shape: list[int], value: float, out: str) -> str:
    """``src`` placed at offset ``before`` (negative: cropped) in an output of ``out_shape`` filled with
    ``value``: one operator whose reads outside the input give the pad value."""
    names = axes(len(shape))
    idx = []
    for d, n in enumerate(names):
        b = before[d]
        if b == 0 and out_shape[d] != shape[d]:
            # Padded or cropped at the end only: a plain index would tie the axis to both sizes. Offsetting it by
            # a reduction axis of extent 1 reads the same element and lets the output size stand.
            idx.append(f"{n}+u")
        else:
            idx.append(n if b == 0 else (f"{n}-{b}" if b > 0 else f"{n}+{-b}"))
    op = "+=" if any("+u" in i for i in idx) else "="
    return ctx.kernel(node, f"Y[{','.join(names)}] {op} X[{','.join(idx)}]", {"X": src}, out, out_shape,
                      pad_value=value, extents={"u": 1} if op == "+=" else None, kind="pad")


@translates("CenterCropPad")
def center_crop_pad(ctx: Context, node: onnx.NodeProto) -> None:
    """Each listed axis cropped around its centre (a copy) or padded with zeros around it (an operator), to the
    given sizes; the extra element of an odd difference goes to the end, as ONNX's function body does."""
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    sizes = [int(v) for v in ctx.const_input(node, 1, "shape").reshape(-1)]
    ax = [_axis(ctx, node, a, rank) for a in ctx.ints(node, "axes", list(range(rank)))]
    if len(sizes) != len(ax) or len(set(ax)) != len(ax) or any(v <= 0 for v in sizes):
        raise ctx.error(node, f"shape {sizes} does not give one positive size per axis {ax}")
    target = list(x.shape)
    for a, v in zip(ax, sizes):
        target[a] = v
    crop = [min(d, t) for d, t in zip(x.shape, target)]
    src = x.name
    if crop != list(x.shape):
        first = [(d - c) // 2 for d, c in zip(x.shape, crop)]
        out = node.output[0] if crop == target else ctx.fresh(node.output[0] + ":crop")
        src = ctx.copy(node, [Piece(x.name, tuple(first), (0,) * rank, tuple(crop))], out, crop)
    if crop != target:
        pad_kernel(ctx, node, src, crop, [(t - c) // 2 for t, c in zip(target, crop)], target, 0.0,
                   node.output[0])
    elif src == x.name:
        ctx.view(node, x.name, node.output[0], target)


@translates("Expand")
def expand(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    target = [int(d) for d in ctx.const_input(node, 1, "shape").reshape(-1)]
    shape = broadcast_shape(ctx, node, [list(x.shape), target])
    if shape == list(x.shape):
        ctx.view(node, x.name, node.output[0], shape)
        return
    names = axes(len(shape))
    ctx.kernel(node, f"Y[{','.join(names)}] = {read('X', list(x.shape), shape)}", {"X": x.name},
               node.output[0], shape, kind="expand")


# -- ops that are only ever evaluated at import -------------------------------------------------------------

@translates("Constant", "ConstantOfShape", "Range")
def import_time_only(ctx: Context, node: onnx.NodeProto) -> None:
    """These make tensors whose shape is their inputs' values: with every input known at import the importer
    evaluates them (they never reach here); a computed input would make the shape dynamic."""
    computed = [i for i in node.input if i and ctx.const(i) is None]
    raise NeedsConstant(f"its input {computed[0]!r} must be a constant known at import (the output's shape "
                        "depends on its value); here it is computed by the model", computed[0],
                        source=ctx.source, field=ctx.where(node))


# -- resizing ------------------------------------------------------------------------------------------------

@translates("Resize")
def resize(ctx: Context, node: onnx.NodeProto) -> None:
    """Nearest-neighbour resizing as device copies (linear and cubic: roller.frontends.onnx.resize): along each
    axis every output row is one input row, and
    consecutive rows that come from consecutive rows move in one piece. Which input row each output row takes
    (every coordinate transformation, rounding mode, aspect-ratio policy and axes list) is asked of ONNX's
    reference implementation, run at import on a tensor of row numbers, so it is ONNX's own answer."""
    mode = ctx.text(node, "mode", "nearest")
    if mode in ("linear", "cubic"):
        from roller.frontends.onnx.resize import interpolate

        interpolate(ctx, node, mode)
        return
    if mode != "nearest":
        raise ctx.error(node, f"mode={mode!r} is not supported (nearest, linear, cubic)")
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    params = {i: ctx.const_input(node, i, what) for i, what in ((1, "roi"), (2, "scales"), (3, "sizes"))
              if ctx.has(node, i)}
    transform = ctx.text(node, "coordinate_transformation_mode", "half_pixel")
    if transform == "tf_half_pixel_for_nn":   # opsets 11-12 only; onnx.reference no longer knows it
        maps = _tf_half_pixel_maps(ctx, node, list(x.shape), params)
    else:
        maps = _nearest_maps(ctx, node, list(x.shape), params)
    cur, cur_shape = x.name, list(x.shape)
    changed = [d for d in range(rank) if list(maps[d]) != list(range(x.shape[d]))]
    if not changed:
        ctx.view(node, x.name, node.output[0], x.shape)
        return
    for d in changed:
        shape = list(cur_shape)
        shape[d] = len(maps[d])
        pieces = []
        for o, m, count in _runs(maps[d]):
            src, dst, box = [0] * rank, [0] * rank, list(cur_shape)
            src[d], dst[d], box[d] = m, o, count
            pieces.append(Piece(cur, tuple(src), tuple(dst), tuple(box)))
        out = node.output[0] if d == changed[-1] else ctx.fresh(f"{node.output[0]}:axis{d}")
        cur, cur_shape = ctx.copy(node, pieces, out, shape), shape


#: ONNX's nearest_mode roundings of a source coordinate
ROUNDING: dict[str, Callable[[np.ndarray], np.ndarray]] = {"round_prefer_floor": lambda v: np.ceil(v - 0.5), "round_prefer_ceil": lambda v: np.floor(v + 0.5),
            "floor": np.floor, "ceil": np.ceil}


def _tf_half_pixel_maps(ctx: Context, node: onnx.NodeProto, shape: list[int],
                        params: dict[int, np.ndarray]) -> list[np.ndarray]:
    """The rows of coordinate_transformation_mode tf_half_pixel_for_nn: source (o + 0.5) / scale, rounded by
    nearest_mode and clamped to the input."""
    mode = ctx.text(node, "nearest_mode", "round_prefer_floor")
    if mode not in ROUNDING:
        raise ctx.error(node, f"nearest_mode={mode!r} is not supported ({', '.join(ROUNDING)})")
    sizes = params.get(3)
    scales = params.get(2)
    if sizes is not None and sizes.size:
        out = [int(v) for v in sizes.reshape(-1)]
        scale = [o / n for o, n in zip(out, shape)]
    elif scales is not None and scales.size:
        scale = [float(v) for v in scales.reshape(-1)]
        out = [math.floor(n * s) for n, s in zip(shape, scale)]
    else:
        raise ctx.error(node, "Resize needs scales or sizes")
    if len(out) != len(shape) or any(o <= 0 for o in out):
        raise ctx.error(node, f"the output sizes {out} do not fit the input {shape}")
    return [np.clip(ROUNDING[mode]((np.arange(o) + 0.5) / s), 0, n - 1).astype(np.int64)
            for o, s, n in zip(out, scale, shape)]


def _runs(rows: np.ndarray) -> list[tuple[int, int, int]]:
    """(first output row, first input row, count) of each run of output rows taken from consecutive input
    rows."""
    out: list[tuple[int, int, int]] = []
    for o, m in enumerate(int(r) for r in rows):
        if out and out[-1][1] + out[-1][2] == m and out[-1][0] + out[-1][2] == o:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((o, m, 1))
    return out


def _nearest_maps(ctx: Context, node: onnx.NodeProto, shape: list[int],
                  params: dict[int, np.ndarray]) -> list[np.ndarray]:
    """Per axis, the input row of each output row, from onnx.reference's Resize applied to row numbers + 1
    (0 marks an output that tf_crop_and_resize extrapolates)."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    probe = onnx.NodeProto()
    probe.CopyFrom(node)
    del probe.attribute[:]
    probe.attribute.extend(a for a in node.attribute if a.name != "extrapolation_value")
    probe.attribute.append(helper.make_attribute("extrapolation_value", 0.0))
    probe.input[0], probe.output[0] = "rows", "taken"
    inits = [numpy_helper.from_array(a, node.input[i]) for i, a in params.items()]
    model = helper.make_model(
        helper.make_graph([probe], "rows", [helper.make_tensor_value_info("rows", onnx.TensorProto.FLOAT, shape)],
                          [helper.make_empty_tensor_value_info("taken")], inits),
        opset_imports=[helper.make_opsetid("", ctx.opset)])
    try:
        ref = ReferenceEvaluator(model)
        maps = []
        for d, n in enumerate(shape):
            if n >= 2**24:
                raise ctx.error(node, f"axis {d} has {n} rows; at most 2^24 are supported")
            rows = np.arange(1, n + 1, dtype=np.float32).reshape([n if k == d else 1 for k in range(len(shape))])
            results = cast("list[Any]", ref.run(None, {"rows": np.ascontiguousarray(np.broadcast_to(rows, shape))}))
            taken = np.asarray(results[0])
            maps.append(taken[tuple(slice(None) if k == d else 0 for k in range(len(shape)))].astype(np.int64) - 1)
    except InputError:
        raise
    except Exception as err:  # noqa: BLE001 - the reference raises anything; the node is at fault
        raise ctx.error(node, f"evaluating its row mapping failed: {err}") from None
    for d, m in enumerate(maps):
        if not len(m):
            raise ctx.error(node, f"axis {d} would be empty; zero-size tensors are not supported")
        if (m < 0).any():
            raise ctx.error(node, "tf_crop_and_resize outside the input (extrapolation_value) is not supported")
    return maps
