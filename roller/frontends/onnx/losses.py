"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss with targets known at import.

Roller reads no index tensors, so the targets must be constants (the ONNX backend folds an integer input in):
each element's log-probability x[n, target, d...] and its class weight are then picked by device copies, one
element each, and an ignored element copies a zero instead. The loss is -picked * weight, summed or averaged
over the weights, as ONNX defines it: exact, whatever the values (no one-hot product, which would turn an
infinite log-probability into NaN).
"""
from __future__ import annotations

import itertools

import numpy as np
import onnx

from roller.frontends.onnx.context import Context, fmt, translates
from roller.frontends.onnx.elementwise import axes
from roller.graph.ir import Piece

REDUCTIONS = ("none", "sum", "mean")


def _pick(ctx: Context, node: onnx.NodeProto, src: str, rank: int, target: np.ndarray, ignored: np.ndarray,
          out: str, per_class: bool) -> str:
    """[N, 1, d...] with element (n, d) = src[n, target, d] (``per_class``: src is [C], read at target), or 0
    where ``ignored``: one copy per element."""
    zero = ctx.add_const(np.zeros((1,) * rank, np.float32), ctx.fresh(out + ":zero"))
    if per_class:
        src = ctx.view(node, src, ctx.fresh(src + ":c"), [1, ctx.value(src).shape[0], *[1] * (rank - 2)])
    pieces = []
    for idx in itertools.product(*[range(s) for s in target.shape]):
        n, rest = idx[0], tuple(idx[1:])
        dst = (n, 0, *rest)
        if ignored[idx]:
            pieces.append(Piece(zero, (0,) * rank, dst, (1,) * rank))
        else:
            t = int(target[idx])
            start = (0, t, *[0] * len(rest)) if per_class else (n, t, *rest)
            pieces.append(Piece(src, start, dst, (1,) * rank))
    return ctx.copy(node, pieces, out, [target.shape[0], 1, *target.shape[1:]])


def nll(ctx: Context, node: onnx.NodeProto, x: str, out: str) -> None:
    """The loss of log-probabilities ``x`` [N, C, d...] for the node's targets (input 1), weights (input 2) and
    attributes, written to ``out``."""
    shape = list(ctx.value(x).shape)
    rank = len(shape)
    if rank < 2:
        raise ctx.error(node, f"expected scores [N, C, d...], got {shape}")
    target = ctx.const_input(node, 1, "target").astype(np.int64)
    if list(target.shape) != [shape[0], *shape[2:]]:
        raise ctx.error(node, f"target {list(target.shape)} does not fit scores {shape}")
    reduction = ctx.text(node, "reduction", "mean")
    if reduction not in REDUCTIONS:
        raise ctx.error(node, f"reduction={reduction!r} is not supported ({', '.join(REDUCTIONS)})")
    ignore = ctx.attr(node, "ignore_index", None)
    ignored = target == int(ignore) if ignore is not None else np.zeros(target.shape, bool)
    if ((target[~ignored] < 0) | (target[~ignored] >= shape[1])).any():
        raise ctx.error(node, f"a target outside the {shape[1]} classes (and not ignore_index)")
    picked = _pick(ctx, node, x, rank, target, ignored, ctx.fresh(out + ":picked"), per_class=False)
    if ctx.has(node, 2):
        w = ctx.device_value(node, 2)
        if list(w.shape) != [shape[1]]:
            raise ctx.error(node, f"weight must have shape [{shape[1]}], got {list(w.shape)}")
        weights = _pick(ctx, node, w.name, rank, target, ignored, ctx.fresh(out + ":weights"), per_class=True)
    else:
        weights = ctx.add_const((~ignored).astype(np.float32).reshape(target.shape[0], 1, *target.shape[1:]),
                                ctx.fresh(out + ":weights"))
    names = axes(rank)
    full = ",".join(names)
    lshape = [target.shape[0], 1, *target.shape[1:]]
    loss_shape = list(target.shape)
    if reduction == "none":
        lv = ctx.kernel(node, f"Y[{full}] = -(P[{full}] * W[{full}])", {"P": picked, "W": weights},
                        ctx.fresh(out + ":loss"), lshape, kind="nll")
        ctx.view(node, lv, out, loss_shape)
        return
    pv = ctx.view(node, picked, ctx.fresh(picked + ":u"), [1, *lshape])
    wv = ctx.view(node, weights, ctx.fresh(weights + ":u"), [1, *lshape])
    total = ctx.kernel(node, f"Y[u] += -(P[u,{full}] * W[u,{full}])", {"P": pv, "W": wv},
                       ctx.fresh(out + ":sum"), [1], kind="reduce")
    if reduction == "mean":
        if ctx.has(node, 2):
            wsum = ctx.kernel(node, f"Y[u] += W[u,{full}]", {"W": wv}, ctx.fresh(out + ":wsum"), [1], kind="reduce")
            total = ctx.kernel(node, "Y[u] = S[u] / V[u]", {"S": total, "V": wsum}, ctx.fresh(out + ":mean"), [1],
                               kind="nll_mean")
        else:
            count = int((~ignored).sum())
            total = ctx.kernel(node, f"Y[u] = S[u] / {fmt(float(count))}", {"S": total}, ctx.fresh(out + ":mean"), [1], kind="nll_mean")
    ctx.view(node, total, out, [])


@translates("NegativeLogLikelihoodLoss")
def negative_log_likelihood(ctx: Context, node: onnx.NodeProto) -> None:
    nll(ctx, node, ctx.device_value(node, 0).name, node.output[0])


@translates("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(ctx: Context, node: onnx.NodeProto) -> None:
    """log_softmax over the classes (axis 1; optional second output), then the negative log-likelihood."""
    x = ctx.device_value(node, 0)
    shape = list(x.shape)
    if len(shape) < 2:
        raise ctx.error(node, f"expected scores [N, C, d...], got {shape}")
    names = axes(len(shape))
    full = ",".join(names)
    row = ",".join(n for d, n in enumerate(names) if d != 1)
    row_shape = [s for d, s in enumerate(shape) if d != 1]
    out = node.output[0]
    mx = ctx.kernel(node, f"Y[{row}] max= X[{full}]", {"X": x.name}, ctx.fresh(out + ":max"), row_shape,
                    kind="reduce")
    s = ctx.kernel(node, f"Y[{row}] += exp(X[{full}] - M[{row}])", {"X": x.name, "M": mx},
                   ctx.fresh(out + ":sumexp"), row_shape, kind="reduce")
    log_prob = node.output[1] if len(node.output) > 1 and node.output[1] else ctx.fresh(out + ":logprob")
    ctx.kernel(node, f"Y[{full}] = X[{full}] - M[{row}] - log(S[{row}])", {"X": x.name, "M": mx, "S": s},
               log_prob, shape, kind="logsoftmax")
    nll(ctx, node, log_prob, out)
