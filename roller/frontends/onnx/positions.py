"""ONNX ops whose result depends on where an element sits: CumSum (position ids from an attention mask),
ArgMax/ArgMin (greedy decoding) and Trilu (causal masks), each written with axis values and the typed
functions (``roller.ir.types``) so that integer and bool tensors stay on the device."""
from __future__ import annotations

import onnx

from roller.frontends.onnx.context import Context, translates
from roller.frontends.onnx.elementwise import axes
from roller.frontends.onnx.tensor import _axis


def _scalar_axis(ctx: Context, node: onnx.NodeProto, rank: int) -> int:
    a = ctx.const_input(node, 1, "axis").reshape(-1)
    if a.size != 1:
        raise ctx.error(node, f"axis must hold one value, got {a.size}")
    return _axis(ctx, node, int(a[0]), rank)


@translates("CumSum")
def cumsum(ctx: Context, node: onnx.NodeProto) -> None:
    """Running sums along an axis as one reduction over a second axis ``k``, each point summing the elements at
    or before it (after it with ``reverse``; strictly with ``exclusive``): n^2/2 additions per row, which is
    what a row of a mask or a position table costs nothing to."""
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    axis = _scalar_axis(ctx, node, rank)
    exclusive, reverse = bool(ctx.attr(node, "exclusive", 0)), bool(ctx.attr(node, "reverse", 0))
    names = axes(rank)
    at = list(names)
    at[axis] = "k"
    i = names[axis]
    keep = {(False, False): f"le(k, {i})", (True, False): f"lt(k, {i})", (False, True): f"ge(k, {i})",
            (True, True): f"gt(k, {i})"}[(exclusive, reverse)]
    ctx.kernel(node, f"Y[{','.join(names)}] += where({keep}, X[{','.join(at)}], 0)", {"X": x.name},
               node.output[0], x.shape, extents={"k": x.shape[axis]}, dtype=x.dtype)


@translates("ArgMax", "ArgMin")
def arg_extreme(ctx: Context, node: onnx.NodeProto) -> None:
    """The index of the greatest (least) element along an axis, int64: the extreme value by one reduction, then
    the first (with ``select_last_index``, the last) position holding it by a second. A row holding NaN gives
    the index of an element equal to its maximum ignoring NaN (numpy gives the NaN's)."""
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    axis = _axis(ctx, node, int(ctx.attr(node, "axis", 0)), rank)
    last = bool(ctx.attr(node, "select_last_index", 0))
    names = axes(rank)
    # both reductions keep the axis as one of extent 1 (z), so that a rank-1 input still has an output axis
    out_idx = ",".join("z" if d == axis else n for d, n in enumerate(names))
    in_idx = ",".join("k" if d == axis else n for d, n in enumerate(names))
    kept = [1 if d == axis else s for d, s in enumerate(x.shape)]
    ext = {"k": x.shape[axis], "z": 1}
    op = "max" if node.op_type == "ArgMax" else "min"
    best = ctx.kernel(node, f"Y[{out_idx}] {op}= X[{in_idx}]", {"X": x.name}, ctx.fresh(node.output[0] + ":best"),
                      kept, extents=ext, kind="reduce")
    pick, miss = ("max", -1) if last else ("min", x.shape[axis])
    keep = bool(ctx.attr(node, "keepdims", 1))
    target = node.output[0] if keep else ctx.fresh(node.output[0] + ":kept")
    ctx.kernel(node, f"Y[{out_idx}] {pick}= where(eq(X[{in_idx}], B[{out_idx}]), k, {miss})",
               {"X": x.name, "B": best}, target, kept, extents=ext, dtype="int64", kind="arg")
    if not keep:
        ctx.view(node, target, node.output[0], [s for d, s in enumerate(x.shape) if d != axis])


@translates("Trilu")
def trilu(ctx: Context, node: onnx.NodeProto) -> None:
    """The lower (``upper=0``) or upper triangle of the last two axes, the k-th diagonal included, zeros
    elsewhere: ``j <= i + k`` or ``j >= i + k`` per element."""
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    if rank < 2:
        raise ctx.error(node, f"the input has rank {rank}; Trilu takes rank 2 or more")
    k = int(ctx.const_input(node, 1, "k").reshape(-1)[0]) if ctx.has(node, 1) else 0
    names = axes(rank)
    i, j = names[-2], names[-1]
    keep = f"ge({j} - {i}, {k})" if int(ctx.attr(node, "upper", 1)) else f"le({j} - {i}, {k})"
    idx = ",".join(names)
    ctx.kernel(node, f"Y[{idx}] = where({keep}, X[{idx}], 0)", {"X": x.name}, node.output[0], x.shape,
               dtype=x.dtype)
