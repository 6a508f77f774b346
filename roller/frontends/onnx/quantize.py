"""Quantized inference: ONNX's linear quantization ops and its integer operators.

QuantizeLinear (``saturate(round(x / scale) + zero_point)``, halves to even) and DequantizeLinear
(``(x - zero_point) * scale``) are elementwise kernels, per tensor or per axis; with constant inputs they fold
at import, so a QDQ model's int8 weights reach a float operator dequantized.

QLinearConv, QLinearMatMul, ConvInteger and MatMulInteger compute their integer sums with float32 kernels
over the integer values less their zero points: every product and every partial sum is an integer, exact in
float32 while it stays under 2**24 in magnitude, so the sums are onnxruntime's int32 sums there (an int8 layer's
sums stay orders of magnitude below, though a worst case of 255 x 127 x 576 products could pass it). The QLinear
forms then requantize as onnxruntime does (``MlasRequantizeOutput``: ``round(float32(acc + bias) *
multiplier) + y_zero_point``, saturated, the multiplier ``x_scale * w_scale / y_scale`` in float32), in a kernel
that fusion joins to the product. Integer-typed kernels would hold the weights as int8; they render today as
scalar code with 64-bit sums (about 50x slower than the float32 kernel for a 3x3 convolution of 64 channels
on PoCL), so the float32 form is the one built.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from roller.frontends.onnx.context import Context, fmt, folds, translates
from roller.frontends.onnx.elementwise import axes, elementwise, shape_of
from roller.frontends.onnx.nn import conv_kernels, matmul_kernel
from roller.graph.ir import Value

#: the element types a quantized tensor may have here (int16, the 4-bit and the float8 types are refused)
QUANTIZED = ("int8", "uint8")


@dataclass(frozen=True)
class Rounded:
    """A quantized value ``saturate(round(F) + zero)`` as made: ``F`` a float body over ``reads`` (local tensor
    name -> value) indexed by ``axes(rank)``. ``float32(q) - z`` is then ``clamp(round(F), low - zero, high -
    zero) + (zero - z)``: a float kernel of the values the integers came from (a convolution's sums), which
    fusion joins to their producer, where the integers' own kernel (typed: never an epilogue) could not be."""
    body: str
    reads: Mapping[str, str]
    zero: int
    dtype: str

    def shifted(self, z: int) -> str:
        """The float body of ``float32(q) - z``."""
        info = np.iinfo(self.dtype)
        value = f"max(min(round({self.body}), {fmt(info.max - self.zero)}), {fmt(info.min - self.zero)})"
        return value if z == self.zero else f"({value}) + {fmt(self.zero - z)}"


def _reread(ctx: Context, node: onnx.NodeProto, name: str, z: int, scale: float, out: str) -> str | None:
    """``(float32(name) - z) * scale`` as a float kernel of what ``name`` was rounded from, into ``out``; None
    where ``name`` is no ``Rounded`` value."""
    made = ctx.rounded.get(name)
    if made is None:
        return None
    body = made.shifted(z)
    if scale != 1.0:
        body = f"({body}) * {fmt(scale)}"
    idx = ",".join(axes(len(ctx.value(name).shape)))
    return ctx.kernel(node, f"Y[{idx}] = {body}", made.reads, out, ctx.value(name).shape, dtype="float32",
                      kind="dequantize")


def _axis(ctx: Context, node: onnx.NodeProto, rank: int) -> int:
    """The node's axis, where its scale is per axis (one value ignores it, as onnxruntime does)."""
    scale = ctx.const(node.input[1])
    if rank == 0 or scale is None or scale.size == 1:
        return 0
    axis = int(ctx.attr(node, "axis", 1))
    if not -rank <= axis < rank:
        raise ctx.error(node, f"axis {axis} out of range for rank {rank}")
    return axis % rank


def _aligned(ctx: Context, node: onnx.NodeProto, i: int, shape: Sequence[int], axis: int, what: str,
             as_float: bool = False) -> str:
    """Input ``i`` (a scale or a zero point) named so that it broadcasts against ``shape``: a computed scalar
    as it is, a constant of one value or of ``shape[axis]`` values (1-D) reshaped along ``axis``."""
    name = node.input[i]
    c = ctx.const(name)
    if c is None:
        if int(np.prod(shape_of(ctx, name))) == 1:
            return name
        c = ctx.const_input(node, i, f"a per-axis {what}")
    view = _along(ctx, node, c, shape, axis, what)
    if as_float:
        view = view.astype(np.float32)
    new = ctx.fresh(f"{name}:{what.replace(' ', '_')}")
    ctx.fold(new, view)
    return new


def _along(ctx: Context, node: onnx.NodeProto, c: np.ndarray, shape: Sequence[int], axis: int, what: str
           ) -> np.ndarray:
    """``c`` (a scale or a zero point: one value, or one per element of ``axis``) shaped to broadcast against
    ``shape``."""
    if c.size == 1:
        return c.reshape([1] * len(shape))
    if c.ndim != 1 or len(shape) == 0 or c.size != shape[axis]:
        raise ctx.error(node, f"{what} of shape {list(c.shape)} is neither one value nor one per element of "
                              f"axis {axis} of {list(shape)}")
    return c.reshape([c.size if d == axis else 1 for d in range(len(shape))])


def _quantized_type(ctx: Context, node: onnx.NodeProto, zp: int, attr: str | None = None) -> str:
    """The element type of a quantized output: its zero point's, else ``attr``'s, else uint8 (ONNX's
    default)."""
    if ctx.has(node, zp):
        t = ctx.dtype_name(node.input[zp])
    elif attr is not None and int(ctx.attr(node, attr, 0)):
        t = onnx.helper.tensor_dtype_to_np_dtype(int(ctx.attr(node, attr))).name
    else:
        t = "uint8"
    if t not in QUANTIZED:
        raise ctx.error(node, f"quantization to {t} is not supported ({', '.join(QUANTIZED)} are)")
    return t


def _no_blocks(ctx: Context, node: onnx.NodeProto) -> None:
    if int(ctx.attr(node, "block_size", 0)):
        raise ctx.error(node, "blocked quantization (block_size) is not supported (per tensor or per axis is)")


def _linear_kernel(ctx: Context, node: onnx.NodeProto, body: Callable[[list[str]], str], dtype: str) -> list[int]:
    """The node's elementwise kernel of x, its scale and its zero point (``body`` of their operands; the zero
    point's only where the node has one), the two broadcast along the node's axis; returns x's shape."""
    shape = shape_of(ctx, node.input[0])
    axis = _axis(ctx, node, len(shape))
    given = [node.input[0], _aligned(ctx, node, 1, shape, axis, "scale")]
    if ctx.has(node, 2):
        given.append(_aligned(ctx, node, 2, shape, axis, "zero point", as_float=True))
    elementwise(ctx, onnx.helper.make_node(node.op_type, given, list(node.output), name=node.name), body,
                dtype=dtype)
    return shape


def _one_value_params(ctx: Context, node: onnx.NodeProto) -> tuple[float, float] | None:
    """(scale, zero point) where both are constants of one finite value (no zero point: 0), else None."""
    values = []
    for i in (1, 2):
        c = ctx.const(node.input[i]) if ctx.has(node, i) else np.zeros(1)
        if c is None or c.size != 1 or not np.isfinite(c.astype(np.float64)).all():
            return None
        values.append(float(c.reshape(-1)[0]))
    return values[0], values[1]


@translates("QuantizeLinear")
def quantize_linear(ctx: Context, node: onnx.NodeProto) -> None:
    """The cast to the quantized type saturates (``roller.ir.types``), after rounding half to even."""
    _no_blocks(ctx, node)
    out_t = _quantized_type(ctx, node, 2, "output_dtype")
    if ctx.element_type(node.input[0]) not in ("float32", "float16", "bfloat16"):
        raise ctx.error(node, f"the input is {ctx.element_type(node.input[0])}; a float type is quantized")
    shape = _linear_kernel(ctx, node, lambda v: f"{out_t}(round(({v[0]}) / ({v[1]}))"
                                                + (f" + float32({v[2]}))" if len(v) > 2 else ")"), out_t)
    params = _one_value_params(ctx, node)
    if params is not None and shape and node.input[0] in ctx.graph.values:
        idx = ",".join(axes(len(shape)))
        ctx.rounded[node.output[0]] = Rounded(f"X[{idx}] / {fmt(params[0])}", {"X": node.input[0]},
                                              int(params[1]), out_t)


@translates("DequantizeLinear")
def dequantize_linear(ctx: Context, node: onnx.NodeProto) -> None:
    """In the scale's type (float16 for a float16 scale, else float32); of a value rounded here, from what it
    was rounded from (``Rounded``)."""
    _no_blocks(ctx, node)
    params = _one_value_params(ctx, node)
    if params is not None and ctx.dtype_name(node.input[1]) == "float32" and \
            _reread(ctx, node, node.input[0], int(params[1]), params[0], node.output[0]) is not None:
        return
    src = ctx.dtype_name(node.input[0])
    if src not in (*QUANTIZED, "int32"):
        raise ctx.error(node, f"dequantization of {src} is not supported ({', '.join(QUANTIZED)} and int32 are)")
    out_t = "float16" if ctx.dtype_name(node.input[1]) == "float16" else "float32"
    _linear_kernel(ctx, node, lambda v: f"(float32({v[0]})" + (f" - float32({v[2]})" if len(v) > 2 else "")
                                        + f") * ({v[1]})", out_t)


def _constant_params(ctx: Context, node: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, scale, zero point as int32) of an all-constant QuantizeLinear or DequantizeLinear, the scale and
    zero point shaped to broadcast against x along the node's axis."""
    _no_blocks(ctx, node)
    x = np.asarray(ctx.const(node.input[0]))
    axis = _axis(ctx, node, x.ndim)
    scale = _along(ctx, node, np.asarray(ctx.const(node.input[1])), x.shape, axis, "scale")
    zero = np.asarray(ctx.const(node.input[2])) if ctx.has(node, 2) else np.zeros((), np.int32)
    return x, scale, _along(ctx, node, zero, x.shape, axis, "zero point").astype(np.int32)


@folds("DequantizeLinear")
def fold_dequantize(ctx: Context, node: onnx.NodeProto) -> None:
    """A constant dequantized at import (a QDQ model's weights and biases), in float32 as onnxruntime computes
    it: ``float32(x - zero_point) * scale``."""
    x, scale, zero = _constant_params(ctx, node)
    if x.dtype.name not in (*QUANTIZED, "int32"):
        raise ctx.error(node, f"dequantization of {x.dtype} is not supported ({', '.join(QUANTIZED)} and int32 are)")
    out_t = np.float16 if scale.dtype == np.float16 else np.float32
    values = (x.astype(np.int64) - zero).astype(np.float32) * scale.astype(np.float32)
    ctx.fold(node.output[0], values.astype(out_t))


@folds("QuantizeLinear")
def fold_quantize(ctx: Context, node: onnx.NodeProto) -> None:
    """A constant quantized at import: ``saturate(round(x / scale) + zero_point)``, in float32."""
    out_t = _quantized_type(ctx, node, 2, "output_dtype")
    x, scale, zero = _constant_params(ctx, node)
    info = np.iinfo(out_t)
    with np.errstate(all="ignore"):
        q = np.rint(x.astype(np.float32) / scale.astype(np.float32)) + zero.astype(np.float32)
    ctx.fold(node.output[0], np.clip(np.nan_to_num(q, nan=0.0), info.min, info.max).astype(out_t))


# -- integer operators -------------------------------------------------------------------------------------------

def _zero_point(ctx: Context, node: onnx.NodeProto, i: int, what: str, like: str, per: int | None = None,
                axis: int = 0, rank: int = 0) -> np.ndarray | str:
    """A zero point as int32, shaped to broadcast against a tensor of ``rank`` dims: one value, or (``per``
    given) one per element of ``axis``; or the name of a computed one-value zero point (DynamicQuantizeLinear's).
    It must have the type of the value it belongs to (``like``)."""
    if not ctx.has(node, i):
        return np.zeros([1] * rank, np.int32)
    c = ctx.const(node.input[i])
    if c is None:
        v = ctx.device_value(node, i)
        size = int(np.prod(v.shape))
        if v.dtype != like or not (size == 1 or (per is not None and list(v.shape) == [per])):
            raise ctx.error(node, f"{what} is a computed {v.dtype} tensor of shape {list(v.shape)}; it must be "
                                  f"{like}, one value" + (f" or {per}" if per else ""))
        return v.name
    if c.dtype.name != like:
        raise ctx.error(node, f"{what} is {c.dtype}; it must have the type of its tensor ({like})")
    if c.size == 1:
        return c.astype(np.int32).reshape([1] * rank)
    if per is None or c.ndim != 1 or c.size != per:
        raise ctx.error(node, f"{what} of shape {list(c.shape)} is neither one value"
                              + (f" nor {per} values" if per else ""))
    return c.astype(np.int32).reshape([per if d == axis else 1 for d in range(rank)])


def _quantized(ctx: Context, node: onnx.NodeProto, i: int, what: str) -> str:
    t = ctx.element_type(node.input[i])
    if t not in QUANTIZED:
        raise ctx.error(node, f"{what} is {t}; {', '.join(QUANTIZED)} are supported")
    return t


def _shifted(ctx: Context, node: onnx.NodeProto, i: int, zero: np.ndarray | str, axis: int = 0
             ) -> tuple[Value, np.ndarray | None]:
    """Input ``i`` less its zero point (one value, or one per element of ``axis``), as float32 (exact:
    integers of 9 bits at most), and its value where it is a constant (folded here; a computed one is an
    elementwise kernel)."""
    c = ctx.const(node.input[i])
    if c is not None and not isinstance(zero, str):
        values = (c.astype(np.int32) - zero).astype(np.float32)
        return ctx.value(ctx.add_const(values, f"{node.input[i]}:shifted")), values
    if not isinstance(zero, str) and zero.size == 1:
        out = _reread(ctx, node, node.input[i], int(zero.reshape(-1)[0]), 1.0, ctx.fresh(f"{node.input[i]}:shifted"))
        if out is not None:
            return ctx.value(out), None
    v = ctx.device_value(node, i)
    names = axes(len(v.shape))
    idx = ",".join(names)
    reads = {"X": v.name}
    if isinstance(zero, str):
        one = int(np.prod(ctx.value(zero).shape)) == 1
        reads["Z"] = ctx.view(node, zero, ctx.fresh(zero + ":1"), [1]) if one else zero
        body = f"float32(X[{idx}]) - float32(Z[{'0' if one else names[axis]}])"
    elif zero.size != 1:
        reads["Z"] = ctx.add_const(zero.reshape(-1).astype(np.float32), f"{node.input[i]}:zero_point")
        body = f"float32(X[{idx}]) - Z[{names[axis]}]"
    else:
        z = int(zero.reshape(-1)[0])
        body = f"float32(X[{idx}]) - {fmt(z)}" if z else f"float32(X[{idx}])"
    out = ctx.kernel(node, f"Y[{idx}] = {body}", reads, ctx.fresh(f"{node.input[i]}:shifted"), v.shape,
                     dtype="float32", kind="dequantize")
    return ctx.value(out), None


def _integer_conv(ctx: Context, node: onnx.NodeProto, xi: int, wi: int, xz: int, wz: int, out: str) -> list[int]:
    """The sums of the convolution of inputs ``xi`` by ``wi`` less their zero points (``xz``, ``wz``) into
    ``out``, as float32; returns its shape."""
    x_t = _quantized(ctx, node, xi, "the input")
    w_t = _quantized(ctx, node, wi, "the weight")
    x_shape, w_shape = shape_of(ctx, node.input[xi]), shape_of(ctx, node.input[wi])
    if len(x_shape) < 3 or len(w_shape) != len(x_shape):
        raise ctx.error(node, f"expected input [N, C, spatial...] and weight of the same rank, got {x_shape} and "
                              f"{w_shape}")
    zx = _zero_point(ctx, node, xz, "the input's zero point", x_t, rank=len(x_shape))
    zw = _zero_point(ctx, node, wz, "the weight's zero point", w_t, per=w_shape[0], rank=len(w_shape))
    x, _ = _shifted(ctx, node, xi, zx)
    w, w_const = _shifted(ctx, node, wi, zw)
    return conv_kernels(ctx, node, x, w, w_const, out)


def _integer_matmul(ctx: Context, node: onnx.NodeProto, ai: int, bi: int, az: int, bz: int, out: str
                    ) -> list[int]:
    a_t = _quantized(ctx, node, ai, "A")
    b_t = _quantized(ctx, node, bi, "B")
    a_shape, b_shape = shape_of(ctx, node.input[ai]), shape_of(ctx, node.input[bi])
    if not a_shape or not b_shape:
        raise ctx.error(node, "a matrix product of a scalar is not defined")
    za = _zero_point(ctx, node, az, "A's zero point", a_t, rank=len(a_shape))
    zb = _zero_point(ctx, node, bz, "B's zero point", b_t, per=b_shape[-1], axis=len(b_shape) - 1,
                     rank=len(b_shape))
    a, _ = _shifted(ctx, node, ai, za)
    b, _ = _shifted(ctx, node, bi, zb, axis=len(b_shape) - 1)
    return matmul_kernel(ctx, node, a, b, out)


def _to_int32(ctx: Context, node: onnx.NodeProto, acc: str, shape: list[int]) -> None:
    idx = ",".join(axes(len(shape)))
    ctx.kernel(node, f"Y[{idx}] = int32(A[{idx}])", {"A": acc}, node.output[0], shape, dtype="int32",
               kind="cast")


@translates("ConvInteger")
def conv_integer(ctx: Context, node: onnx.NodeProto) -> None:
    acc = ctx.fresh(node.output[0] + ":sum")
    _to_int32(ctx, node, acc, _integer_conv(ctx, node, 0, 1, 2, 3, acc))


@translates("MatMulInteger")
def matmul_integer(ctx: Context, node: onnx.NodeProto) -> None:
    acc = ctx.fresh(node.output[0] + ":sum")
    _to_int32(ctx, node, acc, _integer_matmul(ctx, node, 0, 1, 2, 3, acc))


def _scale(ctx: Context, node: onnx.NodeProto, i: int, what: str, per: int | None = None) -> np.ndarray:
    c = ctx.const_input(node, i, what).astype(np.float32)
    if c.size != 1 and (per is None or c.ndim != 1 or c.size != per):
        raise ctx.error(node, f"{what} of shape {list(c.shape)} is neither one value"
                              + (f" nor {per} values" if per else ""))
    if not np.all(np.isfinite(c)) or np.any(c <= 0):
        raise ctx.error(node, f"{what} must be positive and finite")
    return c.reshape(-1)


def _requantize(ctx: Context, node: onnx.NodeProto, acc: str, shape: list[int], axis: int,
                multiplier: np.ndarray, bias: str | None, zero: int, out_t: str) -> None:
    names = axes(len(shape))
    reads = {"A": acc}
    total = f"A[{','.join(names)}]"
    if bias is not None:
        reads["B"] = bias
        total = f"({total} + B[{names[axis]}])"
    if multiplier.size == 1:
        scaled = f"({total}) * {fmt(float(multiplier[0]))}"
    else:
        reads["M"] = ctx.add_const(multiplier, f"{node.name or node.op_type}:multiplier")
        scaled = f"({total}) * M[{names[axis]}]"
    zp = f" + {fmt(zero)}" if zero else ""
    ctx.kernel(node, f"Y[{','.join(names)}] = {out_t}(round({scaled}){zp})", reads, node.output[0], shape,
               dtype=out_t, kind="requantize")
    ctx.rounded[node.output[0]] = Rounded(scaled, dict(reads), zero, out_t)


def _qlinear(ctx: Context, node: onnx.NodeProto, channels: int) -> tuple[np.ndarray, str, int]:
    """(multiplier, output type, output zero point) of a QLinear node: the multiplier as onnxruntime computes
    it, ``(x_scale * w_scale) / y_scale`` in float32."""
    xs = _scale(ctx, node, 1, "the input's scale")
    ws = _scale(ctx, node, 4, "the weight's scale", per=channels)
    ys = _scale(ctx, node, 6, "the output's scale")
    out_t = _quantized_type(ctx, node, 7)
    ctx.const_input(node, 7, "the output's zero point")
    zero = _zero_point(ctx, node, 7, "the output's zero point", out_t)
    assert not isinstance(zero, str)   # a constant, as just asked
    zy = int(zero.reshape(-1)[0])
    with np.errstate(over="ignore"):
        multiplier = (xs[0] * ws) / ys[0]
    if not np.all(np.isfinite(multiplier)) or np.any(multiplier == 0):
        raise ctx.error(node, "the scales' multiplier x_scale * w_scale / y_scale is not a positive float32 number")
    return multiplier, out_t, zy


def _int32_bias(ctx: Context, node: onnx.NodeProto, channels: int) -> str | None:
    """Input 8, the int32 bias added to the sums before requantization (QLinearConv's own; a QLinearMatMul
    that ``qdq.qdq_to_qlinear`` made of a Gemm has one too), as float32 values on the device; None without."""
    if not ctx.has(node, 8):
        return None
    b = ctx.const(node.input[8])
    if b is None or b.dtype != np.int32 or list(b.shape) != [channels]:
        raise ctx.error(node, f"the bias must be a constant int32 tensor of shape [{channels}]")
    return ctx.add_const(b.astype(np.float32), f"{node.input[8]}:float")


@translates("QLinearConv")
def qlinear_conv(ctx: Context, node: onnx.NodeProto) -> None:
    w_shape = shape_of(ctx, node.input[3])
    f = w_shape[0] if w_shape else 0
    multiplier, out_t, zy = _qlinear(ctx, node, f)
    bias = _int32_bias(ctx, node, f)
    acc = ctx.fresh(node.output[0] + ":sum")
    shape = _integer_conv(ctx, node, 0, 3, 2, 5, acc)
    _requantize(ctx, node, acc, shape, 1, multiplier, bias, zy, out_t)


@translates("QLinearMatMul")
def qlinear_matmul(ctx: Context, node: onnx.NodeProto) -> None:
    b_shape = shape_of(ctx, node.input[3])
    n = b_shape[-1] if b_shape else 0
    multiplier, out_t, zy = _qlinear(ctx, node, n)
    bias = _int32_bias(ctx, node, n)
    acc = ctx.fresh(node.output[0] + ":sum")
    shape = _integer_matmul(ctx, node, 0, 3, 2, 5, acc)
    _requantize(ctx, node, acc, shape, len(shape) - 1, multiplier, bias, zy, out_t)


@translates("DynamicQuantizeLinear")
def dynamic_quantize_linear(ctx: Context, node: onnx.NodeProto) -> None:
    """ONNX's own definition of it (the op's function body: ReduceMin/ReduceMax, the scale and zero point
    computed on the device, QuantizeLinear), translated node by node."""
    from roller.frontends.onnx.context import TRANSLATORS

    body = onnx.defs.get_schema(node.op_type, ctx.opset).function_body
    names = dict(zip(body.input, node.input))
    names.update((o, n) for o, n in zip(body.output, node.output) if n)
    for inner in body.node:
        step = onnx.NodeProto()
        step.CopyFrom(inner)
        step.name = f"{node.name or node.op_type}/{inner.output[0]}"
        for values in (step.input, step.output):
            for j, v in enumerate(values):
                if v:
                    values[j] = names.setdefault(v, ctx.fresh(f"{node.output[0]}:{v}"))
        if step.op_type == "Constant":
            ctx.fold(step.output[0], onnx.numpy_helper.to_array(step.attribute[0].t))
        else:
            TRANSLATORS[step.op_type](ctx, step)
