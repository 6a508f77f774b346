"""Ops that move or reinterpret data: views where the memory stays as it is (reshape, flatten, squeeze,
unsqueeze), device copies where whole boxes move (concat, split, slice with step 1, gather of constant
indices), and Roller operators where each element moves on its own (transpose, pad, strided slice, expand)."""
from __future__ import annotations

import math

import numpy as np
import onnx

from roller.frontends.onnx.context import Context, translates
from roller.frontends.onnx.elementwise import axes, broadcast_shape, read
from roller.graph.ir import Piece


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
        if n == 0:
            raise ctx.error(node, f"the slice of axis {d} is empty (starts {starts}, ends {ends}, steps {steps} of "
                                  f"{list(x.shape)}); zero-size tensors are not supported")
        first[d], count[d], step[d] = lo, n, st
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
        raise ctx.error(node, "indices computed by the model (an embedding lookup) are not supported yet; "
                              "indices known at import are")
    flat = [int(i) + x.shape[axis] if int(i) < 0 else int(i) for i in idx.reshape(-1)]
    if any(not 0 <= i < x.shape[axis] for i in flat):
        raise ctx.error(node, f"indices {flat} out of range for axis {axis} of size {x.shape[axis]}")
    box = list(x.shape)
    box[axis] = len(flat)
    pieces = []
    for k, i in enumerate(flat):
        src, dst, shape = [0] * rank, [0] * rank, list(x.shape)
        src[axis], dst[axis], shape[axis] = i, k, 1
        pieces.append(Piece(x.name, tuple(src), tuple(dst), tuple(shape)))
    out_shape = list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:])
    if out_shape == box:
        ctx.copy(node, pieces, node.output[0], box)
    else:
        tmp = ctx.copy(node, pieces, ctx.fresh(node.output[0] + ":g"), box)
        ctx.view(node, tmp, node.output[0], out_shape)


# -- operators that move elements one by one -------------------------------------------------------------------

@translates("Transpose")
def transpose(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    perm = ctx.ints(node, "perm") or list(range(rank))[::-1]
    if sorted(perm) != list(range(rank)):
        raise ctx.error(node, f"perm {perm} is not a permutation of {rank} axes")
    names = axes(rank)
    out_shape = [x.shape[p] for p in perm]
    if perm == list(range(rank)):
        ctx.view(node, x.name, node.output[0], out_shape)
        return
    # Moving only unit dimensions keeps the memory order: a view.
    moved = [p for p in perm if x.shape[p] != 1]
    if moved == sorted(moved):
        ctx.view(node, x.name, node.output[0], out_shape)
        return
    ctx.kernel(node, f"Y[{','.join(names[p] for p in perm)}] = X[{','.join(names)}]", {"X": x.name},
               node.output[0], out_shape, kind="transpose")


@translates("Pad")
def pad(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    mode = ctx.attr(node, "mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
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
    if not np.isfinite(value) and value != float("-inf") and value != float("inf"):
        raise ctx.error(node, "constant_value must not be NaN")
    names = axes(rank)
    idx = []
    for d, n in enumerate(names):
        b = before[d]
        if b == 0 and shape[d] != x.shape[d]:
            # Padded or cropped at the end only: a plain index would tie the axis to both sizes. Offsetting it by
            # a reduction axis of extent 1 reads the same element and lets the output size stand.
            idx.append(f"{n}+u")
        else:
            idx.append(n if b == 0 else (f"{n}-{b}" if b > 0 else f"{n}+{-b}"))
    op = "+=" if any("+u" in i for i in idx) else "="
    ctx.kernel(node, f"Y[{','.join(names)}] {op} X[{','.join(idx)}]", {"X": x.name}, node.output[0], shape,
               pad_value=value, extents={"u": 1} if op == "+=" else None, kind="pad")


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
    raise ctx.error(node, f"its input {computed[0]!r} must be a constant known at import (the output's shape "
                          "depends on its value); here it is computed by the model")
