"""Element types in a body: what each node computes in, and what a body may mix.

A floating-point value computes in float32 (float16 and bfloat16 tensors are read into it, as the kernels
always did), a float64 one in float64, which a float32 value meets in; an integer one in its own type,
wrapping on overflow (ONNX and numpy); a bool one as 0 or 1. Literals and axis values are weak: they take the
type of what they meet (``ids[i] + 1`` is int64 where ids is), a literal with a fraction makes an integer
float32 (``ids[i] * 0.5``), and a body of weak values alone takes the output's type. Two integer types meet in
the wider (a signed and an unsigned of one width in the next signed width up, int32 for two bytes).
Comparisons give bool; ``and``/``or``/``xor``/``not`` take bool (any other value counts as true where it is
not zero); ``where(c, a, b)`` gives the type ``a`` and ``b`` meet in; ``isnan``/``isinf`` test a float; a
type's name converts (float to integer truncating toward zero and saturating, NaN to 0; integer to a narrower
one wrapping; anything to bool as "not zero"). The float functions (exp, log, ...) compute in float32 whatever
their argument, float64 where one is float64. Bool takes no part in arithmetic.

Float bodies are untouched by all this (``typed`` is False): they compute in float32 as before (in float64
where one of the op's tensors is float64: ``roller.ir.build``), and only typed bodies need a backend that
renders them (``roller.backends.Backend.typed_bodies``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from roller.dtypes import dtype as dtype_of
from roller.ir.expr import (
    CAST_FUNCS,
    COMPARE_FUNCS,
    LOGIC_FUNCS,
    TEST_FUNCS,
    TYPED_FUNCS,
    UNARY_FUNCS,
    AxisValue,
    BinOp,
    Call,
    Const,
    Expr,
    Gather,
    Neg,
    Read,
    walk,
)

#: the integer types a body computes in, narrowest first (int16 has no table entry: two bytes meet in int32)
INT_ORDER = ("int8", "uint8", "int32", "int64")
#: weak types: a literal without a fraction or an axis value (integral), a literal with one (fractional)
WEAK_INT, WEAK_FLOAT = "~int", "~float"


class TypeProblem(Exception):
    """A body that mixes types it may not: the message, and the node's column where it has one."""

    def __init__(self, message: str, pos: int = -1) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos


#: the types floating-point values compute in, narrower first
FLOAT_COMPUTE = ("float32", "float64")


def compute_dtype(name: str) -> str:
    """What a value of element type ``name`` computes in: float64 for float64, float32 for every other
    floating-point type."""
    if dtype_of(name).integral:
        return name
    return "float64" if name == "float64" else "float32"


def is_float(t: str) -> bool:
    return t in (*FLOAT_COMPUTE, WEAK_FLOAT)


def meet(a: str, b: str) -> str:
    """The type two operands of arithmetic meet in (weak types give way)."""
    if a == b:
        return a
    if a.startswith("~") and b.startswith("~"):
        return WEAK_FLOAT if WEAK_FLOAT in (a, b) else WEAK_INT
    for x, y in ((a, b), (b, a)):
        if x == WEAK_INT:
            return y
        if x == WEAK_FLOAT:
            return y if y in FLOAT_COMPUTE else "float32"
    for f in reversed(FLOAT_COMPUTE):
        if f in (a, b):
            return f
    if "bool" in (a, b):
        return b if a == "bool" else a
    ka, kb = dtype_of(a), dtype_of(b)
    if ka.kind != kb.kind and ka.itemsize == kb.itemsize:   # int8 and uint8
        return "int32"
    return a if INT_ORDER.index(a) > INT_ORDER.index(b) else b


def resolve(t: str, default: str) -> str:
    """A weak type made concrete: a body of weak values alone computes in ``default`` (the output's type)."""
    if t == WEAK_INT:
        return default
    if t == WEAK_FLOAT:
        return "float32" if dtype_of(default).integral else default
    return t


@dataclass
class BodyTypes:
    """The type of every node of a body, from its tensors' element types (``tensors``: name -> dtype)."""

    tensors: Mapping[str, str]

    def of(self, e: Expr) -> str:
        if isinstance(e, Const):
            return WEAK_INT if float(e.value).is_integer() else WEAK_FLOAT
        if isinstance(e, AxisValue):
            return WEAK_INT
        if isinstance(e, Read):
            return compute_dtype(self.tensors[e.tensor])
        if isinstance(e, Neg):
            t = self.of(e.x)
            if t == "bool":
                raise TypeProblem("a bool value cannot be negated (use not())", _pos(e.x))
            return t
        if isinstance(e, BinOp):
            a, b = self.of(e.lhs), self.of(e.rhs)
            for side, t in ((e.lhs, a), (e.rhs, b)):
                if t == "bool":
                    raise TypeProblem(f"a bool value takes no part in '{e.op}' (convert it: int32(...))", _pos(side))
            return meet(a, b)
        if isinstance(e, Call):
            return self._call(e)
        if isinstance(e, Gather):
            t = self.of(e.index)
            if t == "bool" or not dtype_of(resolve(t, "int64")).integral:
                raise TypeProblem(f"the run-time index of {e.source.tensor} must be an integer, got "
                                  f"{resolve(t, 'float32')}", _pos(e.index))
            return compute_dtype(self.tensors[e.source.tensor])
        raise TypeError(e)

    def _call(self, e: Call) -> str:
        args = [self.of(a) for a in e.args]
        fn = e.fn
        if fn in COMPARE_FUNCS or fn in LOGIC_FUNCS:
            if fn in COMPARE_FUNCS and "bool" in args and any(t != "bool" for t in args):
                raise TypeProblem(f"{fn}() compares a bool with a number (convert one: bool(...) or int32(...))",
                                  e.pos)
            return "bool"
        if fn in TEST_FUNCS:
            if args[0] == "bool" or dtype_of(resolve(args[0], "float32")).integral:
                raise TypeProblem(f"{fn}() tests a floating-point value, got {resolve(args[0], 'float32')}", e.pos)
            return "bool"
        if fn in CAST_FUNCS:
            return fn
        if fn == "where":
            _, a, b = args   # any condition: not zero is true
            if a == "bool" or b == "bool":
                if a != b:
                    raise TypeProblem("where() selects between a bool and a number (convert one)", e.pos)
                return "bool"
            return meet(a, b)
        if "bool" in args:
            raise TypeProblem(f"{fn}() takes numbers, not bool (convert it: int32(...) or float32(...))", e.pos)
        if (fn in UNARY_FUNCS and fn not in ("relu", "abs")) or fn in ("pow", "fmod"):
            return "float64" if "float64" in args else "float32"
        return meet(args[0], args[1]) if len(args) == 2 else args[0]

    def body(self, e: Expr, output: str) -> str:
        """What the body as a whole computes in (weak values alone: the output's type)."""
        return resolve(self.of(e), compute_dtype(output))


def _pos(e: Expr) -> int:
    return getattr(e, "pos", -1)


def typed_body(e: Expr, tensors: Mapping[str, str]) -> bool:
    """Whether a body needs typed rendering: it reads an integer or bool tensor, or calls a typed function. A
    name ``tensors`` does not hold (a row kernel's per-row values) is float."""
    return any((isinstance(n, Read) and dtype_of(tensors.get(n.tensor, "float32")).integral)
               or (isinstance(n, Call) and n.fn in TYPED_FUNCS) for n in walk(e))
