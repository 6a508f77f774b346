"""Attention (opsets 23-25): scaled dot-product attention as a few Roller operators.

Q K^T (one batched product, grouped-query heads by a view), softcap, the attention bias added, a softmax that
gives fully masked rows zeros (as ONNX defines), then the product with V. The bias is one constant tensor where
it is known at import (a bool or constant mask, causal and sliding-window masks, the padding of
``nonpad_kv_seqlen``), plus the model's float mask where it computes one.
"""
from __future__ import annotations

import math

import numpy as np
import onnx

from roller.frontends.onnx.context import Context, fmt, translates
from roller.frontends.onnx.elementwise import read
from roller.frontends.onnx.nn import FLT_MAX
from roller.frontends.onnx.normalize import FLT_MIN
from roller.frontends.onnx.tensor import pad_kernel, permute
from roller.graph.ir import Piece

#: the lowest finite value of each float type (the row maximum's floor, stored in the scores' type)
LOWEST = {"float32": -FLT_MAX, "float16": -65504.0, "bfloat16": -3.3895313892515355e38}

#: what ``qk_matmul_output`` holds per ``qk_matmul_output_mode``
QK_MODES = {0: "qk", 1: "qk", 2: "biased", 3: "softmax"}


def _heads(ctx: Context, node: onnx.NodeProto, i: int, heads: int | None, what: str) -> tuple[str, list[int]]:
    """Input ``i`` as [batch, heads, sequence, head size]: a 3-d input [batch, sequence, heads * size] is split
    into heads and transposed (an operator)."""
    v = ctx.device_value(node, i)
    if len(v.shape) == 4:
        return v.name, list(v.shape)
    b, s, hidden = v.shape
    if not heads or hidden % heads:
        raise ctx.error(node, f"{what}: a 3-d input of hidden size {hidden} needs a number of heads that divides it "
                              f"(q_num_heads / kv_num_heads), got {heads}")
    split = ctx.view(node, v.name, ctx.fresh(v.name + ":heads"), [b, s, heads, hidden // heads])
    out = permute(ctx, node, split, [b, s, heads, hidden // heads], [0, 2, 1, 3], ctx.fresh(v.name + ":bhsd"))
    return out, [b, heads, s, hidden // heads]


def _concat_seq(ctx: Context, node: onnx.NodeProto, past: str, new: str, out: str) -> str:
    """past and new concatenated along the sequence axis (2): a device copy."""
    p, n = ctx.value(past).shape, ctx.value(new).shape
    if len(p) != 4 or p[:2] != n[:2] or p[3] != n[3]:
        raise ctx.error(node, f"past {list(p)} does not extend {list(n)} along the sequence axis")
    shape = [p[0], p[1], p[2] + n[2], p[3]]
    return ctx.copy(node, [Piece(past, (0, 0, 0, 0), (0, 0, 0, 0), tuple(p)),
                           Piece(new, (0, 0, 0, 0), (0, 0, p[2], 0), tuple(n))], out, shape)


def _constant_bias(ctx: Context, node: onnx.NodeProto, batch: int, sq: int, skv: int, past: int,
                   mask: np.ndarray | None) -> np.ndarray:
    """The additive bias known at import, [b, h, sq, skv] with b and h 1 or full: a constant mask (bool: False
    is -inf), the causal and sliding-window masks aligned to the end of the cache, and the padding of
    ``nonpad_kv_seqlen``; 0 where attended, -inf where not."""
    bias = np.zeros((1, 1, sq, skv), np.float32)
    if mask is not None:
        m = np.where(mask, 0.0, -np.inf).astype(np.float32) if mask.dtype == np.bool_ else mask.astype(np.float32)
        if m.shape[-1] < skv:   # a mask for fewer keys than the cache holds: the rest is masked
            m = np.concatenate([m, np.full((*m.shape[:-1], skv - m.shape[-1]), -np.inf, np.float32)], axis=-1)
        m = m.reshape((1,) * (4 - m.ndim) + m.shape)
        try:
            bias = bias + m
        except ValueError:
            raise ctx.error(node, f"attn_mask of shape {list(mask.shape)} does not broadcast to "
                                  f"[batch, heads, {sq}, {skv}]") from None
    nonpad = ctx.const_input(node, 6, "nonpad_kv_seqlen").reshape(-1).astype(np.int64) if ctx.has(node, 6) else None
    if nonpad is not None and nonpad.size != batch:
        raise ctx.error(node, f"nonpad_kv_seqlen has {nonpad.size} entries for a batch of {batch}")
    # where the queries sit in the keys: after the past, or (an external cache) before the padding
    offset = (nonpad - sq).reshape(-1, 1, 1, 1) if nonpad is not None else np.full((1, 1, 1, 1), past)
    i = np.arange(sq).reshape(1, 1, sq, 1)
    j = np.arange(skv).reshape(1, 1, 1, skv)
    allowed = np.ones((offset.shape[0], 1, sq, skv), bool)
    if int(ctx.attr(node, "is_causal", 0)):
        allowed &= j <= i + offset
    left, right = int(ctx.attr(node, "left_window_size", -1)), int(ctx.attr(node, "right_window_size", -1))
    if left < -1 or right < -1:
        raise ctx.error(node, "left_window_size and right_window_size must be -1 or non-negative")
    if left >= 0:
        allowed &= (i + offset) - j <= left
    if right >= 0:
        allowed &= j - (i + offset) <= right
    if nonpad is not None:
        allowed &= j < nonpad.reshape(-1, 1, 1, 1)
    return (bias + np.where(allowed, 0.0, -np.inf).astype(np.float32)).astype(np.float32)


def _bias_read(ctx: Context, node: onnx.NodeProto, value: str, shape: list[int], heads: tuple[int, int],
               full: list[int], tensor: str) -> tuple[str, str]:
    """(value viewed for the grouped scores [b, kv heads, group, sq, skv], its read there)."""
    b, h, sq, skv = shape
    hk, group = heads
    five = [b, hk, group, sq, skv] if h != 1 else [b, 1, 1, sq, skv]
    v = ctx.view(node, value, ctx.fresh(value + ":5d"), five)
    return v, read(tensor, five, full)


@translates("Attention")
def attention(ctx: Context, node: onnx.NodeProto) -> None:
    q0 = ctx.device_value(node, 0)
    rank = len(q0.shape)
    if rank not in (3, 4) or any(len(ctx.device_value(node, i).shape) != rank for i in (1, 2)):
        raise ctx.error(node, "Q, K and V must all be 3-d or all 4-d")
    q_heads, kv_heads = ctx.attr(node, "q_num_heads", None), ctx.attr(node, "kv_num_heads", None)
    if rank == 4 and ctx.opset >= 25 and (q_heads is not None or kv_heads is not None):
        raise ctx.error(node, "q_num_heads and kv_num_heads are not allowed with 4-d inputs")
    q, (batch, h, sq, d) = _heads(ctx, node, 0, q_heads, "Q")
    k, (bk, hk, sk, dk) = _heads(ctx, node, 1, kv_heads, "K")
    v, (bv, hv, sv, dv) = _heads(ctx, node, 2, kv_heads, "V")
    if (bk, bv) != (batch, batch) or hv != hk or sv != sk or dk != d or h % hk:
        raise ctx.error(node, f"Q [{batch}, {h}, {sq}, {d}], K [{bk}, {hk}, {sk}, {dk}] and V [{bv}, {hv}, {sv}, "
                              f"{dv}] do not fit (equal batches, K and V heads dividing Q's, equal head sizes)")
    precision = ctx.attr(node, "softmax_precision", None)
    if precision is not None and int(precision) not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
        raise ctx.error(node, f"softmax_precision {onnx.TensorProto.DataType.Name(int(precision))} is not supported "
                              "(FLOAT; DOUBLE is computed in float32)")
    mode = int(ctx.attr(node, "qk_matmul_output_mode", 0))
    if mode not in QK_MODES:
        raise ctx.error(node, f"qk_matmul_output_mode={mode} is not supported (0 to 3)")
    past = 0
    if ctx.has(node, 4) != ctx.has(node, 5):
        raise ctx.error(node, "past_key and past_value come together")
    if ctx.has(node, 4):
        if ctx.has(node, 6):
            raise ctx.error(node, "nonpad_kv_seqlen cannot be combined with past_key and past_value")
        past = ctx.value(ctx.device_value(node, 4).name).shape[2]
    outs = list(node.output) + [""] * (4 - len(node.output))
    for i, (cur, what) in ((4, (k, "key")), (5, (v, "value"))):
        if ctx.has(node, i):
            name = outs[i - 3] or ctx.fresh(f"{node.output[0]}:present_{what}")
            cur = _concat_seq(ctx, node, ctx.device_value(node, i).name, cur, name)
        elif outs[i - 3]:
            cur = ctx.view(node, cur, outs[i - 3], ctx.value(cur).shape)
        if what == "key":
            k = cur
        else:
            v = cur
    skv = ctx.value(k).shape[2]
    group = h // hk
    scale = ctx.attr(node, "scale", None)
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    softcap = float(ctx.attr(node, "softcap", 0.0))

    # scores [b, kv heads, group, sq, skv]: the query heads of one key head side by side
    sshape = [batch, hk, group, sq, skv]
    qv = ctx.view(node, q, ctx.fresh(q + ":grouped"), [batch, hk, group, sq, d])
    out0 = node.output[0]
    scores = ctx.kernel(node, f"Y[b,g,r,i,j] += Q[b,g,r,i,c] * K[b,g,j,c] * {fmt(scale)}", {"Q": qv, "K": k},
                        ctx.fresh(out0 + ":qk"), sshape, kind="batch_matmul")
    if softcap > 0:
        scores = ctx.kernel(node, f"Y[b,g,r,i,j] = {fmt(softcap)} * tanh(S[b,g,r,i,j] * {fmt(1.0 / softcap)})",
                            {"S": scores}, ctx.fresh(out0 + ":softcap"), sshape, kind="softcap")
    qk = scores

    # the bias: what is known at import, and the model's computed float mask
    mask_const = ctx.const(node.input[3]) if ctx.has(node, 3) else None
    bias = _constant_bias(ctx, node, batch, sq, skv, past, mask_const)
    terms, ins = [], {"S": scores}
    if (bias != 0).any():
        shape = [bias.shape[0], bias.shape[1], sq, skv]
        if shape[1] not in (1, h) or shape[0] not in (1, batch):
            raise ctx.error(node, f"attn_mask {list(mask_const.shape)} does not broadcast to "  # type: ignore[union-attr]
                                  f"[{batch}, {h}, {sq}, {skv}]")
        c = ctx.add_const(bias, ctx.fresh(out0 + ":bias"))
        ins["C"], term = _bias_read(ctx, node, c, shape, (hk, group), sshape, "C")
        terms.append(term)
    if ctx.has(node, 3) and mask_const is None:
        m = ctx.device_value(node, 3)
        mshape = [1] * (4 - len(m.shape)) + list(m.shape)
        if len(m.shape) > 4 or mshape[0] not in (1, batch) or mshape[1] not in (1, h) or mshape[2] not in (1, sq) \
                or mshape[3] > skv:
            raise ctx.error(node, f"attn_mask {list(m.shape)} does not broadcast to [{batch}, {h}, {sq}, {skv}]")
        mname = ctx.view(node, m.name, ctx.fresh(m.name + ":4d"), mshape)
        flag = m.dtype == "bool"   # True attends, False is -inf
        if mshape[3] < skv:   # fewer keys than the cache holds: the others are masked
            full = [*mshape[:3], skv]
            mname = pad_kernel(ctx, node, mname, mshape, [0, 0, 0, 0], full, 0.0 if flag else float("-inf"),
                               ctx.fresh(m.name + ":padded"))
            mshape = full
        ins["M"], term = _bias_read(ctx, node, mname, mshape, (hk, group), sshape, "M")
        terms.append(f"where({term}, 0.0, -inf)" if flag else term)
    if terms:
        scores = ctx.kernel(node, f"Y[i0,i1,i2,i3,i4] = S[i0,i1,i2,i3,i4] + {' + '.join(terms)}", ins,
                            ctx.fresh(out0 + ":biased"), sshape, kind="attention_bias")

    # softmax over the keys; a row masked everywhere (its maximum -inf) gives zeros: the maximum is taken no
    # lower than the lowest finite value (so exp gives 0, not NaN) and the sum no lower than FLT_MIN (0 / FLT_MIN
    # = 0); any other row has a maximum above it and a sum of at least 1, which neither bound changes
    rows = [batch, hk, group, sq]
    lowest = LOWEST[ctx.value(scores).dtype]   # stored in the scores' type, where it must stay finite
    mx = ctx.kernel(node, f"Y[b,g,r,i] max= max(S[b,g,r,i,j], {fmt(lowest)})", {"S": scores},
                    ctx.fresh(out0 + ":max"), rows, kind="reduce")
    e = ctx.kernel(node, "Y[b,g,r,i,j] = exp(S[b,g,r,i,j] - M[b,g,r,i])", {"S": scores, "M": mx},
                   ctx.fresh(out0 + ":exp"), sshape, kind="softmax_exp")
    z = ctx.kernel(node, "Y[b,g,r,i] += E[b,g,r,i,j]", {"E": e}, ctx.fresh(out0 + ":sum"), rows, kind="reduce")
    p = ctx.kernel(node, f"Y[b,g,r,i,j] = E[b,g,r,i,j] / max(Z[b,g,r,i], {fmt(FLT_MIN)})", {"E": e, "Z": z},
                   ctx.fresh(out0 + ":softmax"), sshape, kind="softmax_div")

    if rank == 4:
        y = ctx.kernel(node, "Y[b,g,r,i,e] += P[b,g,r,i,j] * V[b,g,j,e]", {"P": p, "V": v},
                       ctx.fresh(out0 + ":5d"), [batch, hk, group, sq, dv], kind="batch_matmul")
        ctx.view(node, y, out0, [batch, h, sq, dv])
    else:   # written straight in [batch, sequence, heads, size] order
        y = ctx.kernel(node, "Y[b,i,g,r,e] += P[b,g,r,i,j] * V[b,g,j,e]", {"P": p, "V": v},
                       ctx.fresh(out0 + ":5d"), [batch, sq, hk, group, dv], kind="batch_matmul")
        ctx.view(node, y, out0, [batch, sq, h * dv])
    if outs[3]:
        which = {"qk": qk, "biased": scores, "softmax": p}[QK_MODES[mode]]
        ctx.view(node, which, outs[3], [batch, h, sq, skv])
