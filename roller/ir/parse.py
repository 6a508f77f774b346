"""Parser for index notation: ``OUT[i, j] (= | += | max= | min=) expr``.

Errors carry the column so that the CLI can put a caret under the offending character.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from roller.ir.expr import ARITY, FUNCS, Affine, AxisValue, BinOp, Call, Const, Expr, Gather, Neg, Read


class ParseError(Exception):
    def __init__(self, message: str, pos: int) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos


@dataclass(frozen=True)
class Statement:
    output: str
    out_index: tuple[Affine, ...]
    out_pos: int
    op: str  # "=", "+=", "max=", "min="
    op_pos: int
    body: Expr


# re.ASCII: \d and \s are ASCII only; '٣' (an Arabic-Indic three) is not a digit of an index.
_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+)"
    r"|(?P<assign>\+=|max=|min=|=)"
    r"|(?P<name>[A-Za-z_][A-Za-z_0-9]*)"
    r"|(?P<punct>[-+*/()\[\],]))", re.ASCII
)

# Bounds that keep parsing, printing and code generation away from Python's recursion limit and the C compilers'
# bracket-nesting limit (256 in clang): brackets and calls nest at most MAX_NESTING deep, a statement is at most
# MAX_CHARS long, and the tree, where a chain of one operator (a + b + c ...) longer than _CHAIN is balanced,
# at most MAX_DEPTH deep.
MAX_CHARS = 20_000
MAX_NESTING = 32
MAX_DEPTH = 64
_CHAIN = 16
_INDEX_DIGITS = 19


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    pos: int


def _tokenize(src: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i = 0
    while i < len(src):
        if src[i] in " \t\r\n":
            i += 1
            continue
        m = _TOKEN.match(src, i)
        if not m or m.end() == i:
            raise ParseError(f"unexpected character {src[i]!r}", i)
        kind = m.lastgroup or ""
        text = m.group(kind)
        start = m.start(kind)
        # "max=" must be an assignment only right after the output reference; "max(" is a call.
        if kind == "name" and text in ("max", "min") and src[m.end():m.end() + 1] == "=":
            kind, text = "assign", text + "="
            toks.append(_Tok(kind, text, start))
            i = m.end() + 1
            continue
        toks.append(_Tok(kind, text, start))
        i = m.end()
    toks.append(_Tok("end", "", len(src)))
    return toks


class _Parser:
    def __init__(self, src: str) -> None:
        if len(src) > MAX_CHARS:
            raise ParseError(f"the statement is {len(src)} characters long, more than {MAX_CHARS}", MAX_CHARS)
        self.src = src
        self.toks = _tokenize(src)
        self.i = 0
        self.nesting = 0

    def enter(self, pos: int) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise ParseError(f"brackets and function calls nest more than {MAX_NESTING} deep", pos)

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def next(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, text: str) -> _Tok:
        t = self.next()
        if t.text != text:
            got = "end of expression" if t.kind == "end" else repr(t.text)
            raise ParseError(f"expected {text!r}, got {got}", t.pos)
        return t

    def statement(self) -> Statement:
        t = self.next()
        if t.kind != "name":
            raise ParseError("expected the output tensor name", t.pos)
        index = self.index_list()
        op = self.next()
        if op.kind != "assign":
            got = "end of expression" if op.kind == "end" else repr(op.text)
            raise ParseError(f"expected '=', '+=', 'max=' or 'min=', got {got}", op.pos)
        body = self.expr()
        end = self.peek()
        if end.kind != "end":
            raise ParseError(f"unexpected {end.text!r} after the expression", end.pos)
        return Statement(t.text, index, t.pos, op.text, op.pos, body)

    def index_list(self) -> tuple[Affine, ...]:
        self.expect("[")
        items: list[Affine] = []
        if self.peek().text == "]":
            self.next()
            return ()
        while True:
            items.append(self.index())
            t = self.next()
            if t.text == "]":
                return tuple(items)
            if t.text != ",":
                got = "end of expression" if t.kind == "end" else repr(t.text)
                raise ParseError(f"expected ',' or ']', got {got}", t.pos)

    def read(self, name: _Tok) -> Expr:
        """A tensor read; one of its indices may be a run-time value, an integer expression that starts with a read
        of an index tensor (``E[ids[i], d]``, ``X[b, idx[j] + 1]``: a Gather)."""
        self.expect("[")
        items: list[Affine] = []
        gathered: tuple[int, Expr] | None = None
        if self.peek().text == "]":
            self.next()
        while self.toks[self.i - 1].text != "]":
            t = self.peek()
            if t.kind == "name" and self.toks[self.i + 1].text == "[":
                if gathered is not None:
                    raise ParseError("a read takes one run-time index at most", t.pos)
                self.enter(t.pos)
                gathered = (len(items), self.expr())   # an integer expression starting with a read
                self.nesting -= 1
                items.append(Affine((), 0))
            else:
                items.append(self.index())
            t = self.next()
            if t.text not in (",", "]"):
                got = "end of expression" if t.kind == "end" else repr(t.text)
                raise ParseError(f"expected ',' or ']', got {got}", t.pos)
        source = Read(name.text, tuple(items), name.pos)
        return source if gathered is None else Gather(source, gathered[0], gathered[1])

    # Index expressions: + - * over integers and axis names; products of two axes are rejected.
    def index(self) -> Affine:
        value = self.index_sum()
        if isinstance(value, int):
            return Affine((), value)
        return value

    def index_sum(self) -> Affine | int:
        acc = self.index_term()
        while self.peek().text in ("+", "-"):
            op = self.next()
            rhs = self.index_term()
            acc = _aff_add(acc, rhs, -1 if op.text == "-" else 1)
        return acc

    def index_term(self) -> Affine | int:
        acc = self.index_atom()
        while self.peek().text in ("*", "/"):
            op = self.next()
            if op.text == "/":
                raise ParseError("division is not allowed in an index (indices must be affine)", op.pos)
            rhs = self.index_atom()
            if isinstance(acc, Affine) and isinstance(rhs, Affine):
                raise ParseError("non-affine index: product of two axes", op.pos)
            if isinstance(acc, Affine):
                acc = acc.scale(int(rhs))  # type: ignore[arg-type]
            elif isinstance(rhs, Affine):
                acc = rhs.scale(acc)
            else:
                acc = acc * rhs
        return acc

    def index_atom(self) -> Affine | int:
        t = self.next()
        if t.text == "-":
            v = self.index_atom()
            return v.scale(-1) if isinstance(v, Affine) else -v
        if t.text == "(":
            self.enter(t.pos)
            v = self.index_sum()
            self.expect(")")
            self.nesting -= 1
            return v
        if t.kind == "num":
            if not t.text.isdigit():
                raise ParseError(f"index constants must be integers, got {t.text}", t.pos)
            if len(t.text) > _INDEX_DIGITS:
                raise ParseError(f"index constant of {len(t.text)} digits: generated kernels compute indices in "
                                 "64-bit integers", t.pos)
            return int(t.text)
        if t.kind == "name":
            if self.peek().text in ("(", "["):
                raise ParseError(f"non-affine index: {t.text}{self.peek().text}...", t.pos)
            return Affine.axis(t.text)
        got = "end of expression" if t.kind == "end" else repr(t.text)
        raise ParseError(f"expected an index, got {got}", t.pos)

    # Body expressions.
    def expr(self) -> Expr:
        first = self.term()
        rest: list[tuple[str, Expr]] = []
        while self.peek().text in ("+", "-"):
            op = self.next().text
            rest.append((op, self.term()))
        return _chain(first, rest, "-")

    def term(self) -> Expr:
        first = self.unary()
        rest: list[tuple[str, Expr]] = []
        while self.peek().text in ("*", "/"):
            op = self.next().text
            rest.append((op, self.unary()))
        return _chain(first, rest, "/")

    def unary(self) -> Expr:
        if self.peek().text == "-":
            minus = self.next()
            self.enter(minus.pos)
            inner = self.unary()
            self.nesting -= 1
            if isinstance(inner, Const):
                return Const(-inner.value)
            return Neg(inner)
        return self.primary()

    def primary(self) -> Expr:
        t = self.next()
        if t.kind == "num":
            return Const(float(t.text))
        if t.text == "(":
            self.enter(t.pos)
            e = self.expr()
            self.expect(")")
            self.nesting -= 1
            return e
        if t.kind == "name":
            if self.peek().text == "(":
                return self.call(t)
            if self.peek().text == "[":
                return self.read(t)
            if t.text == "inf":
                return Const(float("inf"))
            return AxisValue(t.text, t.pos)  # a bare name is an axis's value (checked to be an axis later)
        got = "end of expression" if t.kind == "end" else repr(t.text)
        raise ParseError(f"expected a value, got {got}", t.pos)

    def call(self, name: _Tok) -> Expr:
        if name.text not in FUNCS:
            raise ParseError(f"unknown function {name.text!r} (known: {', '.join(FUNCS)})", name.pos)
        self.expect("(")
        self.enter(name.pos)
        args = [self.expr()]
        while self.peek().text == ",":
            self.next()
            args.append(self.expr())
        self.expect(")")
        self.nesting -= 1
        want = ARITY[name.text]
        if len(args) != want:
            raise ParseError(f"{name.text}() takes {want} argument{'s' if want > 1 else ''}, got {len(args)}",
                             name.pos)
        return Call(name.text, tuple(args), name.pos)


def _aff_add(a: Affine | int, b: Affine | int, sign: int) -> Affine | int:
    if isinstance(a, int) and isinstance(b, int):
        return a + sign * b
    fa = a if isinstance(a, Affine) else Affine((), a)
    fb = b if isinstance(b, Affine) else Affine((), b)
    return fa + fb.scale(sign)


def _chain(first: Expr, rest: list[tuple[str, Expr]], inverse: str) -> Expr:
    """``first op1 x1 op2 x2 ...`` (one precedence level) as a tree. Up to _CHAIN operands it is left-deep, as C
    reads it; a longer chain is split in the middle, with the operators of the right half inverted when the
    operator at the split is the inverse one (a - b + c == a - (b - c)), so that its depth grows with the
    logarithm of its length: a sum of 600 terms neither exhausts Python's stack nor C's bracket limit."""
    if len(rest) < _CHAIN:
        acc = first
        for op, x in rest:
            acc = BinOp(op, acc, x)
        return acc
    mid = len(rest) // 2
    op, head = rest[mid]
    tail = rest[mid + 1:]
    if op == inverse:
        flip = {"+": "-", "-": "+", "*": "/", "/": "*"}
        tail = [(flip[o], x) for o, x in tail]
    return BinOp(op, _chain(first, rest[:mid], inverse), _chain(head, tail, inverse))


def depth(e: Expr) -> int:
    """Nesting depth of an expression tree, found without recursion."""
    deepest = 0
    stack: list[tuple[Expr, int]] = [(e, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(node, BinOp):
            stack += [(node.lhs, level + 1), (node.rhs, level + 1)]
        elif isinstance(node, Neg):
            stack.append((node.x, level + 1))
        elif isinstance(node, Call):
            stack += [(a, level + 1) for a in node.args]
    return deepest


def parse_statement(src: str) -> Statement:
    """Parse one statement; raises ParseError with a column position."""
    stmt = _Parser(src).statement()
    levels = depth(stmt.body)
    if levels > MAX_DEPTH:
        raise ParseError(f"the expression nests {levels} operations deep, more than {MAX_DEPTH} (write long sums "
                         "as a reduction over an axis)", stmt.op_pos)
    return stmt
