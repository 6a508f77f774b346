"""ONNX ops whose result depends on where an element sits: CumSum (position ids from an attention mask),
ArgMax/ArgMin (greedy decoding), TopK and Trilu (causal masks), each written with axis values and the typed
functions (``roller.ir.types``) so that integer and bool tensors stay on the device."""
from __future__ import annotations

import onnx

from roller.frontends.onnx.context import FLOAT_TYPES, Context, translates
from roller.frontends.onnx.elementwise import axes
from roller.frontends.onnx.tensor import _axis
from roller.graph.ir import Piece, Value


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


#: TopK ranks every element (n^2 comparisons a row) up to this axis size or above this K; otherwise it picks
#: the K elements one after another, a few O(n) reductions each (a vocabulary's top 50: 150 small kernels)
RANK_ALL_UP_TO = 1024
PICK_AT_MOST = 32


@translates("TopK")
def top_k(ctx: Context, node: onnx.NodeProto) -> None:
    """The ``k`` greatest (``largest=0``: least) elements along an axis and their int64 indices, always in
    order: equal values by index, NaN above every number (as onnx.reference's sort). ``k`` must be known at
    import (it sizes the outputs)."""
    x = ctx.device_value(node, 0)
    rank = len(x.shape)
    if not rank:
        raise ctx.error(node, "TopK of a scalar")
    axis = _axis(ctx, node, int(ctx.attr(node, "axis", -1)), rank)
    ks = ctx.const_input(node, 1, "K").reshape(-1)
    n = x.shape[axis]
    if ks.size != 1 or not 1 <= int(ks[0]) <= n:
        raise ctx.error(node, f"K {ks.tolist()} must be one value from 1 to the axis size {n}")
    k = int(ks[0])
    order = _Order(x.dtype, bool(ctx.attr(node, "largest", 1)))
    shape = [k if d == axis else s for d, s in enumerate(x.shape)]
    target = node.output[1] if len(node.output) > 1 and node.output[1] else ctx.fresh(node.output[0] + ":indices")
    if n <= RANK_ALL_UP_TO or k > PICK_AT_MOST:
        indices = _top_by_rank(ctx, node, x, axis, k, order, target)
    else:
        indices = _top_by_picks(ctx, node, x, axis, k, order, target)
    names = axes(rank)
    at = ",".join(f"I[{','.join(names)}]" if d == axis else s for d, s in enumerate(names))
    ctx.kernel(node, f"Y[{','.join(names)}] = X[{at}]", {"X": x.name, "I": indices}, node.output[0], shape,
               dtype=x.dtype, kind="gather")


class _Order:
    """TopK's order as expressions: ``before(a, i, b, j)`` says that element ``a`` at position ``i`` comes
    before element ``b`` at ``j``."""

    def __init__(self, dtype: str, largest: bool) -> None:
        self.floats, self.largest = dtype in FLOAT_TYPES, largest

    def ahead(self, a: str, b: str) -> str:
        text = f"{'gt' if self.largest else 'lt'}({a}, {b})"
        if not self.floats:
            return text
        nan_first = f"and(isnan({a}), not(isnan({b})))" if self.largest else f"and(isnan({b}), not(isnan({a})))"
        return f"or({text}, {nan_first})"

    def same(self, a: str, b: str) -> str:
        return f"or(eq({a}, {b}), and(isnan({a}), isnan({b})))" if self.floats else f"eq({a}, {b})"

    def before(self, a: str, i: str, b: str, j: str) -> str:
        return f"or({self.ahead(a, b)}, and({self.same(a, b)}, lt({i}, {j})))"


def _top_by_rank(ctx: Context, node: onnx.NodeProto, x: Value, axis: int, k: int, order: _Order,
                 target: str) -> str:
    """Each element's rank (how many elements come before it), then the index holding each rank below k."""
    names = axes(len(x.shape))
    here = ",".join(names)
    there = ",".join("t" if d == axis else s for d, s in enumerate(names))
    before = order.before(f"X[{there}]", "t", f"X[{here}]", names[axis])
    ranks = ctx.kernel(node, f"Y[{here}] += where({before}, 1, 0)", {"X": x.name},
                       ctx.fresh(node.output[0] + ":rank"), x.shape, extents={"t": x.shape[axis]}, dtype="int64",
                       kind="rank")
    shape = [k if d == axis else s for d, s in enumerate(x.shape)]
    return ctx.kernel(node, f"Y[{here}] max= where(eq(R[{there}], {names[axis]}), t, -1)", {"R": ranks}, target,
                      shape, extents={"t": x.shape[axis]}, dtype="int64", kind="arg")


def _top_by_picks(ctx: Context, node: onnx.NodeProto, x: Value, axis: int, k: int, order: _Order,
                  target: str) -> str:
    """The k elements one at a time, each the first in order among those after the previous pick: its value
    (the extreme number among them; reductions propagate NaN, so NaN is left out of it), whether NaN is the
    one to take instead (floats), then the least index holding it."""
    rank, n = len(x.shape), x.shape[axis]
    names = axes(rank)
    one = ",".join("z" if d == axis else s for d, s in enumerate(names))
    there = ",".join("t" if d == axis else s for d, s in enumerate(names))
    kept = [1 if d == axis else s for d, s in enumerate(x.shape)]
    ext = {"t": n, "z": 1}
    xt = f"X[{there}]"
    extreme, other = ("max", "min") if order.largest else ("min", "max")
    if order.floats:   # what stands in for an element left out: never above (below) a number taken
        fill, fill_read = None, "-inf" if order.largest else "inf"
    else:
        fill = ctx.kernel(node, f"Y[{one}] {other}= {xt}", {"X": x.name}, ctx.fresh(node.output[0] + ":fill"),
                          kept, extents=ext, kind="reduce")
        fill_read = f"F[{one}]"
    picks: list[str] = []
    for p in range(k):
        ins = {"X": x.name}
        after: list[str] = []   # the elements after the previous pick (every element for the first)
        if picks:   # the previous pick's value by a read of its own (reductions read no run-time index)
            prev_at = ",".join(f"P[{one}]" if d == axis else s for d, s in enumerate(names))
            last = ctx.kernel(node, f"Y[{one}] = X[{prev_at}]", {"X": x.name, "P": picks[-1]},
                              ctx.fresh(f"{node.output[0]}:last{p}"), kept, extents={"z": 1}, dtype=x.dtype,
                              kind="gather")
            ins.update(P=picks[-1], L=last)
            after.append(order.before(f"L[{one}]", f"P[{one}]", xt, "t"))
        numbers = [f"not(isnan({xt}))"] if order.floats else []
        kept_in = [*after, *numbers]
        body = f"where({_all(kept_in)}, {xt}, {fill_read})" if kept_in else xt
        value = ctx.kernel(node, f"Y[{one}] {extreme}= {body}", {**ins, **({"F": fill} if fill and kept_in else {})},
                           ctx.fresh(f"{node.output[0]}:value{p}"), kept, extents=ext, dtype=x.dtype, kind="reduce")
        hit = f"eq({xt}, V[{one}])"
        pick_ins = {**ins, "V": value}
        if order.floats:
            # NaN is taken first when largest (while one is left), last when least (once no number is left)
            probe = f"isnan({xt})" if order.largest else f"not(isnan({xt}))"
            flag = ctx.kernel(node, f"Y[{one}] max= where({_all([*after, probe])}, 1, 0)", ins,
                              ctx.fresh(f"{node.output[0]}:nan{p}"), kept, extents=ext, dtype="int64",
                              kind="reduce")
            take_nan = f"gt(N[{one}], 0)" if order.largest else f"eq(N[{one}], 0)"
            hit = f"where({take_nan}, isnan({xt}), {hit})"
            pick_ins["N"] = flag
        picks.append(ctx.kernel(node, f"Y[{one}] min= where({_all([*after, hit])}, t, {n})", pick_ins,
                                ctx.fresh(f"{node.output[0]}:pick{p}"), kept, extents=ext, dtype="int64",
                                kind="arg"))
    shape = [k if d == axis else s for d, s in enumerate(x.shape)]
    pieces = [Piece(pick, (0,) * rank, tuple(p if d == axis else 0 for d in range(rank)), tuple(kept))
              for p, pick in enumerate(picks)]
    return ctx.copy(node, pieces, target, shape)


def _all(terms: list[str]) -> str:
    """The conjunction of one or more bool expressions."""
    text = terms[0]
    for t in terms[1:]:
        text = f"and({text}, {t})"
    return text
