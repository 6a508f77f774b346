"""Normalisations: softmax, log-softmax, layer norm, batch norm (inference), LRN, each as a few Roller
operators (a reduction, then an elementwise pass; the fusion work makes them one kernel)."""
from __future__ import annotations

import math

import numpy as np
import onnx

from roller.frontends.onnx.context import Context, fmt, real, translates
from roller.frontends.onnx.elementwise import axes


def _rows(ctx: Context, node: onnx.NodeProto, shape: tuple[int, ...], axis: int, legacy: bool) -> tuple[int, int]:
    """(rows, row length) of a softmax or norm over ``axis`` (to the end of the shape when ``legacy``: the
    opset < 13 softmax, which flattens [axis:] into one row)."""
    rank = len(shape)
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise ctx.error(node, f"axis {axis} out of range for rank {rank}")
    if legacy:
        return math.prod(shape[:a]), math.prod(shape[a:])
    return a, shape[a]


@translates("Softmax", "LogSoftmax")
def softmax(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    legacy = ctx.opset < 13
    axis = int(ctx.attr(node, "axis", 1 if legacy else -1))
    if legacy:
        rows, n = _rows(ctx, node, x.shape, axis, True)
        src = ctx.view(node, x.name, ctx.fresh(x.name + ":2d"), [rows, n])
        shape, red = [rows, n], 1
    else:
        red, _ = _rows(ctx, node, x.shape, axis, False)
        src, shape = x.name, list(x.shape)
    names = axes(len(shape))
    kept = [nm for d, nm in enumerate(names) if d != red]
    row_shape = [s for d, s in enumerate(shape) if d != red] or [1]
    if not kept:
        kept = ["u"]
        src = ctx.view(node, src, ctx.fresh(src + ":u"), [1, *shape])
        names, shape, red = ["u", *names], [1, *shape], red + 1
    full, row = ",".join(names), ",".join(kept)
    out = node.output[0] if not legacy and len(shape) == rank else ctx.fresh(node.output[0] + ":s")
    m = ctx.kernel(node, f"Y[{row}] max= X[{full}]", {"X": src}, ctx.fresh(node.output[0] + ":max"), row_shape,
                   kind="reduce")
    if node.op_type == "Softmax":
        e = ctx.kernel(node, f"Y[{full}] = exp(X[{full}] - M[{row}])", {"X": src, "M": m},
                       ctx.fresh(node.output[0] + ":exp"), shape, kind="softmax_exp")
        s = ctx.kernel(node, f"Y[{row}] += E[{full}]", {"E": e}, ctx.fresh(node.output[0] + ":sum"), row_shape,
                       kind="reduce")
        ctx.kernel(node, f"Y[{full}] = E[{full}] / S[{row}]", {"E": e, "S": s}, out, shape, kind="softmax_div")
    else:
        s = ctx.kernel(node, f"Y[{row}] += exp(X[{full}] - M[{row}])", {"X": src, "M": m},
                       ctx.fresh(node.output[0] + ":sum"), row_shape, kind="reduce")
        ctx.kernel(node, f"Y[{full}] = X[{full}] - M[{row}] - log(S[{row}])", {"X": src, "M": m, "S": s}, out,
                   shape, kind="logsoftmax")
    if out != node.output[0]:
        ctx.view(node, out, node.output[0], x.shape)


@translates("LayerNormalization")
def layer_norm(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    axis = int(ctx.attr(node, "axis", -1))
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise ctx.error(node, f"axis {axis} out of range for rank {rank}")
    if int(ctx.attr(node, "stash_type", 1)) != 1:
        raise ctx.error(node, "stash_type other than 1 (float32 statistics) is not supported")
    eps = float(ctx.attr(node, "epsilon", 1e-5))
    rows, n = math.prod(x.shape[:a]), math.prod(x.shape[a:])
    src = ctx.view(node, x.name, ctx.fresh(x.name + ":2d"), [rows, n])
    norm_shape = list(x.shape[a:])
    tensors = {"X": src}
    inv = real(1.0 / n, x.dtype)
    mean = ctx.kernel(node, f"Y[r] += X[r,c] * {inv}", tensors, ctx.fresh(node.output[0] + ":mean"), [rows],
                      kind="reduce")
    var = ctx.kernel(node, f"Y[r] += (X[r,c] - M[r]) * (X[r,c] - M[r]) * {inv}", {"X": src, "M": mean},
                     ctx.fresh(node.output[0] + ":var"), [rows], kind="reduce")
    body = f"(X[r,c] - M[r]) * rsqrt(V[r] + {fmt(eps)})"
    ins = {"X": src, "M": mean, "V": var}
    for i, (t, op) in ((1, ("G", "*")), (2, ("B", "+"))):
        if ctx.has(node, i):
            p = _param(ctx, node, i, norm_shape, n)
            ins[t[0]] = p
            body = f"({body}) {op} {t[0]}[c]"
    y = ctx.kernel(node, f"Y[r,c] = {body}", ins, ctx.fresh(node.output[0] + ":2d"), [rows, n], kind="layernorm")
    ctx.view(node, y, node.output[0], x.shape)
    # The optional statistics: [d0, ..., d(axis-1), 1, ..., 1]
    stat_shape = [*x.shape[:a], *[1] * (rank - a)]
    if len(node.output) > 1 and node.output[1]:
        ctx.view(node, mean, node.output[1], stat_shape)
    if len(node.output) > 2 and node.output[2]:
        inv = ctx.kernel(node, f"Y[r] = rsqrt(V[r] + {fmt(eps)})", {"V": var}, ctx.fresh(node.output[2] + ":1d"),
                         [rows], kind="layernorm_invstd")
        ctx.view(node, inv, node.output[2], stat_shape)


def _param(ctx: Context, node: onnx.NodeProto, i: int, norm_shape: list[int], n: int) -> str:
    """Scale or bias of a layer norm as a vector over the normalised elements (broadcast where smaller)."""
    c = ctx.const(node.input[i])
    if c is not None:
        try:
            flat = np.broadcast_to(c, norm_shape).reshape(n)
        except ValueError:
            raise ctx.error(node, f"input {i} of shape {list(c.shape)} does not broadcast to the normalised shape "
                                  f"{norm_shape}") from None
        return ctx.add_const(flat, ctx.fresh(node.input[i] + ":flat"))
    v = ctx.device_value(node, i)
    if list(v.shape) != norm_shape:
        raise ctx.error(node, f"a computed scale or bias must have the normalised shape {norm_shape}")
    return ctx.view(node, v.name, ctx.fresh(v.name + ":flat"), [n])


@translates("BatchNormalization")
def batch_norm(ctx: Context, node: onnx.NodeProto) -> None:
    """Inference batch norm as y = x * s[c] + t[c] with s and t folded at import (one that follows a Conv was
    folded into the convolution's weights before translation: ``fold_batchnorm``)."""
    if int(ctx.attr(node, "training_mode", 0)) or len([o for o in node.output if o]) > 1:
        raise ctx.error(node, "training mode is not supported (inference only)")
    x = ctx.device_value(node, 0)
    if len(x.shape) < 2:
        raise ctx.error(node, f"expected an input [N, C, ...], got {list(x.shape)}")
    c = x.shape[1]
    params = [ctx.const(node.input[i]) for i in range(1, 5)]
    for i, p in enumerate(params):
        size = p.size if p is not None else ctx.value(node.input[i + 1]).size
        if size != c:
            raise ctx.error(node, f"input {i + 1} must have {c} elements (one per channel), got {size}")
    eps = float(ctx.attr(node, "epsilon", 1e-5))
    names = axes(len(x.shape))
    full = ",".join(names)
    if any(p is None for p in params):   # computed statistics: normalised on the device, as written
        ins = {"X": x.name}
        for t, i in (("S", 1), ("B", 2), ("M", 3), ("V", 4)):
            v = ctx.device_value(node, i)
            ins[t] = v.name if len(v.shape) == 1 else ctx.view(node, v.name, ctx.fresh(v.name + ":c"), [c])
        ctx.kernel(node, f"Y[{full}] = (X[{full}] - M[{names[1]}]) * rsqrt(V[{names[1]}] + {fmt(eps)}) * "
                         f"S[{names[1]}] + B[{names[1]}]", ins, node.output[0], x.shape, kind="batchnorm")
        return
    scale, bias, mean, var = (np.asarray(p, dtype=np.float64) for p in params)
    mul = scale / np.sqrt(var + eps)
    shift = bias - mean * mul
    sv = ctx.add_const(mul.astype(np.float32).reshape(c), ctx.fresh(node.output[0] + ":scale"))
    tv = ctx.add_const(shift.astype(np.float32).reshape(c), ctx.fresh(node.output[0] + ":shift"))
    ctx.kernel(node, f"Y[{full}] = X[{full}] * S[{names[1]}] + H[{names[1]}]", {"X": x.name, "S": sv, "H": tv},
               node.output[0], x.shape, kind="batchnorm")


@translates("LRN")
def lrn(ctx: Context, node: onnx.NodeProto) -> None:
    """y = x / (bias + alpha / size * sum of x^2 over the channel window)^beta; the power as exp(beta log z)
    (z >= bias > 0)."""
    x = ctx.device_value(node, 0)
    size = int(ctx.attr(node, "size"))
    alpha, beta, bias = (float(ctx.attr(node, k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    names = axes(len(x.shape))
    full = ",".join(names)
    lo = (size - 1) // 2
    win = [*names[:1], f"{names[1]}+j-{lo}" if lo else f"{names[1]}+j", *names[2:]]
    sq = ctx.kernel(node, f"Y[{full}] += X[{','.join(win)}] * X[{','.join(win)}]", {"X": x.name},
                    ctx.fresh(node.output[0] + ":sq"), x.shape, extents={"j": size}, kind="lrn_window")
    ctx.kernel(node, f"Y[{full}] = X[{full}] * exp({fmt(-beta)} * log({fmt(bias)} + {fmt(alpha / size)} * S[{full}]))",
               {"X": x.name, "S": sq}, node.output[0], x.shape, kind="lrn")


def _reduced_rows(ctx: Context, node: onnx.NodeProto, src: str, shape: list[int],
                  red: list[int]) -> tuple[str, list[str], list[str], list[int]]:
    """(source, its axis names, the kept axis names, the kept shape) of a reduction over ``red``; a unit axis
    leads when nothing is kept."""
    names = axes(len(shape))
    kept = [n for d, n in enumerate(names) if d not in red]
    if not kept:
        src = ctx.view(node, src, ctx.fresh(src + ":u"), [1, *shape])
        names, kept = ["u", *names], ["u"]
    return src, names, kept, [s for d, s in enumerate(shape) if d not in red] or [1]


def _moments(ctx: Context, node: onnx.NodeProto, src: str, shape: list[int],
             red: list[int]) -> tuple[str, list[str], list[str], str, str]:
    """Mean and (population) variance of ``src`` over the axes ``red``: (source, its axis names, the kept axis
    names, mean, variance)."""
    kind = ctx.element_type(src)
    src, names, kept, row_shape = _reduced_rows(ctx, node, src, shape, red)
    full, row = ",".join(names), ",".join(kept)
    inv = real(1.0 / math.prod(shape[d] for d in red), kind)
    out = node.output[0]
    mean = ctx.kernel(node, f"Y[{row}] += X[{full}] * {inv}", {"X": src}, ctx.fresh(out + ":mean"), row_shape,
                      kind="reduce")
    var = ctx.kernel(node, f"Y[{row}] += (X[{full}] - M[{row}]) * (X[{full}] - M[{row}]) * {inv}",
                     {"X": src, "M": mean}, ctx.fresh(out + ":var"), row_shape, kind="reduce")
    return src, names, kept, mean, var


def _mean_square(ctx: Context, node: onnx.NodeProto, src: str, shape: list[int], red: list[int]) -> str:
    """The mean of the squares of ``src`` over the axes ``red`` (the kept axes' shape, [1] if none)."""
    kind = ctx.element_type(src)
    src, names, kept, row_shape = _reduced_rows(ctx, node, src, shape, red)
    inv = real(1.0 / math.prod(shape[d] for d in red), kind)
    full, row = ",".join(names), ",".join(kept)
    return ctx.kernel(node, f"Y[{row}] += X[{full}] * X[{full}] * {inv}", {"X": src},
                      ctx.fresh(node.output[0] + ":ms"), row_shape, kind="reduce")


def _per_channel(ctx: Context, node: onnx.NodeProto, i: int, shape: list[int], what: str) -> str:
    """Input ``i`` (a scale or bias) as a value of ``shape`` (a view of it, or of the constant reshaped)."""
    c = ctx.const(node.input[i])
    size = c.size if c is not None else ctx.value(node.input[i]).size
    if size != math.prod(shape):
        raise ctx.error(node, f"{what} must have {math.prod(shape)} elements, got {size}")
    v = ctx.device_value(node, i)
    return v.name if list(v.shape) == shape else ctx.view(node, v.name, ctx.fresh(v.name + ":v"), shape)


@translates("InstanceNormalization")
def instance_norm(ctx: Context, node: onnx.NodeProto) -> None:
    """Each (n, c) plane normalised over its spatial elements, then scale[c] and bias[c]."""
    x = ctx.device_value(node, 0)
    if len(x.shape) < 3:
        raise ctx.error(node, f"expected an input [N, C, spatial...], got {list(x.shape)}")
    n, c, p = x.shape[0], x.shape[1], math.prod(x.shape[2:])
    eps = float(ctx.attr(node, "epsilon", 1e-5))
    src = ctx.view(node, x.name, ctx.fresh(x.name + ":ncp"), [n, c, p])
    src, _, _, mean, var = _moments(ctx, node, src, [n, c, p], [2])
    g, b = _per_channel(ctx, node, 1, [c], "scale"), _per_channel(ctx, node, 2, [c], "bias")
    y = ctx.kernel(node, f"Y[i0,i1,i2] = (X[i0,i1,i2] - M[i0,i1]) * rsqrt(V[i0,i1] + {fmt(eps)}) * G[i1] + B[i1]",
                   {"X": src, "M": mean, "V": var, "G": g, "B": b}, ctx.fresh(node.output[0] + ":ncp"), [n, c, p],
                   kind="instancenorm")
    ctx.view(node, y, node.output[0], x.shape)


@translates("GroupNormalization")
def group_norm(ctx: Context, node: onnx.NodeProto) -> None:
    """The channels in ``num_groups`` groups, each (n, group) normalised over its channels' elements, then a
    scale and bias per channel (opset 21; per group before it)."""
    x = ctx.device_value(node, 0)
    if len(x.shape) < 2:
        raise ctx.error(node, f"expected an input [N, C, ...], got {list(x.shape)}")
    groups = int(ctx.attr(node, "num_groups", 0))
    n, c, p = x.shape[0], x.shape[1], math.prod(x.shape[2:])
    if groups <= 0 or c % groups:
        raise ctx.error(node, f"num_groups={groups} does not divide the {c} channels")
    if int(ctx.attr(node, "stash_type", 1)) != 1:
        raise ctx.error(node, "stash_type other than 1 (float32 statistics) is not supported")
    eps = float(ctx.attr(node, "epsilon", 1e-5))
    k = c // groups
    flat = ctx.view(node, x.name, ctx.fresh(x.name + ":ng"), [n, groups, k * p])
    _, _, _, mean, var = _moments(ctx, node, flat, [n, groups, k * p], [2])
    src = ctx.view(node, x.name, ctx.fresh(x.name + ":ngkp"), [n, groups, k, p])
    per_group = ctx.opset < 21
    pshape, pidx = ([groups], "i1") if per_group else ([groups, k], "i1,i2")
    g, b = _per_channel(ctx, node, 1, pshape, "scale"), _per_channel(ctx, node, 2, pshape, "bias")
    y = ctx.kernel(node, f"Y[i0,i1,i2,i3] = (X[i0,i1,i2,i3] - M[i0,i1]) * rsqrt(V[i0,i1] + {fmt(eps)}) * "
                         f"G[{pidx}] + B[{pidx}]", {"X": src, "M": mean, "V": var, "G": g, "B": b},
                   ctx.fresh(node.output[0] + ":ngkp"), [n, groups, k, p], kind="groupnorm")
    ctx.view(node, y, node.output[0], x.shape)


def _axes_attr(ctx: Context, node: onnx.NodeProto, rank: int, default: list[int]) -> list[int]:
    given = ctx.ints(node, "axes", default)
    if any(not -rank <= a < rank for a in given):
        raise ctx.error(node, f"axes {given} out of range for rank {rank}")
    return sorted({a + rank if a < 0 else a for a in given})


@translates("MeanVarianceNormalization")
def mean_variance_norm(ctx: Context, node: onnx.NodeProto) -> None:
    """(x - mean) / (std + 1e-9) over ``axes``, as ONNX defines it."""
    x = ctx.device_value(node, 0)
    red = _axes_attr(ctx, node, len(x.shape), [0, 2, 3])
    src, names, kept, mean, var = _moments(ctx, node, x.name, list(x.shape), red)
    full, row = ",".join(names), ",".join(kept)
    y = ctx.kernel(node, f"Y[{full}] = (X[{full}] - M[{row}]) / (sqrt(V[{row}]) + {fmt(1e-9)})",
                   {"X": src, "M": mean, "V": var}, ctx.fresh(node.output[0] + ":mvn") if src != x.name else
                   node.output[0], [1, *x.shape] if src != x.name else x.shape, kind="mvn")
    if y != node.output[0]:
        ctx.view(node, y, node.output[0], x.shape)


@translates("RMSNormalization")
def rms_norm(ctx: Context, node: onnx.NodeProto) -> None:
    """x / sqrt(mean(x^2) + epsilon) * scale over the axes from ``axis`` on; the scale broadcasts to them."""
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    axis = int(ctx.attr(node, "axis", -1))
    if not -rank <= axis < rank:
        raise ctx.error(node, f"axis {axis} out of range for rank {rank}")
    if int(ctx.attr(node, "stash_type", 1)) != 1:
        raise ctx.error(node, "stash_type other than 1 (float32 statistics) is not supported")
    a = axis + rank if axis < 0 else axis
    eps = float(ctx.attr(node, "epsilon", 1e-5))
    rows, n = math.prod(x.shape[:a]), math.prod(x.shape[a:])
    src = ctx.view(node, x.name, ctx.fresh(x.name + ":2d"), [rows, n])
    ms = _mean_square(ctx, node, src, [rows, n], [1])
    g = _param(ctx, node, 1, list(x.shape[a:]), n)
    y = ctx.kernel(node, f"Y[r,c] = X[r,c] * rsqrt(S[r] + {fmt(eps)}) * G[c]", {"X": src, "S": ms, "G": g},
                   ctx.fresh(node.output[0] + ":2d"), [rows, n], kind="rmsnorm")
    ctx.view(node, y, node.output[0], x.shape)


#: float32's smallest normal number: the divisor of a zero-norm row of LpNormalization, which makes it 0 (as
#: ONNX defines) without changing any other row's divisor unless its norm is subnormal
FLT_MIN = float(np.finfo(np.float32).tiny)


@translates("LpNormalization")
def lp_norm(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    p = int(ctx.attr(node, "p", 2))
    if p not in (1, 2):
        raise ctx.error(node, f"p={p} is not supported (1, 2)")
    axis = int(ctx.attr(node, "axis", -1))
    if not -rank <= axis < rank:
        raise ctx.error(node, f"axis {axis} out of range for rank {rank}")
    red = [axis + rank if axis < 0 else axis]
    names = axes(rank)
    kept = [nm for d, nm in enumerate(names) if d not in red]
    src = x.name
    if not kept:
        src = ctx.view(node, x.name, ctx.fresh(x.name + ":u"), [1, *x.shape])
        names, kept = ["u", *names], ["u"]
    full, row = ",".join(names), ",".join(kept)
    shape = [1] * (len(names) - rank) + list(x.shape)
    row_shape = [s for nm, s in zip(names, shape) if nm in kept]
    term = f"abs(X[{full}])" if p == 1 else f"X[{full}] * X[{full}]"
    norm = ctx.kernel(node, f"Y[{row}] += {term}", {"X": src}, ctx.fresh(node.output[0] + ":norm"), row_shape,
                      kind="reduce")
    div = f"N[{row}]" if p == 1 else f"sqrt(N[{row}])"
    out = node.output[0] if src == x.name else ctx.fresh(node.output[0] + ":u")
    ctx.kernel(node, f"Y[{full}] = X[{full}] / max({div}, {fmt(FLT_MIN)})", {"X": src, "N": norm}, out, shape,
               kind="lpnorm")
    if out != node.output[0]:
        ctx.view(node, out, node.output[0], x.shape)
