"""Named ops (matmul, conv2d, ...) expand to generic index-notation expressions.

Each expansion returns the statement text, the tensor shapes and any axis extents that the statement cannot
infer (a pooling window never indexes a dimension alone), so named and generic ops share one checked path.
"""
from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from roller.ir.build import Where, short
from roller.ir.expr import BINARY_FUNCS, UNARY_FUNCS


@dataclass(frozen=True)
class Expansion:
    text: str
    shapes: dict[str, list[int]]
    extents: dict[str, int]
    pad_value: float = 0.0


_COMMON = {"name", "op", "dtype", "dtypes", "comment"}


class _Params:
    """Typed access to a named op's fields that reports the field on error."""

    def __init__(self, obj: dict, allowed: set[str], where: Where) -> None:
        self.obj = obj
        self.where = where
        for key in obj:
            if key not in allowed | _COMMON:
                hint = difflib.get_close_matches(key, sorted(allowed | _COMMON), n=1)
                extra = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise where.at(key).error(f"unknown field for op {obj['op']!r}{extra}; "
                                          f"expected one of {', '.join(sorted(allowed))}")

    def integer(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        if key not in self.obj:
            if default is None:
                raise self.where.error(f"missing field {key!r}")
            return default
        v = self.obj[key]
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.where.at(key).error(f"expected an integer, got {short(v)}")
        if v < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.where.at(key).error(f"expected {what}, got {v}")
        return v

    def bool(self, key: str, default: bool = False) -> bool:
        v = self.obj.get(key, default)
        if not isinstance(v, bool):
            raise self.where.at(key).error(f"expected true or false, got {short(v)}")
        return v

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        v = self.obj.get(key, default)
        if v not in choices:
            raise self.where.at(key).error(f"expected one of {', '.join(choices)}, got {short(v)}")
        return v

    def shape(self, key: str) -> list[int]:
        if key not in self.obj:
            raise self.where.error(f"missing field {key!r}")
        v = self.obj[key]
        if not isinstance(v, list) or not v or not all(isinstance(d, int) and not isinstance(d, bool) for d in v):
            raise self.where.at(key).error(f"expected a non-empty list of positive integers, got {short(v)}")
        for i, d in enumerate(v):
            if d <= 0:
                raise self.where.at(f"{key}[{i}]").error(f"expected a positive size, got {d}")
        return v

    def padding(self, key: str, default: str) -> str | int:
        v = self.obj.get(key, default)
        if v in ("SAME", "VALID") or (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            return v
        raise self.where.at(key).error(f"expected SAME, VALID or a non-negative integer, got {short(v)}")


def _window(size: int, k: int, stride: int, dilation: int, padding: str | int, where: Where,
            dim: str) -> tuple[int, int]:
    """(output size, padding before) for one spatial dimension, TensorFlow's SAME convention."""
    span = (k - 1) * dilation + 1
    if padding == "SAME":
        out = -(-size // stride)
        total = max((out - 1) * stride + span - size, 0)
        before = total // 2
    elif padding == "VALID":
        out = (size - span) // stride + 1 if size >= span else 0
        before = 0
    else:
        out = (size + 2 * int(padding) - span) // stride + 1 if size + 2 * int(padding) >= span else 0
        before = int(padding)
    if out <= 0:
        raise where.error(f"window of {span} does not fit {dim}={size} with padding {padding}")
    return out, before


def _shift(stride: int, axis: str, dil: int, win: str, before: int) -> str:
    s = f"{axis}*{stride}" if stride != 1 else axis
    s += f"+{win}*{dil}" if dil != 1 else f"+{win}"
    return s + (f"-{before}" if before else "")


def _matmul(p: _Params) -> Expansion:
    m, n, k = p.integer("M"), p.integer("N"), p.integer("K")
    ta, tb = p.bool("transpose_a"), p.bool("transpose_b")
    a = "A[k,m]" if ta else "A[m,k]"
    b = "B[n,k]" if tb else "B[k,n]"
    return Expansion(f"C[m,n] += {a} * {b}",
                     {"A": [k, m] if ta else [m, k], "B": [n, k] if tb else [k, n], "C": [m, n]}, {})


def _batch_matmul(p: _Params) -> Expansion:
    bs, m, n, k = p.integer("B"), p.integer("M"), p.integer("N"), p.integer("K")
    ta, tb = p.bool("transpose_a"), p.bool("transpose_b")
    a = "A[b,k,m]" if ta else "A[b,m,k]"
    b = "B[b,n,k]" if tb else "B[b,k,n]"
    return Expansion(f"C[b,m,n] += {a} * {b}",
                     {"A": [bs, k, m] if ta else [bs, m, k], "B": [bs, n, k] if tb else [bs, k, n],
                      "C": [bs, m, n]}, {})


def _conv_common(p: _Params, depthwise: bool) -> Expansion:
    n, c, h, w = p.integer("N"), p.integer("C"), p.integer("H"), p.integer("W")
    f = c if depthwise else p.integer("F")
    kh, kw = p.integer("KH"), p.integer("KW")
    stride, dil = p.integer("stride", 1), p.integer("dilation", 1)
    pad = p.padding("padding", "SAME")
    layout = p.choice("layout", ("NCHW", "NHWC"), "NCHW")
    oh, ph = _window(h, kh, stride, dil, pad, p.where, "H")
    ow, pw = _window(w, kw, stride, dil, pad, p.where, "W")
    hi, wi = _shift(stride, "h", dil, "r", ph), _shift(stride, "w", dil, "s", pw)
    if depthwise:
        if layout == "NCHW":
            text = f"Y[n,c,h,w] += X[n,c,{hi},{wi}] * W[c,r,s]"
            shapes = {"X": [n, c, h, w], "W": [c, kh, kw], "Y": [n, c, oh, ow]}
        else:
            text = f"Y[n,h,w,c] += X[n,{hi},{wi},c] * W[c,r,s]"  # W is [C,KH,KW] in both layouts
            shapes = {"X": [n, h, w, c], "W": [c, kh, kw], "Y": [n, oh, ow, c]}
    elif layout == "NCHW":
        text = f"Y[n,f,h,w] += X[n,c,{hi},{wi}] * W[f,c,r,s]"
        shapes = {"X": [n, c, h, w], "W": [f, c, kh, kw], "Y": [n, f, oh, ow]}
    else:
        text = f"Y[n,h,w,f] += X[n,{hi},{wi},c] * W[r,s,c,f]"
        shapes = {"X": [n, h, w, c], "W": [kh, kw, c, f], "Y": [n, oh, ow, f]}
    return Expansion(text, shapes, {})


def _pool(p: _Params, kind: str) -> Expansion:
    n, c, h, w, k = p.integer("N"), p.integer("C"), p.integer("H"), p.integer("W"), p.integer("K")
    stride = p.integer("stride", k)
    pad = p.padding("padding", "VALID")
    oh, ph = _window(h, k, stride, 1, pad, p.where, "H")
    ow, pw = _window(w, k, stride, 1, pad, p.where, "W")
    read = f"X[n,c,{_shift(stride, 'h', 1, 'r', ph)},{_shift(stride, 'w', 1, 's', pw)}]"
    shapes = {"X": [n, c, h, w], "Y": [n, c, oh, ow]}
    if kind == "avg":
        if p.bool("count_include_pad", True):
            # PyTorch's default: every window divides by K*K, padding counted as zeros.
            return Expansion(f"Y[n,c,h,w] += {read} / {float(k * k)}", shapes, {"r": k, "s": k})
        # TensorFlow's and ONNX's default: divide by the window's points inside the input. The count is the
        # product of the window's overlap with [0, H) and with [0, W), from the output point's own coordinates.
        def overlap(axis: str, before: int, size: int, out: int) -> str:
            empty = [o for o in range(out) if min(o * stride - before + k, size) <= max(o * stride - before, 0)]
            if empty:
                raise p.where.at("padding").error(
                    f"output {axis}={empty[0]} averages a window with no input point (padding {pad}, K={k}): with "
                    "count_include_pad false its divisor would be 0")
            start = (f"{axis}*{stride}" if stride != 1 else axis) + (f"-{before}" if before else "")
            return f"(min({start} + {k}, {size}) - max({start}, 0))"

        count = f"{overlap('h', ph, h, oh)} * {overlap('w', pw, w, ow)}"
        return Expansion(f"Y[n,c,h,w] += {read} / ({count})", shapes, {"r": k, "s": k})
    return Expansion(f"Y[n,c,h,w] max= {read}", shapes, {"r": k, "s": k}, float("-inf"))


def _reduce(p: _Params) -> Expansion:
    kind = p.choice("kind", ("sum", "max", "min", "mean"), "sum")
    shape = p.shape("shape")
    raw = p.obj.get("axes")
    if not isinstance(raw, list) or not raw or not all(isinstance(a, int) and not isinstance(a, bool)
                                                       for a in raw):
        raise p.where.at("axes").error(f"expected a non-empty list of axis numbers, got {short(raw)}")
    axes = set()
    for i, a in enumerate(raw):
        if not -len(shape) <= a < len(shape):
            raise p.where.at(f"axes[{i}]").error(f"axis {a} is out of range for rank {len(shape)}")
        if a % len(shape) in axes:
            raise p.where.at(f"axes[{i}]").error(f"axis {a} is listed twice (as {a % len(shape)})")
        axes.add(a % len(shape))
    names = [f"i{d}" for d in range(len(shape))]
    keep = [names[d] for d in range(len(shape)) if d not in axes]
    read = f"X[{','.join(names)}]"
    count = math.prod(shape[d] for d in axes)
    op = {"sum": "+=", "mean": "+=", "max": "max=", "min": "min="}[kind]
    body = f"{read} / {float(count)}" if kind == "mean" else read
    pad = {"max": float("-inf"), "min": float("inf")}.get(kind, 0.0)
    out_shape = [shape[d] for d in range(len(shape)) if d not in axes]
    return Expansion(f"Y[{','.join(keep)}] {op} {body}", {"X": shape, "Y": out_shape}, {}, pad)


def _elementwise(p: _Params) -> Expansion:
    fn = p.obj.get("fn")
    unary = UNARY_FUNCS + ("neg",)
    binary = ("add", "sub", "mul", "div") + BINARY_FUNCS
    if fn not in unary + binary:
        raise p.where.at("fn").error(f"expected one of {', '.join(unary + binary)}, got {short(fn)}")
    shapes = p.obj.get("shapes")
    want = 1 if fn in unary else 2
    if not isinstance(shapes, dict) or len(shapes) != want:
        raise p.where.at("shapes").error(f"expected {want} named input shape{'s' if want > 1 else ''} "
                                         f"for fn {fn!r}, got {short(shapes)}")
    for name in shapes:
        _Params({"op": "elementwise", "shape": shapes[name]}, {"shape"}, p.where.at(f"shapes.{name}")).shape("shape")
    rank = max(len(s) for s in shapes.values())
    out: list[int] = []
    for d in range(rank):
        sizes = {s[d - rank + len(s)] for s in shapes.values() if d - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise p.where.at("shapes").error(f"shapes {list(shapes.values())} do not broadcast (dimension {d})")
        out.append(sizes.pop() if sizes else 1)
    names = [f"i{d}" for d in range(rank)]
    reads = []
    for tname, s in shapes.items():
        off = rank - len(s)
        idx = [names[d] if s[d - off] == out[d] else "0" for d in range(off, rank)]
        reads.append(f"{tname}[{','.join(idx)}]")
    out_name = "Y" if "Y" not in shapes else "Out"
    if fn == "neg":
        body = f"-{reads[0]}"
    elif fn in unary:
        body = f"{fn}({reads[0]})"
    elif fn in BINARY_FUNCS:
        body = f"{fn}({reads[0]}, {reads[1]})"
    else:
        body = f"{reads[0]} { {'add': '+', 'sub': '-', 'mul': '*', 'div': '/'}[fn]} {reads[1]}"
    return Expansion(f"{out_name}[{','.join(names)}] = {body}", {**shapes, out_name: out}, {})


def _transpose(p: _Params) -> Expansion:
    shape = p.shape("shape")
    perm = p.obj.get("perm")
    # Booleans and floats compare equal to integers (True == 1, 1.0 == 1): accept integers only.
    if not isinstance(perm, list) or not all(type(q) is int for q in perm) \
            or sorted(perm) != list(range(len(shape))):
        raise p.where.at("perm").error(f"expected a permutation of 0..{len(shape) - 1}, got {short(perm)}")
    names = [f"i{d}" for d in range(len(shape))]
    out = [names[q] for q in perm]
    return Expansion(f"Y[{','.join(out)}] = X[{','.join(names)}]",
                     {"X": shape, "Y": [shape[q] for q in perm]}, {})


_CONV_FIELDS = {"N", "C", "H", "W", "KH", "KW", "stride", "padding", "dilation", "layout"}
NAMED: dict[str, tuple[set[str], Callable[[_Params], Expansion]]] = {
    "matmul": ({"M", "N", "K", "transpose_a", "transpose_b"}, _matmul),
    "batch_matmul": ({"B", "M", "N", "K", "transpose_a", "transpose_b"}, _batch_matmul),
    "conv2d": (_CONV_FIELDS | {"F"}, lambda p: _conv_common(p, False)),
    "depthwise_conv2d": (_CONV_FIELDS, lambda p: _conv_common(p, True)),
    "avgpool2d": ({"N", "C", "H", "W", "K", "stride", "padding", "count_include_pad"}, lambda p: _pool(p, "avg")),
    "maxpool2d": ({"N", "C", "H", "W", "K", "stride", "padding"}, lambda p: _pool(p, "max")),
    "reduce": ({"kind", "shape", "axes"}, _reduce),
    "elementwise": ({"fn", "shapes"}, _elementwise),
    "transpose": ({"shape", "perm"}, _transpose),
}


def expand(obj: dict[str, Any], where: Where) -> Expansion:
    op = obj["op"]
    if op not in NAMED:
        hint = difflib.get_close_matches(str(op), list(NAMED), n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise where.at("op").error(f"unknown op {op!r}{extra}; expected one of {', '.join(NAMED)}")
    allowed, fn = NAMED[op]
    return fn(_Params(obj, allowed, where))
