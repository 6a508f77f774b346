"""Convolutions, matrix products, pooling and reductions: the operators Roller constructs kernels for."""
from __future__ import annotations

import itertools
import math

import numpy as np
import onnx

from roller.dtypes import dtype as dtype_of
from roller.frontends.onnx.context import Context, fmt, real, real_type, translates
from roller.frontends.onnx.elementwise import axes, broadcast_shape, read
from roller.frontends.onnx.tensor import permute
from roller.graph.ir import Piece, Value

# -- windows (convolution and pooling) -----------------------------------------------------------------------

def window(ctx: Context, node: onnx.NodeProto, spatial: list[int], kernel: list[int],
           ceil_mode: bool = False) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """(strides, dilations, pads before, pads after, output sizes) of a window op, from its attributes (auto_pad
    too)."""
    n = len(spatial)
    strides = ctx.ints(node, "strides") or [1] * n
    dil = ctx.ints(node, "dilations") or [1] * n
    pads = ctx.ints(node, "pads") or [0] * (2 * n)
    auto = ctx.text(node, "auto_pad", "NOTSET")
    if len(strides) != n or len(dil) != n or len(pads) != 2 * n:
        raise ctx.error(node, f"strides, dilations and pads must have {n}, {n} and {2 * n} entries for a "
                              f"{n}-d window")
    if any(s <= 0 for s in strides) or any(d <= 0 for d in dil) or any(p < 0 for p in pads):
        raise ctx.error(node, "strides and dilations must be positive, pads not negative")
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-x // s) for x, s in zip(spatial, strides)]
        total = [max(0, (o - 1) * s + e - x) for o, s, e, x in zip(out, strides, eff, spatial)]
        before = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
        return strides, dil, before, [t - b for t, b in zip(total, before)], out
    if auto == "VALID":
        out = [(x - e) // s + 1 for x, e, s in zip(spatial, eff, strides)]
        if any(o <= 0 for o in out):
            raise ctx.error(node, f"the window does not fit: input {spatial}, kernel {kernel}, output {out}")
        return strides, dil, [0] * n, [0] * n, out
    if auto != "NOTSET":
        raise ctx.error(node, f"auto_pad={auto!r} is not supported (NOTSET, SAME_UPPER, SAME_LOWER, VALID)")
    before, after = pads[:n], pads[n:]
    out = []
    for x, e, s, b, a in zip(spatial, eff, strides, before, after):
        span = x + b + a - e
        o = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= x + b:
            o -= 1   # a window may not start in the right padding (ONNX and PyTorch agree)
        out.append(o)
    if any(o <= 0 for o in out):
        raise ctx.error(node, f"the window does not fit: input {spatial}, kernel {kernel}, output {out}")
    return strides, dil, before, after, out


def _window_index(out_axis: str, win_axis: str, stride: int, dil: int, before: int) -> str:
    parts = [f"{stride}*{out_axis}" if stride != 1 else out_axis,
             f"{dil}*{win_axis}" if dil != 1 else win_axis]
    text = "+".join(parts)
    return f"{text}-{before}" if before > 0 else text


def _reshaped_weight(ctx: Context, node: onnx.NodeProto, w: Value, w_const: np.ndarray | None, shape: list[int],
                     suffix: str) -> str:
    """The weight ``w`` in ``shape``: a reshaped constant where it is one (so that it folds and is laid out as
    a weight), else a view of the value."""
    if w_const is None:
        return ctx.view(node, w.name, ctx.fresh(w.name + suffix), shape)
    return ctx.add_const(w_const.reshape(shape), w.name + suffix)


def conv_kernels(ctx: Context, node: onnx.NodeProto, x: Value, w: Value, w_const: np.ndarray | None, y: str
                 ) -> list[int]:
    """The convolution of the node's attributes of ``x`` by ``w`` (``w_const``: its value where it is a
    constant) into ``y``, without a bias; returns ``y``'s shape."""
    if len(x.shape) < 3 or len(w.shape) != len(x.shape):
        raise ctx.error(node, f"expected input [N, C, spatial...] and weight of the same rank, got {list(x.shape)} "
                              f"and {list(w.shape)}")
    n, c, spatial = x.shape[0], x.shape[1], list(x.shape[2:])
    f, cg, kernel = w.shape[0], w.shape[1], list(w.shape[2:])
    group = int(ctx.attr(node, "group", 1))
    if group <= 0 or c % group or f % group or c // group != cg:
        raise ctx.error(node, f"group={group} does not fit input channels {c}, weight {list(w.shape)}")
    given = ctx.ints(node, "kernel_shape")
    if given and given != kernel:
        raise ctx.error(node, f"kernel_shape {given} differs from the weight's {kernel}")
    strides, dil, before, after, out = window(ctx, node, spatial, kernel)
    o_ax = [f"o{d}" for d in range(len(spatial))]
    k_ax = [f"k{d}" for d in range(len(spatial))]
    x_sp = [_window_index(o, k, s, d, b) for o, k, s, d, b in zip(o_ax, k_ax, strides, dil, before)]
    fg = f // group
    if group == 1 and all(k == 1 for k in kernel) and not any(before) and not any(after):
        # A pointwise convolution: without its unit window axes the spatial axes are plain in X and Y, so
        # axis fusion sees a matmul over N*H*W. With them, X's index o+k kept H and W apart: MobileNetV2's
        # 160->960 channels at 7x7 ran 22-40 GFLOP/s on PoCL, the same product as a matmul 130.
        wv = _reshaped_weight(ctx, node, w, w_const, [f, c], ":pw")
        x_pw = [f"{s}*{o}" if s != 1 else o for o, s in zip(o_ax, strides)]
        text = f"Y[n,f,{','.join(o_ax)}] += X[n,c,{','.join(x_pw)}] * W[f,c]"
        ctx.kernel(node, text, {"X": x.name, "W": wv}, y, [n, f, *out], kind="conv2d")
    elif group == 1:
        # The named conv2d's form (X first, W second): construction lowers it as an implicit GEMM.
        text = (f"Y[n,f,{','.join(o_ax)}] += X[n,c,{','.join(x_sp)}] * W[f,c,{','.join(k_ax)}]")
        ctx.kernel(node, text, {"X": x.name, "W": w.name}, y, [n, f, *out], kind="conv2d")
    elif cg == 1 and fg == 1:
        # depthwise: one filter per channel
        wv = _reshaped_weight(ctx, node, w, w_const, [c, *kernel], ":dw")
        text = f"Y[n,c,{','.join(o_ax)}] += X[n,c,{','.join(x_sp)}] * W[c,{','.join(k_ax)}]"
        ctx.kernel(node, text, {"X": x.name, "W": wv}, y, [n, c, *out], kind="depthwise_conv2d")
    else:
        xv = ctx.view(node, x.name, ctx.fresh(x.name + ":g"), [n, group, cg, *spatial])
        wv = ctx.view(node, w.name, ctx.fresh(w.name + ":g"), [group, fg, cg, *kernel])
        yg = ctx.fresh(y + ":g")
        text = (f"Y[n,g,f,{','.join(o_ax)}] += X[n,g,c,{','.join(x_sp)}] * W[g,f,c,{','.join(k_ax)}]")
        ctx.kernel(node, text, {"X": xv, "W": wv}, yg, [n, group, fg, *out], kind="grouped_conv")
        ctx.view(node, yg, y, [n, f, *out])
    return [n, f, *out]


@translates("Conv")
def conv(ctx: Context, node: onnx.NodeProto) -> None:
    x, w = ctx.device_value(node, 0), ctx.device_value(node, 1)
    y = node.output[0] if not ctx.has(node, 2) else ctx.fresh(node.output[0] + ":conv")
    n, f, *out = conv_kernels(ctx, node, x, w, ctx.const(node.input[1]), y)
    if ctx.has(node, 2):
        b = ctx.device_value(node, 2)
        if b.shape != (f,):
            raise ctx.error(node, f"bias must have shape [{f}], got {list(b.shape)}")
        names = axes(2 + len(out))
        ctx.kernel(node, f"Y[{','.join(names)}] = X[{','.join(names)}] + B[{names[1]}]",
                   {"X": y, "B": b.name}, node.output[0], [n, f, *out], kind="bias")


# -- matrix products -------------------------------------------------------------------------------------------

@translates("Gemm")
def gemm(ctx: Context, node: onnx.NodeProto) -> None:
    alpha = float(ctx.attr(node, "alpha", 1.0))
    beta = float(ctx.attr(node, "beta", 1.0))
    ta, tb = int(ctx.attr(node, "transA", 0)), int(ctx.attr(node, "transB", 0))
    a, b = ctx.device_value(node, 0), ctx.device_value(node, 1)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ctx.error(node, f"expected 2-d A and B, got {list(a.shape)} and {list(b.shape)}")
    m, k = (a.shape[1], a.shape[0]) if ta else a.shape
    k2, n = (b.shape[1], b.shape[0]) if tb else b.shape
    if k != k2:
        raise ctx.error(node, f"A {list(a.shape)} (transA={ta}) and B {list(b.shape)} (transB={tb}) do not multiply")
    ra = "A[k,m]" if ta else "A[m,k]"
    rb = "B[n,k]" if tb else "B[k,n]"
    scale = "" if alpha == 1.0 else f" * {fmt(alpha)}"
    has_c = ctx.has(node, 2) and beta != 0.0
    y = ctx.fresh(node.output[0] + ":mm") if has_c else node.output[0]
    ctx.kernel(node, f"Y[m,n] += {ra} * {rb}{scale}", {"A": a.name, "B": b.name}, y, [m, n], kind="matmul")
    if has_c:
        cval = ctx.const(node.input[2])
        cshape = list(cval.shape) if cval is not None else list(ctx.value(node.input[2]).shape)
        broadcast_shape(ctx, node, [cshape, [m, n]])
        c_v = ctx.device_value(node, 2)
        term = read("C", cshape, [m, n]).replace("i0", "m").replace("i1", "n")
        cterm = term if beta == 1.0 else f"{fmt(beta)} * {term}"
        ctx.kernel(node, f"Y[m,n] = P[m,n] + {cterm}", {"P": y, "C": c_v.name}, node.output[0], [m, n],
                   kind="bias")


@translates("MatMul")
def matmul(ctx: Context, node: onnx.NodeProto) -> None:
    matmul_kernel(ctx, node, ctx.device_value(node, 0), ctx.device_value(node, 1), node.output[0])


def matmul_kernel(ctx: Context, node: onnx.NodeProto, a: Value, b: Value, output: str) -> list[int]:
    """``a @ b`` under numpy's rules (batch dims broadcast, a 1-d side a row or a column, dropped again) into
    ``output``; returns its shape."""
    sa, sb = list(a.shape), list(b.shape)
    if not sa or not sb:
        raise ctx.error(node, "MatMul of a scalar is not defined")
    a_name, b_name = a.name, b.name
    if len(sa) == 1:
        a_name, sa = ctx.view(node, a.name, ctx.fresh(a.name + ":row"), [1, sa[0]]), [1, sa[0]]
    if len(sb) == 1:
        b_name, sb = ctx.view(node, b.name, ctx.fresh(b.name + ":col"), [sb[0], 1]), [sb[0], 1]
    if sa[-1] != sb[-2]:
        raise ctx.error(node, f"shapes {list(a.shape)} and {list(b.shape)} do not multiply")
    batch = broadcast_shape(ctx, node, [sa[:-2], sb[:-2]])
    out_shape = [*batch, sa[-2], sb[-1]]
    nb = len(batch)
    bax = [f"b{d}" for d in range(nb)]

    def operand(t: str, shape: list[int], inner: list[str]) -> str:
        lead = nb - (len(shape) - 2)
        idx = [bax[lead + d] if shape[d] == batch[lead + d] else "0" for d in range(len(shape) - 2)]
        return f"{t}[{','.join(idx + inner)}]"

    y_idx = ",".join([*bax, "m", "n"])
    final = [*batch, *([sa[-2]] if len(a.shape) > 1 else []), *([sb[-1]] if len(b.shape) > 1 else [])]
    y = output if final == out_shape else ctx.fresh(output + ":mm")
    kind = "matmul" if nb == 0 else "batch_matmul"
    ctx.kernel(node, f"Y[{y_idx}] += {operand('A', sa, ['m', 'k'])} * {operand('B', sb, ['k', 'n'])}",
               {"A": a_name, "B": b_name}, y, out_shape, kind=kind)
    if y != output:
        ctx.view(node, y, output, final)
    return final


# -- pooling -------------------------------------------------------------------------------------------------

@translates("MaxPool", "AveragePool")
def pool(ctx: Context, node: onnx.NodeProto) -> None:
    if len([o for o in node.output if o]) > 1:
        raise ctx.error(node, "the Indices output of MaxPool is not supported")
    x = ctx.device_value(node, 0)
    n, c, spatial = x.shape[0], x.shape[1], list(x.shape[2:])
    kernel = ctx.ints(node, "kernel_shape")
    if len(kernel) != len(spatial):
        raise ctx.error(node, f"kernel_shape {kernel} does not match the {len(spatial)} spatial dims of "
                              f"{list(x.shape)}")
    if int(ctx.attr(node, "storage_order", 0)):
        raise ctx.error(node, "storage_order=1 is not supported")
    ceil_mode = bool(ctx.attr(node, "ceil_mode", 0))
    strides, dil, before, after, out = window(ctx, node, spatial, kernel, ceil_mode)
    o_ax = [f"o{d}" for d in range(len(spatial))]
    k_ax = [f"k{d}" for d in range(len(spatial))]
    x_sp = [_window_index(o, k, s, d, b) for o, k, s, d, b in zip(o_ax, k_ax, strides, dil, before)]
    extents = dict(zip(k_ax, kernel))
    y_idx = f"Y[n,c,{','.join(o_ax)}]"
    if node.op_type == "MaxPool":
        # A window's points outside the input take no part: -inf for floats, the type's least value for the
        # integer types (a QOperator model pools its uint8 activations as they are).
        kind = dtype_of(x.dtype)
        if kind.kind == "bool":
            raise ctx.error(node, "MaxPool of a bool tensor is not supported (ONNX defines it for numbers)")
        low = float(np.iinfo(kind.host).min) if kind.integral else float("-inf")
        ctx.kernel(node, f"{y_idx} max= X[n,c,{','.join(x_sp)}]", {"X": x.name}, node.output[0], [n, c, *out],
                   pad_value=low, extents=extents, kind="maxpool")
        return
    include = bool(ctx.attr(node, "count_include_pad", 0))
    inv: np.ndarray = divisors(spatial, kernel, strides, dil, before, after, out, include).astype(real_type(x.dtype))
    d = ctx.add_const(inv, ctx.fresh(node.output[0] + ":inv_count"))
    ctx.kernel(node, f"{y_idx} += X[n,c,{','.join(x_sp)}] * D[{','.join(o_ax)}]", {"X": x.name, "D": d},
               node.output[0], [n, c, *out], extents=extents, kind="avgpool")


@translates("LpPool")
def lp_pool(ctx: Context, node: onnx.NodeProto) -> None:
    """(sum of |x|^p over the window)^(1/p), the padding counting as zeros: a pooling operator of |x|^p (a
    product for the power), then the root (sqrt for p = 2, exp(log(s) / p) above)."""
    x = ctx.device_value(node, 0)
    n, c, spatial = x.shape[0], x.shape[1], list(x.shape[2:])
    kernel = ctx.ints(node, "kernel_shape")
    if len(kernel) != len(spatial):
        raise ctx.error(node, f"kernel_shape {kernel} does not match the {len(spatial)} spatial dims of "
                              f"{list(x.shape)}")
    p = int(ctx.attr(node, "p", 2))
    if not 1 <= p <= MAX_POOL_POWER:
        raise ctx.error(node, f"p={p} is not supported (1 to {MAX_POOL_POWER})")
    strides, dil, before, _, out = window(ctx, node, spatial, kernel, bool(ctx.attr(node, "ceil_mode", 0)))
    o_ax = [f"o{d}" for d in range(len(spatial))]
    k_ax = [f"k{d}" for d in range(len(spatial))]
    x_sp = [_window_index(o, k, s, d, b) for o, k, s, d, b in zip(o_ax, k_ax, strides, dil, before)]
    read_x = f"X[n,c,{','.join(x_sp)}]"
    term = f"{read_x} * {read_x}" if p == 2 else " * ".join([f"abs({read_x})"] * p)
    y_idx = f"n,c,{','.join(o_ax)}"
    shape = [n, c, *out]
    total = node.output[0] if p == 1 else ctx.fresh(node.output[0] + ":sum")
    ctx.kernel(node, f"Y[{y_idx}] += {term}", {"X": x.name}, total, shape, extents=dict(zip(k_ax, kernel)),
               kind="lppool")
    if p > 1:
        root = f"sqrt(S[{y_idx}])" if p == 2 else f"exp(log(S[{y_idx}]) * {real(1.0 / p, x.dtype)})"
        ctx.kernel(node, f"Y[{y_idx}] = {root}", {"S": total}, node.output[0], shape, kind="lppool_root")


#: the largest LpPool power written as a product
MAX_POOL_POWER = 16


def divisors(spatial: list[int], kernel: list[int], strides: list[int], dil: list[int], before: list[int],
             after: list[int], out: list[int], include_pad: bool) -> np.ndarray:
    """1 / the number of window points each output averages: those inside the input, or with
    ``include_pad`` those inside the padded input (a window across its end counts only its part inside)."""
    per_dim = []
    for x, k, s, d, b, a, o in zip(spatial, kernel, strides, dil, before, after, out):
        lo, hi = (-b, x + a) if include_pad else (0, x)
        starts = np.arange(o) * s - b
        points = starts[:, None] + np.arange(k)[None, :] * d
        per_dim.append(((points >= lo) & (points < hi)).sum(axis=1))
    count = per_dim[0].astype(np.float64)
    for c in per_dim[1:]:
        count = np.multiply.outer(count, c)
    return 1.0 / np.maximum(count, 1)


@translates("GlobalAveragePool", "GlobalMaxPool")
def global_pool(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    n, c, spatial = x.shape[0], x.shape[1], list(x.shape[2:])
    sp = [f"s{d}" for d in range(len(spatial))]
    tmp = ctx.fresh(node.output[0] + ":nc")
    if node.op_type == "GlobalMaxPool":
        ctx.kernel(node, f"Y[n,c] max= X[n,c,{','.join(sp)}]", {"X": x.name}, tmp, [n, c], kind="reduce")
    else:
        inv = real(1.0 / math.prod(spatial), x.dtype)
        ctx.kernel(node, f"Y[n,c] += X[n,c,{','.join(sp)}] * {inv}", {"X": x.name}, tmp, [n, c], kind="reduce")
    ctx.view(node, tmp, node.output[0], [n, c] + [1] * len(spatial))


# -- reductions ----------------------------------------------------------------------------------------------

#: per reduction: how each element enters (a format of the read ``{x}``), the reducing assignment, and what is
#: applied to the reduced value (a format of ``{r}``)
REDUCE = {"ReduceSum": ("{x}", "+=", "{r}"), "ReduceMean": ("{x}", "+=", "{r}"),
          "ReduceMax": ("{x}", "max=", "{r}"), "ReduceMin": ("{x}", "min=", "{r}"),
          "ReduceSumSquare": ("{x} * {x}", "+=", "{r}"), "ReduceL1": ("abs({x})", "+=", "{r}"),
          "ReduceL2": ("{x} * {x}", "+=", "sqrt({r})"), "ReduceLogSum": ("{x}", "+=", "log({r})"),
          "ReduceLogSumExp": ("exp({x} - M[{kept}])", "+=", "log({r}) + M[{kept}]")}
#: float32's largest finite value: the row maximum of a log-sum-exp treats +inf as this, so that an infinite
#: element gives +inf (exp(inf - max)) rather than NaN (inf - inf), as ONNX's reference does
FLT_MAX = float(np.finfo(np.float32).max)


@translates(*REDUCE)
def reduce(ctx: Context, node: onnx.NodeProto) -> None:
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    attr_axes = ctx.attr(node, "axes", None)
    if ctx.has(node, 1):
        red = [int(a) for a in ctx.const_input(node, 1, "axes").reshape(-1)]
    else:
        red = [int(a) for a in attr_axes] if attr_axes is not None else []
    noop = not red and bool(int(ctx.attr(node, "noop_with_empty_axes", 0)))
    if not red and not noop:
        red = list(range(rank))
    if any(not -rank <= a < rank for a in red):
        raise ctx.error(node, f"axes {red} out of range for rank {rank}")
    red = sorted({a + rank if a < 0 else a for a in red})
    term, op, post = REDUCE[node.op_type]
    names = axes(rank)
    full = ",".join(names)
    if noop:
        # No axes and noop_with_empty_axes: each element alone is "reduced" (ReduceSumSquare squares it...).
        body = post.format(r=term.format(x=f"X[{full}]"))
        if node.op_type in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceLogSumExp"):
            ctx.view(node, x.name, node.output[0], x.shape)
        else:
            ctx.kernel(node, f"Y[{full}] = {body}", {"X": x.name}, node.output[0], x.shape, kind="reduce")
        return
    keep = bool(ctx.attr(node, "keepdims", 1))
    kept = [names[d] for d in range(rank) if d not in red]
    count = math.prod(x.shape[d] for d in red)
    out_shape = [x.shape[d] for d in range(rank) if d not in red]
    final = [1 if d in red else x.shape[d] for d in range(rank)] if keep else out_shape
    x_name = x.name
    if not kept:   # a reduction to one element: a unit axis to index the output with
        names, kept = ["u", *names], ["u"]
        x_name = ctx.view(node, x.name, ctx.fresh(x.name + ":u"), [1, *x.shape])
        full = ",".join(names)
    row = ",".join(kept)
    tmp_shape = out_shape or [1]
    ins = {"X": x_name}
    if node.op_type == "ReduceLogSumExp":
        ins["M"] = ctx.kernel(node, f"Y[{row}] max= min(X[{full}], {fmt(FLT_MAX)})", {"X": x_name},
                              ctx.fresh(node.output[0] + ":max"), tmp_shape, kind="reduce")
    body = term.format(x=f"X[{full}]", kept=row)
    if node.op_type == "ReduceMean":
        body = f"{body} * {real(1.0 / count, x.dtype)}"
    y = node.output[0] if final == tmp_shape and post == "{r}" else ctx.fresh(node.output[0] + ":r")
    ctx.kernel(node, f"Y[{row}] {op} {body}", ins, y, tmp_shape, kind="reduce")
    if post != "{r}":
        done = node.output[0] if final == tmp_shape else ctx.fresh(node.output[0] + ":p")
        ins = {"R": y, **({"M": ins["M"]} if "M" in ins else {})}
        y = ctx.kernel(node, f"Y[{row}] = {post.format(r=f'R[{row}]', kept=row)}", ins, done, tmp_shape,
                       kind="reduce_post")
    if y != node.output[0]:
        ctx.view(node, y, node.output[0], final)


# -- transposed convolution ------------------------------------------------------------------------------------

def _affine(terms: list[tuple[int, str]], const: int) -> str:
    """An index expression: sum of coef * axis, plus const."""
    out = ""
    for coef, axis in terms:
        if coef == 0:
            continue
        t = axis if abs(coef) == 1 else f"{abs(coef)}*{axis}"
        out += ("-" if coef < 0 else ("+" if out else "")) + t
    if const or not out:
        out += f"{const:+d}" if out else str(const)
    return out


@translates("ConvTranspose")
def conv_transpose(ctx: Context, node: onnx.NodeProto) -> None:
    """A transposed convolution as ``stride`` phases per spatial axis: output element o = s q + r receives, for
    phase r, exactly the taps k with r + pad - d k divisible by s, which are evenly spaced, reading input
    q + (r + pad - d k) / s: one convolution operator per phase (affine reads, no zeros inserted), the phases
    stacked by copies, interleaved by one transpose and cut to the output size."""
    x = ctx.device_value(node, 0)
    w = ctx.device_value(node, 1)
    nsp = len(x.shape) - 2
    if nsp < 1 or len(w.shape) != len(x.shape):
        raise ctx.error(node, f"expected input [N, C, spatial...] and weight of the same rank, got {list(x.shape)} "
                              f"and {list(w.shape)}")
    n, c, spatial = x.shape[0], x.shape[1], list(x.shape[2:])
    group = int(ctx.attr(node, "group", 1))
    cg, fg, kernel = w.shape[0], w.shape[1], list(w.shape[2:])
    if group <= 0 or c % group or c != cg:
        raise ctx.error(node, f"group={group} does not fit input channels {c}, weight {list(w.shape)}")
    given = ctx.ints(node, "kernel_shape")
    if given and given != kernel:
        raise ctx.error(node, f"kernel_shape {given} differs from the weight's {kernel}")
    strides = ctx.ints(node, "strides") or [1] * nsp
    dil = ctx.ints(node, "dilations") or [1] * nsp
    out_pad = ctx.ints(node, "output_padding") or [0] * nsp
    out_shape = ctx.ints(node, "output_shape")
    auto = ctx.text(node, "auto_pad", "NOTSET")
    if auto not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise ctx.error(node, f"auto_pad={auto!r} is not supported (NOTSET, SAME_UPPER, SAME_LOWER, VALID)")
    if any(len(v) != nsp for v in (strides, dil, out_pad)) or (out_shape and len(out_shape) != nsp):
        raise ctx.error(node, f"strides, dilations, output_padding and output_shape need {nsp} entries")
    if any(v <= 0 for v in strides + dil) or any(v < 0 for v in out_pad):
        raise ctx.error(node, "strides and dilations must be positive, output_padding not negative")
    full = [s * (i - 1) + p + (k - 1) * d + 1 for s, i, p, k, d in zip(strides, spatial, out_pad, kernel, dil)]
    # Pads and output size as ONNX's reference computes them (its test expectations): explicit pads (or none)
    # unless auto_pad is SAME_*, whose pads come from the output shape (by default input * stride).
    if auto in ("SAME_UPPER", "SAME_LOWER") and not ctx.ints(node, "pads"):
        out = out_shape or [i * s for i, s in zip(spatial, strides)]
        total = [f - o for f, o in zip(full, out)]
        before = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
    else:
        pads = ctx.ints(node, "pads") or [0] * (2 * nsp)
        if len(pads) != 2 * nsp:
            raise ctx.error(node, f"pads need {2 * nsp} entries")
        before = pads[:nsp]
        out = out_shape or [f - b - a for f, b, a in zip(full, before, pads[nsp:])]
    if any(o <= 0 for o in out):
        raise ctx.error(node, f"the output would be empty: {out}")
    q_len = [-(-o // s) for o, s in zip(out, strides)]
    xv = ctx.view(node, x.name, ctx.fresh(x.name + ":g"), [n, group, c // group, *spatial])
    wv = ctx.view(node, w.name, ctx.fresh(w.name + ":g"), [group, c // group, fg, *kernel])
    q_ax = [f"q{d}" for d in range(nsp)]
    phase_shape = [n, group, fg, *q_len]
    phases = []
    for rs in itertools.product(*[range(s) for s in strides]):
        x_idx, w_idx, extents, empty = [], [], {}, False
        for d, (r, s, k, dd, b) in enumerate(zip(rs, strides, kernel, dil, before)):
            taps = [t for t in range(k) if (r + b - dd * t) % s == 0]
            if not taps:
                empty = True
                break
            step = taps[1] - taps[0] if len(taps) > 1 else 1
            j = f"j{d}"
            extents[j] = len(taps)
            x_idx.append(_affine([(1, q_ax[d]), (-(dd * step) // s, j)], (r + b - dd * taps[0]) // s))
            if step == 1 and taps[0] == 0 and len(taps) != k:
                # A plain j would take the weight's whole extent: offset it by a unit reduction axis.
                extents[f"u{d}"] = 1
                w_idx.append(f"{j}+u{d}")
            else:
                w_idx.append(_affine([(step, j)], taps[0]))
        name = ctx.fresh(f"{node.output[0]}:phase{''.join(map(str, rs))}")
        if empty:   # no tap reaches this phase: zeros
            phases.append(ctx.add_const(np.zeros(phase_shape, np.float32), name))
            continue
        text = (f"Y[n,g,f,{','.join(q_ax)}] += X[n,g,c,{','.join(x_idx)}] * W[g,c,f,{','.join(w_idx)}]")
        phases.append(ctx.kernel(node, text, {"X": xv, "W": wv}, name, phase_shape, extents=extents,
                                 kind="conv_transpose"))
    m = group * fg
    y = node.output[0] if not ctx.has(node, 2) else ctx.fresh(node.output[0] + ":convt")
    wide = [n, m, *[q * s for q, s in zip(q_len, strides)]]
    if len(phases) == 1:
        inter = ctx.view(node, phases[0], ctx.fresh(node.output[0] + ":wide"), wide)
    else:
        # stack [s0, s1, ..., n, g, f, q0, q1, ...], interleave to [n, g, f, q0, s0, q1, s1, ...]
        unit = [1] * nsp
        stack_shape = [*strides, *phase_shape]
        pieces = []
        for rs, ph in zip(itertools.product(*[range(s) for s in strides]), phases):
            pv = ctx.view(node, ph, ctx.fresh(ph + ":1"), [*unit, *phase_shape])
            pieces.append(Piece(pv, (0,) * len(stack_shape), (*rs, *[0] * len(phase_shape)),
                                (*unit, *phase_shape)))
        stacked = ctx.copy(node, pieces, ctx.fresh(node.output[0] + ":phases"), stack_shape)
        perm = [nsp, nsp + 1, nsp + 2] + [v for d in range(nsp) for v in (nsp + 3 + d, d)]
        moved = permute(ctx, node, stacked, stack_shape, perm, ctx.fresh(node.output[0] + ":interleaved"))
        inter = ctx.view(node, moved, ctx.fresh(node.output[0] + ":wide"), wide)
    final = [n, m, *out]
    if wide != final:
        ctx.copy(node, [Piece(inter, (0,) * len(final), (0,) * len(final), tuple(final))], y, final)
    else:
        ctx.view(node, inter, y, final)
    if ctx.has(node, 2):
        bias = ctx.device_value(node, 2)
        if bias.shape != (m,):
            raise ctx.error(node, f"bias must have shape [{m}], got {list(bias.shape)}")
        names = axes(2 + nsp)
        ctx.kernel(node, f"Y[{','.join(names)}] = X[{','.join(names)}] + B[{names[1]}]", {"X": y, "B": bias.name},
                   node.output[0], final, kind="bias")
