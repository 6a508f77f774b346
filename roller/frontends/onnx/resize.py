"""Resize in linear and cubic mode: along each axis that changes, one elementwise operator whose every output
row is a weighted sum of a few input rows, read through a table of row numbers:
``Y[.., o, ..] = W[o,0] * X[.., I[o,0], ..] + W[o,1] * X[.., I[o,1], ..] + ...`` (plus ``E[o]``, the
extrapolation value, for the rows tf_crop_and_resize puts outside the input).

The reads are exact: an output row reads only the input rows it weighs (and where it weighs fewer than its
axis's widest row, the first of them again, with weight 0), so an inf or NaN in one input row reaches only the
output rows that interpolate from it (a dense interpolation matrix would spread it over every output row as
0 * inf). Which rows and weights, ONNX's reference implementation says: its 1-D resize along one
axis (``onnx.reference``, separable since onnx 1.17) applied to the identity matrix of the input rows is the
interpolation matrix itself, for every coordinate transformation, cubic coefficient, exclude_outside and
antialias setting. The axes resize one after another, as the reference does.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from roller.frontends.onnx.context import FLOAT_TYPES, Context
from roller.frontends.onnx.elementwise import axes

#: rows of an axis the interpolation table is built for at most (the probe is an n x n matrix)
MAX_ROWS = 4096
#: input rows one output row may weigh (antialiased downsampling widens the filter by the scale)
MAX_TAPS = 32


def interpolate(ctx: Context, node: onnx.NodeProto, mode: str) -> None:
    """``node`` (a Resize in ``mode`` linear or cubic) as one weighted-rows operator per axis that changes."""
    x = ctx.device_value(node, 0)
    if x.dtype not in FLOAT_TYPES:
        raise ctx.error(node, f"mode={mode!r} on a {x.dtype} tensor is not supported (floating-point tensors)")
    rank = len(x.shape)
    scales, sizes = _per_axis(ctx, node, list(x.shape))
    roi = _roi(ctx, node, rank)
    transform = ctx.text(node, "coordinate_transformation_mode", "half_pixel")
    extrapolation = float(ctx.attr(node, "extrapolation_value", 0.0))
    cur, cur_shape = x.name, list(x.shape)
    changed = [d for d in range(rank) if not (np.isclose(scales[d], 1.0) and sizes[d] == x.shape[d]
                                                  and (roi is None or (np.isclose(roi[d], 0.0)
                                                                       and np.isclose(roi[d + rank], 1.0))))]
    if not changed:
        ctx.view(node, x.name, node.output[0], x.shape)
        return
    for d in changed:
        n = cur_shape[d]
        if n > MAX_ROWS or sizes[d] > MAX_ROWS:
            raise ctx.error(node, f"axis {d} resizes {n} rows to {sizes[d]}; at most {MAX_ROWS} are supported")
        matrix = _matrix(ctx, node, mode, n, scales[d], sizes[d], None if roi is None else [roi[d], roi[d + rank]],
                         transform)
        shape = list(cur_shape)
        shape[d] = sizes[d]
        out = node.output[0] if d == changed[-1] else ctx.fresh(f"{node.output[0]}:axis{d}")
        cur = _weighted_rows(ctx, node, cur, d, matrix, extrapolation, out, shape)
        cur_shape = shape


def _per_axis(ctx: Context, node: onnx.NodeProto, shape: list[int]) -> tuple[list[float], list[int]]:
    """Each axis's scale factor and output rows, as the reference resolves scales or sizes, ``axes`` and
    ``keep_aspect_ratio_policy``."""
    rank = len(shape)
    chosen = _resized_axes(ctx, node, rank)
    sizes_in = ctx.const_input(node, 3, "sizes") if ctx.has(node, 3) else None
    scales_in = ctx.const_input(node, 2, "scales") if ctx.has(node, 2) else None
    policy = ctx.text(node, "keep_aspect_ratio_policy", "stretch")
    if sizes_in is not None and sizes_in.size:
        wanted = [int(v) for v in sizes_in.reshape(-1)]
        if len(wanted) != len(chosen):
            raise ctx.error(node, f"sizes {wanted} do not match the {len(chosen)} axes resized")
        sizes = list(shape)
        for a, v in zip(chosen, wanted):
            sizes[a] = v
        scales = [s / n for s, n in zip(sizes, shape)]
        if policy != "stretch":
            if policy not in ("not_larger", "not_smaller"):
                raise ctx.error(node, f"keep_aspect_ratio_policy={policy!r} is not one of stretch, not_larger, "
                                      "not_smaller")
            pick = min if policy == "not_larger" else max
            common = pick(scales[a] for a in chosen)
            scales = [common if a in chosen else 1.0 for a in range(rank)]
            sizes = [int(common * shape[a] + 0.5) if a in chosen else shape[a] for a in range(rank)]
    elif scales_in is not None and scales_in.size:
        given = [float(v) for v in scales_in.reshape(-1)]
        if len(given) != len(chosen) or any(not s > 0 for s in given):
            raise ctx.error(node, f"scales {given} are not one positive factor per resized axis")
        scales = [1.0] * rank
        for a, s in zip(chosen, given):
            scales[a] = s
        sizes = [int(s * n) for s, n in zip(scales, shape)]
    else:
        raise ctx.error(node, "Resize needs scales or sizes")
    if any(s <= 0 for s in sizes):
        raise ctx.error(node, f"the output sizes {sizes} would be empty; zero-size tensors are not supported")
    return scales, sizes


def _roi(ctx: Context, node: onnx.NodeProto, rank: int) -> list[float] | None:
    """The region of interest as [starts..., ends...] over every axis (tf_crop_and_resize), else None."""
    if not ctx.has(node, 1):
        return None
    roi = [float(v) for v in ctx.const_input(node, 1, "roi").reshape(-1)]
    if not roi:
        return None
    chosen = _resized_axes(ctx, node, rank)
    if len(roi) != 2 * len(chosen):
        raise ctx.error(node, f"roi has {len(roi)} values; {2 * len(chosen)} expected")
    full = [0.0] * rank + [1.0] * rank
    for i, a in enumerate(chosen):
        full[a], full[rank + a] = roi[i], roi[len(chosen) + i]
    return full


def _resized_axes(ctx: Context, node: onnx.NodeProto, rank: int) -> list[int]:
    """The axes the scales, sizes and roi are given for (``axes``, opset 18; all by default), counted from 0."""
    given = ctx.ints(node, "axes", list(range(rank)))
    chosen = [a + rank if a < 0 else a for a in given]
    if sorted(set(chosen)) != sorted(chosen) or any(not 0 <= a < rank for a in chosen):
        raise ctx.error(node, f"axes {given} are not distinct axes of a rank-{rank} tensor")
    return chosen


def _coefficients(ctx: Context, node: onnx.NodeProto, mode: str, op: Any) -> Callable[[float, float], Any]:
    antialias = bool(int(ctx.attr(node, "antialias", 0)))
    if mode == "linear":
        return op._linear_coeffs_antialias if antialias else op._linear_coeffs
    a = float(ctx.attr(node, "cubic_coeff_a", -0.75))
    cubic = op._cubic_coeffs_antialias if antialias else op._cubic_coeffs
    return lambda ratio, scale: cubic(ratio, scale, A=a)


def _matrix(ctx: Context, node: onnx.NodeProto, mode: str, n: int, scale: float, size: int,
            roi: list[float] | None, transform: str) -> np.ndarray:
    """[size, n]: the weight of each input row in each output row; a row of NaN where the output row is the
    extrapolation value."""
    try:
        from onnx.reference.ops import op_resize as op

        along = op._interpolate_1d_along_axis
    except (ImportError, AttributeError):
        raise ctx.error(node, f"mode={mode!r} needs onnx 1.17 or later (its reference's separable resize); "
                              f"this is onnx {onnx.__version__}") from None
    exclude = bool(int(ctx.attr(node, "exclude_outside", 0)))
    try:
        out = along(np.eye(n), 0, scale, size, _coefficients(ctx, node, mode, op), roi=roi,
                    extrapolation_value=float("nan"), coordinate_transformation_mode=transform,
                    exclude_outside=exclude)
    except ValueError as err:
        raise ctx.error(node, str(err).strip().splitlines()[0]) from None
    return np.asarray(out, dtype=np.float64)


def _weighted_rows(ctx: Context, node: onnx.NodeProto, src: str, axis: int, matrix: np.ndarray,
                   extrapolation: float, output: str, shape: list[int]) -> str:
    """One operator: output row ``o`` of ``axis`` is the sum over the rows ``matrix[o]`` weighs (the taps), of
    weight times that input row; rows outside (NaN) are ``extrapolation``."""
    outside = np.isnan(matrix).any(axis=1)
    weights = np.where(np.isnan(matrix), 0.0, matrix)
    taps = [np.flatnonzero(row) for row in weights]
    width = max(1, max(len(t) for t in taps))
    if width > MAX_TAPS:
        raise ctx.error(node, f"an output row of axis {axis} weighs {width} input rows; at most {MAX_TAPS} are "
                              "supported (antialiased downsampling by a factor above about 15)")
    rows = np.zeros((len(taps), width), np.int64)
    w = np.zeros((len(taps), width), np.float32)
    for o, t in enumerate(taps):
        rows[o, :len(t)] = t
        rows[o, len(t):] = t[0] if len(t) else 0   # a row of fewer taps reads its own first one again, weight 0
        w[o, :len(t)] = weights[o, t]
    names = axes(len(shape))
    row = names[axis]

    def read(t: int) -> str:
        at = [f"I[{row},{t}]" if d == axis else names[d] for d in range(len(shape))]
        return f"W[{row},{t}] * X[{','.join(at)}]"

    body = " + ".join(read(t) for t in range(width))
    inputs = {"X": src, "W": ctx.add_const(w, f"{output}:weights"), "I": ctx.add_const(rows, f"{output}:rows")}
    if outside.any():
        inputs["E"] = ctx.add_const(np.where(outside, extrapolation, 0.0).astype(np.float32), f"{output}:outside")
        body += f" + E[{row}]"
    x = ctx.value(src)
    return ctx.kernel(node, f"Y[{','.join(names)}] = {body}", inputs, output, shape, dtype=x.dtype,
                      kind="resize")
