"""Expression trees of a tensor expression's body, and affine index maps.

Index expressions are kept as ``Affine`` (integer coefficients per axis plus a constant) because every query the
construction engine makes (data-tile extents, strides, padding) is exact for them.
"""
from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field

# round: to the nearest integer, halves to even (ONNX Round, and what QuantizeLinear rounds with)
UNARY_FUNCS = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "relu", "abs", "cos", "sin", "round")
# pow: as C and numpy (NaN for a negative base and a non-integer exponent; pow(x, 0) is 1); fmod: the remainder
# of truncating division, with the dividend's sign (C's fmod, ONNX's float Mod; exact, NaN for a zero divisor)
BINARY_FUNCS = ("max", "min", "pow", "fmod")
# Functions of typed bodies (integer and bool element types, roller.ir.types): comparisons give bool, the logic
# takes bool, where(c, a, b) selects, isnan/isinf test floats, and a type's name converts to it (ONNX's Cast).
COMPARE_FUNCS = ("eq", "ne", "lt", "le", "gt", "ge")
LOGIC_FUNCS = ("and", "or", "xor", "not")
TEST_FUNCS = ("isnan", "isinf")
CAST_FUNCS = ("float64", "float32", "int64", "int32", "int8", "uint8", "bool")
TYPED_FUNCS = COMPARE_FUNCS + LOGIC_FUNCS + TEST_FUNCS + CAST_FUNCS + ("where",)
FUNCS = UNARY_FUNCS + BINARY_FUNCS + TYPED_FUNCS
#: how many arguments each function takes
ARITY = {**{f: 1 for f in UNARY_FUNCS + TEST_FUNCS + CAST_FUNCS + ("not",)},
         **{f: 2 for f in BINARY_FUNCS + COMPARE_FUNCS + ("and", "or", "xor")}, "where": 3}


@dataclass(frozen=True, eq=False)
class Affine:
    """sum(coef[a] * a) + const over axis names. Terms keep the order they were written in (for printing);
    equality and hashing ignore that order."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(coefs: Mapping[str, int], const: int = 0) -> Affine:
        return Affine(tuple((a, c) for a, c in coefs.items() if c != 0), const)

    def _key(self) -> tuple:
        return (tuple(sorted(self.terms)), self.const)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Affine) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @staticmethod
    def axis(name: str) -> Affine:
        return Affine(((name, 1),), 0)

    @property
    def coefs(self) -> dict[str, int]:
        return dict(self.terms)

    def axes(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.terms)

    def plain_axis(self) -> str | None:
        """The axis name when the index is that axis alone (coefficient 1, no constant)."""
        if self.const == 0 and len(self.terms) == 1 and self.terms[0][1] == 1:
            return self.terms[0][0]
        return None

    def span(self, tile: Mapping[str, int]) -> tuple[int, int]:
        """(lowest, highest) offset reached over a tile starting at 0 with the given extents."""
        lo = hi = self.const
        for a, c in self.terms:
            reach = c * (tile[a] - 1)
            lo += min(0, reach)
            hi += max(0, reach)
        return lo, hi

    def evaluate(self, values: Mapping[str, int]) -> int:
        return self.const + sum(c * values[a] for a, c in self.terms)

    def __add__(self, other: Affine) -> Affine:
        coefs = self.coefs
        for a, c in other.terms:
            coefs[a] = coefs.get(a, 0) + c
        return Affine.of(coefs, self.const + other.const)

    def scale(self, k: int) -> Affine:
        return Affine.of({a: c * k for a, c in self.terms}, self.const * k)

    def rename(self, mapping: Mapping[str, str]) -> Affine:
        return Affine.of({mapping.get(a, a): c for a, c in self.terms}, self.const)

    def __str__(self) -> str:
        parts: list[str] = []
        for a, c in self.terms:
            if c == 1:
                t = a
            elif c == -1:
                t = f"-{a}"
            else:
                t = f"{c}*{a}"
            if parts and not t.startswith("-"):
                parts.append("+" + t)
            else:
                parts.append(t)
        if self.const or not parts:
            parts.append(f"{self.const:+d}" if parts else str(self.const))
        return "".join(parts)


@dataclass(frozen=True)
class Const:
    value: float

    def __str__(self) -> str:
        if self.value == float("-inf"):
            return "(-inf)"
        text = repr(float(self.value))
        return text if not text.startswith("-") else f"({text})"


@dataclass(frozen=True)
class Read:
    tensor: str
    index: tuple[Affine, ...]
    pos: int = field(default=-1, compare=False)

    def __str__(self) -> str:
        return f"{self.tensor}[{','.join(str(i) for i in self.index)}]"


@dataclass(frozen=True)
class AxisValue:
    """The value of an axis at the point being computed (``h`` in ``X[h] / (h + 1)``), as a float: exact for
    values below 2^24."""

    axis: str
    pos: int = field(default=-1, compare=False)

    def __str__(self) -> str:
        return self.axis


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple[Expr, ...]
    pos: int = field(default=-1, compare=False)

    def __str__(self) -> str:
        return f"{self.fn}({', '.join(str(a) for a in self.args)})"


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * /
    lhs: Expr
    rhs: Expr

    def __str__(self) -> str:
        prec = _PREC[self.op]
        left = _wrap(self.lhs, prec, right=False)
        right = _wrap(self.rhs, prec, right=True)
        return f"{left} {self.op} {right}"


@dataclass(frozen=True)
class Neg:
    x: Expr

    def __str__(self) -> str:
        return f"-{_wrap(self.x, 3, right=True)}"


@dataclass(frozen=True)
class Gather:
    """A read through a run-time index: ``source`` with its index at ``dim`` taken from ``index`` (an integer
    value, usually a read of an index tensor: ``E[ids[i], d]``). ``source.index[dim]`` is a placeholder (the
    constant 0), so that every analysis of reads sees one element per point, as the kernel reads. The index
    wraps once when negative (ONNX's ``-1`` is the last) and is then clamped into the dimension: no index ever
    reads outside the tensor (``roller.ir.typed_eval.gather_index``)."""

    source: Read
    dim: int
    index: Expr

    def __str__(self) -> str:
        parts = [str(i) for i in self.source.index]
        parts[self.dim] = str(self.index)
        return f"{self.source.tensor}[{','.join(parts)}]"


Expr = Const | Read | Call | BinOp | Neg | AxisValue | Gather
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def _wrap(e: Expr, prec: int, right: bool) -> str:
    if isinstance(e, BinOp):
        inner = _PREC[e.op]
        # a - (b + c) and a / (b * c) need brackets on the right at equal precedence.
        if inner < prec or (right and inner == prec):
            return f"({e})"
    return str(e)


def walk(e: Expr) -> Iterator[Expr]:
    yield e
    if isinstance(e, Call):
        for a in e.args:
            yield from walk(a)
    elif isinstance(e, BinOp):
        yield from walk(e.lhs)
        yield from walk(e.rhs)
    elif isinstance(e, Neg):
        yield from walk(e.x)
    elif isinstance(e, Gather):
        yield e.source
        yield from walk(e.index)


def depth(e: Expr, replaced: Collection[str] = (), by: int = 1) -> int:
    """How deep the expression nests (a read or a constant: 1), found without recursion: a fused chain of
    thousands of operators must be measured before anything walks it recursively. With ``replaced``, as it
    would nest with each read of those tensors replaced by an expression ``by`` deep (an inlined producer)."""
    deepest, stack = 0, [(e, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d + by - 1 if isinstance(node, Read) and node.tensor in replaced else d)
        if isinstance(node, Call):
            kids: tuple[Expr, ...] = node.args
        elif isinstance(node, BinOp):
            kids = (node.lhs, node.rhs)
        elif isinstance(node, Neg):
            kids = (node.x,)
        elif isinstance(node, Gather):
            kids = (node.source, node.index)
        else:
            kids = ()
        stack.extend((k, d + 1) for k in kids)
    return deepest


def gathers(e: Expr) -> list[Gather]:
    return [n for n in walk(e) if isinstance(n, Gather)]


def reads(e: Expr) -> list[Read]:
    return [n for n in walk(e) if isinstance(n, Read)]


def axis_values(e: Expr) -> list[AxisValue]:
    return [n for n in walk(e) if isinstance(n, AxisValue)]


def flop_count(e: Expr) -> int:
    """Arithmetic operations per evaluation of the body (a function call counts as one)."""
    return sum(1 for n in walk(e) if isinstance(n, (BinOp, Neg, Call)))


def map_reads(e: Expr, fn) -> Expr:  # fn: Read -> Expr
    if isinstance(e, Read):
        return fn(e)
    if isinstance(e, Call):
        return Call(e.fn, tuple(map_reads(a, fn) for a in e.args), e.pos)
    if isinstance(e, BinOp):
        return BinOp(e.op, map_reads(e.lhs, fn), map_reads(e.rhs, fn))
    if isinstance(e, Neg):
        return Neg(map_reads(e.x, fn))
    if isinstance(e, Gather):
        source = fn(e.source)
        if not isinstance(source, Read):   # a gathered element is read, never recomputed in place
            raise TypeError(f"a gathered read of {e.source.tensor} cannot be replaced by an expression")
        return Gather(source, e.dim, map_reads(e.index, fn))
    return e
