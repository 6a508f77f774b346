"""Typed bodies in C: integer and bool values (``roller.ir.types``), with the semantics the reference evaluates
(``roller.ir.typed_eval``).

Each node is printed in its compute type's C type. Integer ``+``, ``-``, ``*`` and negation compute in the
unsigned type of the same width and convert back, so that overflow wraps instead of being undefined; a
division by zero gives 0 and ``MIN / -1`` gives ``MIN`` (C would trap on both, and PoCL's kernels run in the
process); a float converts to an integer through a saturating helper (NaN to 0), to bool as "not zero". A
bool value is an ``int`` 0 or 1 while computing and one byte when stored. Reads of integer and bool tensors
load the element as it is (``TensorPlan.raw``); float tensors convert to float32 as in float bodies (float64
ones compute in float64, ``double``).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from roller.backends.c_family.plan.cexpr import c_float
from roller.backends.c_family.plan.types import Dialect
from roller.dtypes import dtype as dtype_of
from roller.errors import InputError
from roller.ir.expr import CAST_FUNCS, COMPARE_FUNCS, AxisValue, BinOp, Call, Const, Expr, Gather, Neg, Read
from roller.ir.tensor_expr import TensorExpr
from roller.ir.types import FLOAT_COMPUTE, WEAK_FLOAT, WEAK_INT, BodyTypes, compute_dtype, meet, resolve

_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
# (signed bounds as C expressions, the float at or past which a conversion saturates) per integer type
# (lowest, highest, the float at and beyond which a conversion gives the highest, the float at and below which
# it gives the lowest): int8's are 127 and -128, not symmetric (-127.0 converted is -127)
_LIMITS = {"int64": ("(-9223372036854775807 - 1)", "9223372036854775807", "9.2233720368547758e18f",
                     "-9.2233720368547758e18f"),
           "int32": ("(-2147483647 - 1)", "2147483647", "2147483648.0f", "-2147483648.0f"),
           "int8": ("(-128)", "127", "127.0f", "-128.0f"), "uint8": ("0", "255", "255.0f", "0.0f")}


@dataclass
class TypedC:
    """Prints a typed op's body, reduction and store for one dialect; collects the helpers they call."""

    expr: TensorExpr
    d: Dialect
    read: Callable[[Read], str]
    axis: Callable[[str], str]  # an axis's value as an integer C expression
    # a gathered read, given its index as a C expression already inside the dimension
    gather: Callable[[Gather, str], str] | None = None

    def __post_init__(self) -> None:
        self.types = BodyTypes({t.name: t.dtype for t in self.expr.tensors})
        self.helpers: dict[str, str] = {}
        if not math.isfinite(self.expr.pad_value) and _pads_integers(self.expr):
            raise InputError(f"{self.expr.name}: an integer tensor read through a window padded with "
                             f"{self.expr.pad_value} (integers have no infinity)", field="pad_value")

    # -- types -----------------------------------------------------------------------------------------------
    def ctype(self, t: str) -> str:
        """The C type a value of compute type ``t`` is held in while computing (bool: int 0 or 1)."""
        return "int" if t == "bool" else self.d.ctype[t]

    def utype(self, t: str) -> str:
        return self.d.unsigned[t]

    def convert(self, x: str, src: str, dst: str) -> str:
        if src == dst:
            return x
        if dst == "bool":
            return f"((int)(({x}) != 0))"
        if dst in FLOAT_COMPUTE:
            return f"(({self.ctype(dst)})({x}))"
        if src in FLOAT_COMPUTE:
            return f"{self._f2i(src, dst)}({x})"
        return f"(({self.ctype(dst)})({x}))"

    # -- the body --------------------------------------------------------------------------------------------
    def body(self) -> str:
        """The body in the accumulator's type."""
        return self.render(self.expr.body, self.expr.acc_dtype)

    def render(self, e: Expr, want: str) -> str:
        own = self.types.of(e)
        t = resolve(own, want) if own in (WEAK_INT, WEAK_FLOAT) else own
        return self.convert(self._node(e, t), t, want)

    def _node(self, e: Expr, t: str) -> str:
        if isinstance(e, Const):
            if t in FLOAT_COMPUTE:
                return c_float(e.value, self.d)
            return f"(({self.ctype(t)}){int(e.value)})"
        if isinstance(e, AxisValue):
            return f"(({self.ctype(t)})({self.axis(e.axis)}))"
        if isinstance(e, (Read, Gather)):
            name = e.tensor if isinstance(e, Read) else e.source.tensor
            src = compute_dtype(self.types.tensors[name])
            x = self.read(e) if isinstance(e, Read) else self._gathered(e)
            if src == "bool":   # one byte: any value not zero is true
                x = f"((int)(({x}) != 0))"
            return self.convert(x, src, t)
        if isinstance(e, Neg):
            x = self.render(e.x, t)
            return f"(-{x})" if t in FLOAT_COMPUTE else f"(({self.ctype(t)})(0 - ({self.utype(t)})({x})))"
        if isinstance(e, BinOp):
            a, b = self.render(e.lhs, t), self.render(e.rhs, t)
            if t in FLOAT_COMPUTE:
                return f"({a} {e.op} {b})"
            if e.op == "/":
                return f"{self._div(t)}({a}, {b})"
            u = self.utype(t)
            return f"(({self.ctype(t)})(({u})({a}) {e.op} ({u})({b})))"
        if isinstance(e, Call):
            return self._call(e, t)
        raise TypeError(e)

    def _call(self, e: Call, t: str) -> str:
        fn, args = e.fn, e.args
        if fn in COMPARE_FUNCS:
            at = resolve(meet(self.types.of(args[0]), self.types.of(args[1])), "float32")
            return f"((int)({self.render(args[0], at)} {_COMPARE[fn]} {self.render(args[1], at)}))"
        if fn in ("and", "or", "xor"):
            a, b = self.render(args[0], "bool"), self.render(args[1], "bool")
            op = {"and": "&&", "or": "||", "xor": "!="}[fn]
            return f"((int)({a} {op} {b}))"
        if fn == "not":
            return f"((int)!{self.render(args[0], 'bool')})"
        if fn in ("isnan", "isinf"):
            at = resolve(self.types.of(args[0]), "float32")
            return f"((int)({fn}({self.render(args[0], at)}) ? 1 : 0))"
        if fn in CAST_FUNCS:
            inner = resolve(self.types.of(args[0]), fn)
            return self.convert(self.render(args[0], inner), inner, fn)
        if fn == "where":
            c = self.render(args[0], "bool")
            return f"({c} ? {self.render(args[1], t)} : {self.render(args[2], t)})"
        if t in FLOAT_COMPUTE:
            vals = [self.render(a, t) for a in args]
            return self.d.funcs[fn].format(*vals, zero=c_float(0.0, self.d), one=c_float(1.0, self.d), v="")
        vals = [self.render(a, t) for a in args]
        ct, u = self.ctype(t), self.utype(t)
        if fn == "max":
            return f"({vals[0]} > {vals[1]} ? {vals[0]} : {vals[1]})"
        if fn == "min":
            return f"({vals[0]} < {vals[1]} ? {vals[0]} : {vals[1]})"
        if fn == "relu":
            return f"({vals[0]} < 0 ? (({ct})0) : {vals[0]})"
        if fn == "abs":
            return f"({vals[0]} < 0 ? (({ct})(0 - ({u})({vals[0]}))) : {vals[0]})"
        raise TypeError(fn)

    # -- reduction and store ---------------------------------------------------------------------------------
    def acc_init(self) -> str:
        t, op = self.expr.acc_dtype, self.expr.reduce_op
        if t in FLOAT_COMPUTE:
            return {"max": f"(-{self.d.infinity})", "min": self.d.infinity}.get(op or "", c_float(0.0, self.d))
        if op is None:
            return f"(({self.ctype(t)})0)"
        low, high, _, _ = _LIMITS[t]
        return f"(({self.ctype(t)}){ {'max': low, 'min': high}.get(op or '', '0') })"

    def combine(self) -> str:
        """The statement folding ``{val}`` into ``{acc}`` (a template for str.format)."""
        t, op = self.expr.acc_dtype, self.expr.reduce_op
        if op is None:
            return "{acc} = {val};"
        if t in FLOAT_COMPUTE:
            return "{acc} += {val};" if op == "sum" else "{acc} = " + self.d.funcs[op].format(
                "{acc}", "{val}", zero="", one="", v="") + ";"
        ct = self.ctype(t)
        if op == "sum":
            u = self.utype(t)
            return f"{{acc}} = ({ct})(({u}){{acc}} + ({u})({{val}}));"
        cmp = ">" if op == "max" else "<"
        return f"{{{{ const {ct} rl_v = {{val}}; if (rl_v {cmp} {{acc}}) {{acc}} = rl_v; }}}}"

    def store(self, ctype: str, x: str) -> str:
        """The accumulator's value ``x`` as the output's storage type ``ctype``."""
        out = self.expr.output.dtype
        value = self.convert(x, self.expr.acc_dtype, compute_dtype(out))
        if out == "bool":
            return f"(({ctype})(({value}) != 0))"
        if dtype_of(out).integral:
            return f"(({ctype})({value}))"
        return self.d.store(ctype, value)

    def pad(self) -> str:
        """The pad value of a staged tile's points outside its tensor, as a plain C literal."""
        return c_float(self.expr.pad_value, self.d)

    # -- helpers ---------------------------------------------------------------------------------------------
    def _f2i(self, src: str, t: str) -> str:
        name = f"rl_{'f' if src == 'float32' else 'd'}2{t}"
        if name not in self.helpers:
            low, high, edge, bottom = _LIMITS[t]   # float32 literals: every bound is exact in both types
            ct = self.d.ctype[t]
            self.helpers[name] = (f"{self.d.helper_qual} {ct} {name}({self.ctype(src)} x) {{ return x != x ? ({ct})0 : "
                                  f"x >= {edge} ? ({ct}){high} : x <= {bottom} ? ({ct}){low} : ({ct})x; }}")
        return name

    def _gathered(self, g: Gather) -> str:
        if self.gather is None:
            raise InputError(f"{self.expr.name}: this kernel form has no reads through a run-time index",
                             field="expr")
        n = self.expr.tensor(g.source.tensor).storage_shape[g.dim]
        name = "rl_index"
        if name not in self.helpers:
            lt = self.d.ctype["int64"]
            # ONNX's negative indices count from the end once; what is still outside is clamped (documented)
            self.helpers[name] = (f"{self.d.helper_qual} {lt} {name}({lt} x, {lt} n) {{ x = x < 0 ? x + n : x; "
                                  "return x < 0 ? 0 : x >= n ? n - 1 : x; }")
        return self.gather(g, f"{name}({self.render(g.index, 'int64')}, {n})")

    def _div(self, t: str) -> str:
        name = f"rl_div_{t}"
        if name not in self.helpers:
            ct, u = self.d.ctype[t], self.d.unsigned[t]
            # b == -1 negates (wrapping MIN to MIN); integer promotion makes the narrow types' quotients exact.
            minus_one = "" if t == "uint8" else f"b == ({ct})-1 ? ({ct})(0 - ({u})a) : "
            self.helpers[name] = (f"{self.d.helper_qual} {ct} {name}({ct} a, {ct} b) {{ return b == 0 ? ({ct})0 : "
                                  f"{minus_one}({ct})(a / b); }}")
        return name

    def helper_code(self) -> str:
        """The helpers the printed code calls, guarded so that kernels in one compile unit define them once."""
        lines = []
        for name, code in sorted(self.helpers.items()):
            guard = f"ROLLER_{name.upper()}"
            lines += [f"#ifndef {guard}", f"#define {guard}", code, "#endif"]
        return "\n".join(lines)


def _pads_integers(expr: TensorExpr) -> bool:
    """Whether a read of an integer or bool tensor may leave it (and so give the pad value)."""
    ext = expr.extents
    for r in expr.input_reads():
        t = expr.tensor(r.tensor)
        if not dtype_of(t.dtype).integral:
            continue
        shape = tuple(t.storage_shape)
        if len(r.index) != len(shape):   # read through packed axes: as one flat dimension, or unknown
            shape = (math.prod(shape),) if len(r.index) == 1 else ()
        if t.view is not None or len(shape) != len(r.index) or any(
                lo < 0 or hi >= n for (lo, hi), n in zip((i.span(ext) for i in r.index), shape)):
            return True
    return False
