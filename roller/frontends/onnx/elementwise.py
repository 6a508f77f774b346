"""Elementwise ONNX ops with numpy broadcasting: one Roller operator each, whatever the chain."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx

from roller.frontends.onnx.context import DEVICE_TYPES, FLOAT_TYPES, Context, fmt, literal, real, translates

Operand = str   # an expression: a read like "A[i0,0,i2]" or a literal


def axes(rank: int) -> list[str]:
    return [f"i{d}" for d in range(rank)]


def broadcast_shape(ctx: Context, node: onnx.NodeProto, shapes: Sequence[Sequence[int]]) -> list[int]:
    try:
        return [int(d) for d in np.broadcast_shapes(*[tuple(s) for s in shapes])]
    except ValueError:
        raise ctx.error(node, f"inputs of shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast") \
            from None


def shape_of(ctx: Context, name: str) -> list[int]:
    """The shape of a value, computed or constant."""
    c = ctx.const(name)
    return list(c.shape) if c is not None else list(ctx.value(name).shape)


def read(tensor: str, shape: Sequence[int], out_shape: Sequence[int]) -> str:
    """``tensor`` indexed for an output of ``out_shape`` under numpy broadcasting (size-1 dims read at 0)."""
    names = axes(len(out_shape))
    lead = len(out_shape) - len(shape)
    idx = [names[lead + d] if shape[d] == out_shape[lead + d] else "0" for d in range(len(shape))]
    return f"{tensor}[{','.join(idx)}]"


def elementwise(ctx: Context, node: onnx.NodeProto, body: Callable[[list[Operand]], str],
                inputs: Sequence[int] | None = None, output: int = 0, dtype: str | None = None) -> str:
    """One operator computing ``body`` of the node's inputs (all of them, or those listed) elementwise with
    broadcasting; constant scalars are written into the expression, other inputs are read. The output has
    element type ``dtype``, by default that of the first input the model computes (``Context.kernel``)."""
    which = list(range(len(node.input))) if inputs is None else list(inputs)
    which = [i for i in which if ctx.has(node, i)]
    shapes = [shape_of(ctx, node.input[i]) for i in which]
    out_shape = broadcast_shape(ctx, node, shapes)
    if not out_shape:   # a scalar result: computed as one element, then viewed as rank 0
        tmp = ctx.fresh(node.output[output] + ":1")
        _emit(ctx, node, body, which, shapes, [1], tmp, dtype)
        return ctx.view(node, tmp, node.output[output], [])
    return _emit(ctx, node, body, which, shapes, out_shape, node.output[output], dtype)


def _emit(ctx: Context, node: onnx.NodeProto, body: Callable[[list[Operand]], str], which: list[int],
          shapes: list[list[int]], out_shape: list[int], out: str, dtype: str | None) -> str:
    operands: list[Operand] = []
    tensors: dict[str, str] = {}
    for k, (i, shape) in enumerate(zip(which, shapes)):
        name = node.input[i]
        c = ctx.const(name)
        lit = literal(c) if c is not None and c.size == 1 else None
        if lit is not None:
            operands.append(lit)
            continue
        v = ctx.device_value(node, i)
        if not shape:   # a computed scalar: read as the one element of a [1] view (kernels index every read)
            v = ctx.graph.values[ctx.view(node, v.name, ctx.fresh(v.name + ":1"), [1])]
            shape = [1]
        t = f"T{k}"
        tensors[t] = v.name
        operands.append(read(t, shape, out_shape))
    names = axes(len(out_shape))
    return ctx.kernel(node, f"Y[{','.join(names)}] = {body(operands)}", tensors, out, out_shape, dtype=dtype)


def _binary(op: str) -> Callable[[list[Operand]], str]:
    return lambda x: f"({x[0]}) {op} ({x[1]})"


@translates("Add", "Sub", "Mul", "Div")
def arithmetic(ctx: Context, node: onnx.NodeProto) -> None:
    elementwise(ctx, node, _binary({"Add": "+", "Sub": "-", "Mul": "*", "Div": "/"}[node.op_type]))


@translates("Sum", "Mean", "Max", "Min")
def variadic(ctx: Context, node: onnx.NodeProto) -> None:
    n = len([i for i in node.input if i])
    if node.op_type in ("Sum", "Mean"):
        total = lambda x: " + ".join(f"({a})" for a in x)
        body = total if node.op_type == "Sum" else (lambda x: f"({total(x)}) / {n}")
    else:
        fn = node.op_type.lower()

        def body(x: list[Operand]) -> str:
            acc = x[0]
            for a in x[1:]:
                acc = f"{fn}({acc}, {a})"
            return acc
    elementwise(ctx, node, body)


UNARY = {
    "Relu": lambda a: f"relu({a})",
    "Sigmoid": lambda a: f"sigmoid({a})",
    "Tanh": lambda a: f"tanh({a})",
    "Cos": lambda a: f"cos({a})",
    "Sin": lambda a: f"sin({a})",
    "Erf": lambda a: f"erf({a})",
    "Exp": lambda a: f"exp({a})",
    "Log": lambda a: f"log({a})",
    "Sqrt": lambda a: f"sqrt({a})",
    "Abs": lambda a: f"abs({a})",
    "Neg": lambda a: f"-({a})",
    "Reciprocal": lambda a: f"1.0 / ({a})",
    "Softsign": lambda a: f"({a}) / (1.0 + abs({a}))",
    # log(1 + e^x) without overflow: max(x, 0) + log(1 + e^-|x|)
    "Softplus": lambda a: f"relu({a}) + log(1.0 + exp(-abs({a})))",
    "Round": lambda a: f"round({a})",
    # x tanh(softplus(x)), the softplus as above
    "Mish": lambda a: f"({a}) * tanh(relu({a}) + log(1.0 + exp(-abs({a}))))",
}


@translates(*UNARY)
def unary(ctx: Context, node: onnx.NodeProto) -> None:
    fn = UNARY[node.op_type]
    elementwise(ctx, node, lambda x: fn(x[0]), inputs=[0])


@translates("Swish")
def swish(ctx: Context, node: onnx.NodeProto) -> None:
    alpha = float(ctx.attr(node, "alpha", 1.0))
    elementwise(ctx, node, lambda x: f"({x[0]}) * sigmoid({fmt(alpha)} * ({x[0]}))", inputs=[0])


@translates("SwiGLU")
def swiglu(ctx: Context, node: onnx.NodeProto) -> None:
    """Swish_alpha(A) * B, A and B of one shape (no broadcasting, as ONNX says)."""
    a, b = shape_of(ctx, node.input[0]), shape_of(ctx, node.input[1])
    if a != b:
        raise ctx.error(node, f"A {a} and B {b} must have the same shape")
    alpha = float(ctx.attr(node, "alpha", 1.0))
    elementwise(ctx, node, lambda x: f"({x[0]}) * sigmoid({fmt(alpha)} * ({x[0]})) * ({x[1]})")


@translates("PRelu")
def prelu(ctx: Context, node: onnx.NodeProto) -> None:
    """x for x >= 0, slope * x below, as max(x, 0) + slope * min(x, 0): one of the two terms is exactly 0.
    The slope broadcasts to x (unidirectionally: the output has x's shape)."""
    x, slope = shape_of(ctx, node.input[0]), shape_of(ctx, node.input[1])
    if broadcast_shape(ctx, node, [x, slope]) != x:
        raise ctx.error(node, f"slope {slope} does not broadcast to the input {x}")
    elementwise(ctx, node, lambda v: f"relu({v[0]}) + ({v[1]}) * min({v[0]}, 0.0)")


@translates("Clip")
def clip(ctx: Context, node: onnx.NodeProto) -> None:
    """min(max(x, lo), hi), in that order: where lo > hi every element is hi (ONNX and numpy agree). The bounds
    may be computed scalars; NaN elements follow fmax/fmin (the bound), not numpy (NaN)."""
    given = [i for i in (1, 2) if ctx.has(node, i)]
    for i in given:
        c = ctx.const(node.input[i])
        size = c.size if c is not None else ctx.value(node.input[i]).size
        if size != 1:
            raise ctx.error(node, f"input {i} ({'min' if i == 1 else 'max'}) must be a scalar, got {size} elements")

    def body(x: list[Operand]) -> str:
        e = x[0]
        for i, bound in zip(given, x[1:]):
            e = f"{'max' if i == 1 else 'min'}({e}, {bound})"
        return e
    elementwise(ctx, node, body, inputs=[0, *given])


@translates("LeakyRelu")
def leaky_relu(ctx: Context, node: onnx.NodeProto) -> None:
    alpha = float(ctx.attr(node, "alpha", 0.01))
    # x for x >= 0, alpha x below: the larger of the two when alpha <= 1, the smaller when alpha > 1
    fn = "max" if alpha <= 1 else "min"
    elementwise(ctx, node, lambda x: f"{fn}({x[0]}, {fmt(alpha)} * ({x[0]}))", inputs=[0])


@translates("Elu", "Selu", "Celu")
def elu(ctx: Context, node: onnx.NodeProto) -> None:
    alpha = float(ctx.attr(node, "alpha", {"Elu": 1.0, "Celu": 1.0, "Selu": 1.6732632423543772}[node.op_type]))
    gamma = float(ctx.attr(node, "gamma", 1.0507009873554805)) if node.op_type == "Selu" else 1.0
    scale = 1.0 / alpha if node.op_type == "Celu" else 1.0

    def body(x: list[Operand]) -> str:
        neg = f"{fmt(alpha)} * (exp({fmt(scale)} * min({x[0]}, 0.0)) - 1.0)"
        e = f"relu({x[0]}) + min({neg}, 0.0)"
        return e if gamma == 1.0 else f"{fmt(gamma)} * ({e})"
    elementwise(ctx, node, body, inputs=[0])


@translates("HardSigmoid", "HardSwish")
def hard_sigmoid(ctx: Context, node: onnx.NodeProto) -> None:
    alpha = float(ctx.attr(node, "alpha", 0.2 if node.op_type == "HardSigmoid" else 1 / 6))
    beta = float(ctx.attr(node, "beta", 0.5))

    def body(x: list[Operand]) -> str:
        hs = f"max(0.0, min(1.0, {fmt(alpha)} * ({x[0]}) + {fmt(beta)}))"
        return hs if node.op_type == "HardSigmoid" else f"({x[0]}) * {hs}"
    elementwise(ctx, node, body, inputs=[0])


@translates("Gelu")
def gelu(ctx: Context, node: onnx.NodeProto) -> None:
    approx = ctx.text(node, "approximate", "none")
    kind = ctx.element_type(node.input[0])
    if approx == "tanh":
        k = math.sqrt(2 / math.pi)
        body = lambda x: (f"0.5 * ({x[0]}) * (1.0 + tanh({real(k, kind)} * (({x[0]}) + "
                          f"0.044715 * ({x[0]}) * ({x[0]}) * ({x[0]}))))")
    elif approx == "none":
        body = lambda x: f"0.5 * ({x[0]}) * (1.0 + erf(({x[0]}) * {real(1 / math.sqrt(2), kind)}))"
    else:
        raise ctx.error(node, f"approximate={approx!r} is not supported (none, tanh)")
    elementwise(ctx, node, body, inputs=[0])


#: the largest integer exponent written as a product (beyond it a negative base would need a pow function)
MAX_PRODUCT_EXPONENT = 16


@translates("Pow")
def power(ctx: Context, node: onnx.NodeProto) -> None:
    """x^e: for a constant scalar e, products for integers (exact signs for negative bases), square roots for
    halves, exp(e log x) for the other non-integers (NaN for a negative base, as pow gives); any other exponent
    (per element, computed) by the pow function: in the base's type for a float base; for an integer base in
    float64, then converted to the base's type (as onnxruntime computes it: std::pow in double, then a cast)."""
    e = ctx.const(node.input[1])
    if e is None or e.size != 1:
        kinds = [ctx.element_type(node.input[i]) for i in (0, 1)]
        if kinds[0] in ("int64", "int32", "int8", "uint8"):
            # A device's double pow may miss an integer result by an ulp (OpenCL allows 16), which truncation
            # would turn into the integer below it: a result within 1e-12 of an integer is that integer.
            def exact(x: list[Operand]) -> str:
                p = f"pow(float64({x[0]}), float64({x[1]}))"
                return f"{kinds[0]}(where(le(abs({p} - round({p})), abs({p}) * 1e-12), round({p}), {p}))"
            elementwise(ctx, node, exact, dtype=kinds[0])
            return
        if kinds[0] not in FLOAT_TYPES:
            raise ctx.error(node, f"Pow of a {kinds[0]} base by an exponent per element is not supported (float, "
                                  "int64, int32, int8 and uint8 bases are)")
        if e is not None:   # constant exponents (of any type, uint32 too) as float32 values
            folded = ctx.fresh(node.input[1] + ":float")
            ctx.fold(folded, e.astype(np.float32))
            node = onnx.helper.make_node("Pow", [node.input[0], folded], list(node.output), name=node.name)
            kinds[1] = "float32"
        cast = "" if kinds[1] in FLOAT_TYPES else "float32"
        elementwise(ctx, node, lambda x: f"pow({x[0]}, {cast}({x[1]}))", dtype=kinds[0])
        return
    p = float(e.reshape(-1)[0])
    kind = ctx.element_type(node.input[0])
    if p.is_integer() and abs(p) > MAX_PRODUCT_EXPONENT:
        raise ctx.error(node, f"the integer exponent {p:g} is not supported (|e| <= {MAX_PRODUCT_EXPONENT})")

    def body(x: list[Operand]) -> str:
        a = x[0]
        if p == 0:
            return f"max(1.0, min(1.0, {a}))"   # exactly 1, for inf and NaN too
        if p.is_integer():
            prod = " * ".join([f"({a})"] * int(abs(p)))
            return prod if p > 0 else f"1.0 / ({prod})"
        if p == 0.5:
            return f"sqrt({a})"
        if p == -0.5:
            return f"rsqrt({a})"
        return f"exp({real(p, kind)} * log({a}))"
    elementwise(ctx, node, body, inputs=[0])


@translates("Identity", "Dropout")
def identity(ctx: Context, node: onnx.NodeProto) -> None:
    if len(node.output) > 1 and node.output[1]:
        raise ctx.error(node, "the mask output of Dropout is not supported (a bool tensor; inference needs none)")
    if node.op_type == "Dropout" and ctx.has(node, 2):
        training = ctx.const_input(node, 2, "training_mode")
        ratio = float(ctx.const_input(node, 1, "ratio").reshape(-1)[0]) if ctx.has(node, 1) else 0.5
        if bool(training.reshape(-1)[0]) and ratio != 0.0:
            raise ctx.error(node, f"training_mode=true with ratio {ratio} draws a random mask, which is not "
                                  "supported (inference, or ratio 0, is the identity)")
    src = ctx.device_value(node, 0)
    ctx.view(node, src.name, node.output[0], src.shape)


#: the numpy type of each device element type (bfloat16 is ml_dtypes', which onnx uses)
DEVICE_NUMPY = {name: onnx.helper.tensor_dtype_to_np_dtype(t) for t, name in DEVICE_TYPES.items()}


@translates("Cast", "CastLike")
def cast(ctx: Context, node: onnx.NodeProto) -> None:
    """A conversion between any two element types a kernel holds (``roller.ir.types``: float to integer
    truncates toward zero and saturates, integer to a narrower integer wraps, anything to bool is "not zero");
    the same type is a view. CastLike takes the type of its second input."""
    first = ctx.const(node.input[0])
    if node.op_type == "CastLike" and first is not None:
        # Only the type of the second input matters: a constant first input stays a constant (an exponent...).
        like = DEVICE_NUMPY.get(ctx.dtype_name(node.input[1]))
        if like is not None:
            ctx.fold(node.output[0], first.astype(like))
            return
    src = ctx.device_value(node, 0)
    if node.op_type == "Cast":
        to = int(ctx.attr(node, "to"))
        target = DEVICE_TYPES.get(to)
        what = onnx.TensorProto.DataType.Name(to)
    else:
        what = ctx.dtype_name(node.input[1])
        target = what if what in DEVICE_TYPES.values() else None
    if target is None:
        raise ctx.error(node, f"a cast of a computed tensor to {what} is not supported (kernels hold "
                              f"{', '.join(DEVICE_TYPES.values())})")
    if target == src.dtype:
        ctx.view(node, src.name, node.output[0], src.shape)
        return
    idx = ",".join(axes(len(src.shape)))
    # Between float types the store converts; a cast function converts to an integer or bool type exactly as
    # defined, and to float32 (then the store's rounding) from one.
    value = f"X[{idx}]"
    if target not in FLOAT_TYPES:
        value = f"{target}({value})"
    elif src.dtype not in FLOAT_TYPES:
        value = f"float32({value})"
    ctx.kernel(node, f"Y[{idx}] = {value}", {"X": src.name}, node.output[0], src.shape, dtype=target, kind="cast")
