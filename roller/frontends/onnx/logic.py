"""ONNX ops that compute with bool and integer values: comparisons, logic, Where, IsNaN/IsInf and Mod, each one
elementwise operator with broadcasting (``roller.frontends.onnx.elementwise``) whose body uses the typed
functions of ``roller.ir.types`` (a comparison gives bool, ``where`` selects, integer arithmetic wraps)."""
from __future__ import annotations

import onnx

from roller.frontends.onnx.context import FLOAT_TYPES, Context, translates
from roller.frontends.onnx.elementwise import Operand, elementwise

COMPARISONS = {"Equal": "eq", "Less": "lt", "Greater": "gt", "LessOrEqual": "le", "GreaterOrEqual": "ge"}
LOGIC = {"And": "and", "Or": "or", "Xor": "xor"}


@translates(*COMPARISONS)
def compare(ctx: Context, node: onnx.NodeProto) -> None:
    fn = COMPARISONS[node.op_type]
    elementwise(ctx, node, lambda x: f"{fn}({x[0]}, {x[1]})", dtype="bool")


@translates(*LOGIC)
def logic(ctx: Context, node: onnx.NodeProto) -> None:
    fn = LOGIC[node.op_type]
    elementwise(ctx, node, lambda x: f"{fn}({x[0]}, {x[1]})", dtype="bool")


@translates("Not")
def negation(ctx: Context, node: onnx.NodeProto) -> None:
    elementwise(ctx, node, lambda x: f"not({x[0]})", dtype="bool")


@translates("Where")
def where(ctx: Context, node: onnx.NodeProto) -> None:
    """X where the condition holds, else Y; the output has X's type (ONNX requires Y's to be the same)."""
    elementwise(ctx, node, lambda x: f"where({x[0]}, {x[1]}, {x[2]})", dtype=ctx.element_type(node.input[1]))


@translates("IsNaN")
def isnan(ctx: Context, node: onnx.NodeProto) -> None:
    elementwise(ctx, node, lambda x: f"isnan({x[0]})", dtype="bool")


@translates("IsInf")
def isinf(ctx: Context, node: onnx.NodeProto) -> None:
    negative = bool(ctx.attr(node, "detect_negative", 1))
    positive = bool(ctx.attr(node, "detect_positive", 1))

    def body(x: list[Operand]) -> str:
        if negative and positive:
            return f"isinf({x[0]})"
        if not (negative or positive):
            return f"and(isinf({x[0]}), bool(0))"
        return f"and(isinf({x[0]}), {'gt' if positive else 'lt'}({x[0]}, 0.0))"
    elementwise(ctx, node, body, dtype="bool")


@translates("Mod")
def mod(ctx: Context, node: onnx.NodeProto) -> None:
    """Integer remainders: with ``fmod=1`` of truncating division (the dividend's sign, as C's ``%``), with
    ``fmod=0`` of flooring division (the divisor's sign, as Python's ``%``). A remainder by zero is the dividend
    (the division by zero is 0, ``roller.ir.types``). Floating-point remainders are C's fmod (exact; NaN for a
    zero divisor) and, with ``fmod=0``, that moved by the divisor where the signs differ, and a zero with the
    divisor's sign (numpy's ``mod``, step for step: bit-equal to it)."""
    kinds = {ctx.element_type(name) for name in node.input}
    floor = not int(ctx.attr(node, "fmod", 0))
    if kinds & set(FLOAT_TYPES):
        def real(x: list[Operand]) -> str:
            r = f"fmod({x[0]}, {x[1]})"
            if not floor:
                return r
            return (f"where(ne({r}, 0.0), where(xor(lt({r}, 0.0), lt({x[1]}, 0.0)), ({r}) + ({x[1]}), {r}), "
                    f"where(lt({x[1]}, 0.0), -0.0, 0.0))")
        elementwise(ctx, node, real)
        return

    def body(x: list[Operand]) -> str:
        a, b = x
        r = f"({a}) - ({b}) * (({a}) / ({b}))"
        if not floor:
            return r
        # the truncated remainder, moved by the divisor where it is not zero and the signs differ
        return f"where(and(ne({r}, 0), xor(lt({r}, 0), lt({b}, 0))), ({r}) + ({b}), {r})"
    elementwise(ctx, node, body)
