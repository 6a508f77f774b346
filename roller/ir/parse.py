"""Parser for index notation: ``OUT[i, j] (= | += | max= | min=) expr``.

Errors carry the column so that the CLI can put a caret under the offending character.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from roller.ir.expr import FUNCS, UNARY_FUNCS, Affine, BinOp, Call, Const, Expr, Neg, Read


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


_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+)"
    r"|(?P<assign>\+=|max=|min=|=)"
    r"|(?P<name>[A-Za-z_][A-Za-z_0-9]*)"
    r"|(?P<punct>[-+*/()\[\],]))"
)


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    pos: int


def _tokenize(src: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i = 0
    while i < len(src):
        if src[i].isspace():
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
        self.src = src
        self.toks = _tokenize(src)
        self.i = 0

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
            v = self.index_sum()
            self.expect(")")
            return v
        if t.kind == "num":
            if not t.text.isdigit():
                raise ParseError(f"index constants must be integers, got {t.text}", t.pos)
            return int(t.text)
        if t.kind == "name":
            if self.peek().text in ("(", "["):
                raise ParseError(f"non-affine index: {t.text}{self.peek().text}...", t.pos)
            return Affine.axis(t.text)
        got = "end of expression" if t.kind == "end" else repr(t.text)
        raise ParseError(f"expected an index, got {got}", t.pos)

    # Body expressions.
    def expr(self) -> Expr:
        acc = self.term()
        while self.peek().text in ("+", "-"):
            op = self.next().text
            acc = BinOp(op, acc, self.term())
        return acc

    def term(self) -> Expr:
        acc = self.unary()
        while self.peek().text in ("*", "/"):
            op = self.next().text
            acc = BinOp(op, acc, self.unary())
        return acc

    def unary(self) -> Expr:
        if self.peek().text == "-":
            self.next()
            inner = self.unary()
            if isinstance(inner, Const):
                return Const(-inner.value)
            return Neg(inner)
        return self.primary()

    def primary(self) -> Expr:
        t = self.next()
        if t.kind == "num":
            return Const(float(t.text))
        if t.text == "(":
            e = self.expr()
            self.expect(")")
            return e
        if t.kind == "name":
            if self.peek().text == "(":
                return self.call(t)
            if self.peek().text == "[":
                return Read(t.text, self.index_list(), t.pos)
            if t.text == "inf":
                return Const(float("inf"))
            raise ParseError(f"{t.text!r} is neither a tensor read nor a function call", t.pos)
        got = "end of expression" if t.kind == "end" else repr(t.text)
        raise ParseError(f"expected a value, got {got}", t.pos)

    def call(self, name: _Tok) -> Expr:
        if name.text not in FUNCS:
            raise ParseError(f"unknown function {name.text!r} (known: {', '.join(FUNCS)})", name.pos)
        self.expect("(")
        args = [self.expr()]
        while self.peek().text == ",":
            self.next()
            args.append(self.expr())
        self.expect(")")
        want = 1 if name.text in UNARY_FUNCS else 2
        if len(args) != want:
            raise ParseError(f"{name.text}() takes {want} argument{'s' if want > 1 else ''}, got {len(args)}",
                             name.pos)
        return Call(name.text, tuple(args))


def _aff_add(a: Affine | int, b: Affine | int, sign: int) -> Affine | int:
    if isinstance(a, int) and isinstance(b, int):
        return a + sign * b
    fa = a if isinstance(a, Affine) else Affine((), a)
    fb = b if isinstance(b, Affine) else Affine((), b)
    return fa + fb.scale(sign)


def parse_statement(src: str) -> Statement:
    """Parse one statement; raises ParseError with a column position."""
    return _Parser(src).statement()
