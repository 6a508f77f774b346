"""Ops with symbolic dimensions: a size in op.json may be a name (``{"op": "matmul", "M": "m", ...}``,
``"shapes": {"X": ["n", 768]}``), optionally with a range (``"symbols": {"m": [1, 1024]}``).

A symbolic op is kept as its op.json document; ``instantiate`` substitutes sizes and loads it through the one
checked path every op takes, so a symbolic op means exactly what the same op written with numbers means.
"""
from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roller.errors import InputError
from roller.ir.build import Where, short
from roller.ir.opdoc import MAX_FILE_BYTES, parse_op, read_json
from roller.ir.tensor_expr import TensorExpr

# A size no larger than this is what a symbol ranges over unless the op says otherwise: long enough for a
# 4096-token sequence or a batch of a few thousand, and only a bound (buffers are sized per call, not by it).
DEFAULT_MAX = 4096
# Sizes go into 32-bit kernel arithmetic after being multiplied by a tensor's other dimensions.
MAX_SYMBOL_VALUE = 2**24
_SYMBOL = re.compile(r"[a-z_][a-z0-9_]{0,31}\Z")
_WORD = re.compile(r"[A-Za-z_]\w*\Z")
# Fields whose string values mean something other than a size.
_WORDS = {"name", "op", "dtype", "dtypes", "comment", "expr", "pad_value", "padding", "layout", "fn", "kind",
          "symbols"}


@dataclass
class SymbolicOp:
    """An op.json document (one op) with named sizes, and the range each name takes."""

    doc: dict[str, Any]
    ranges: dict[str, tuple[int, int]]  # symbol -> (least, greatest) value, both included
    source: str | None = None
    _cache: dict[tuple[int, ...], TensorExpr] = field(default_factory=dict, repr=False)
    _growth: dict[str, dict[int, tuple[str, int]]] | None = field(default=None, repr=False)

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(self.ranges)

    @property
    def name(self) -> str:
        return str(self.doc.get("name", self.doc.get("op", "op")))

    def check_values(self, values: Mapping[str, int], what: str = "") -> tuple[int, ...]:
        """``values`` as a tuple in ``symbols`` order, each checked against its range."""
        out = []
        for s in self.symbols:
            if s not in values:
                raise InputError(f"{self.name}: no value for symbol {s!r}{what}", source=self.source)
            v = values[s]
            lo, hi = self.ranges[s]
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise InputError(f"{self.name}: symbol {s!r} = {short(v)}{what} is outside its range [{lo}, {hi}] "
                                 "(declare a wider one in the op's \"symbols\")", source=self.source,
                                 field=f"symbols.{s}")
            out.append(v)
        extra = set(values) - set(self.symbols)
        if extra:
            raise InputError(f"{self.name}: unknown symbol {min(extra)!r} (the op's symbols: "
                             f"{', '.join(self.symbols)})", source=self.source)
        return tuple(out)

    def instantiate(self, values: Mapping[str, int]) -> TensorExpr:
        """The op with every symbol replaced by its value (loaded and checked as any op is)."""
        key = self.check_values(values)
        if key not in self._cache:
            bound = dict(zip(self.symbols, key))
            doc = {k: _substitute(k, v, bound) for k, v in self.doc.items() if k != "symbols"}
            self._cache[key] = parse_op(doc, Where(self.source, ""), default_name="op")
        return self._cache[key]

    def growth(self) -> dict[str, dict[int, tuple[str, int]]]:
        """Tensor -> {dimension: (symbol, factor)} for every dimension that is a multiple of one symbol (the
        factor times its value), found by instantiating at two values per symbol, so that a size derived
        otherwise (a convolution's output height) is not mistaken for one."""
        if self._growth is not None:
            return self._growth
        base = {s: hi for s, (lo, hi) in self.ranges.items()}
        ref = self.instantiate(base)
        out: dict[str, dict[int, tuple[str, int]]] = {}
        for s, (lo, hi) in self.ranges.items():
            if lo == hi:
                continue
            other = self.instantiate({**base, s: lo})
            for t_ref, t_other in zip(ref.tensors, other.tensors):
                for i, (a, b) in enumerate(zip(t_ref.storage_shape, t_other.storage_shape)):
                    if a != b and a % hi == 0 and a // hi * lo == b:
                        out.setdefault(t_ref.name, {})[i] = (s, a // hi)
        self._growth = out
        return out

    def symbolic_dims(self) -> dict[str, dict[int, str]]:
        """Tensor -> {dimension: symbol} for every dimension that is one symbol alone: what binds a call's
        arrays to values."""
        return {t: {i: s for i, (s, f) in dims.items() if f == 1} for t, dims in self.growth().items()}

    def bind(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        """Symbol values from the input arrays' shapes, checked: every input must have exactly the shape the op
        has at those values."""
        dims = self.symbolic_dims()
        values: dict[str, int] = {}
        for tensor, by_dim in dims.items():
            shape = shapes.get(tensor)
            if shape is None:
                continue
            for i, s in by_dim.items():
                if i < len(shape) and s not in values:
                    values[s] = int(shape[i])
        missing = [s for s in self.symbols if s not in values]
        if missing:
            raise InputError(f"{self.name}: no input has symbol {missing[0]!r} as a dimension of its own, so a call "
                             "cannot tell its value", source=self.source)
        expr = self.instantiate({s: values[s] for s in self.symbols})
        for t in expr.inputs:
            got = shapes.get(t.name)
            if got is not None and tuple(got) != tuple(t.storage_shape):
                at = ", ".join(f"{s}={values[s]}" for s in self.symbols)
                raise InputError(f"{self.name}: input {t.name} has shape {list(got)}, but with {at} it must be "
                                 f"{list(t.storage_shape)}", source=self.source)
        return values


def _substitute(key: str, value: Any, bound: Mapping[str, int]) -> Any:
    if key in ("shapes", "extents") and isinstance(value, dict):
        return {k: _substitute(key, v, bound) for k, v in value.items()}
    if key in _WORDS:
        return value
    if isinstance(value, str):
        return bound.get(value, value)
    if isinstance(value, list):
        return [bound.get(v, v) if isinstance(v, str) else v for v in value]
    return value


def _names_in(key: str, value: Any) -> list[str]:
    """The size names a top-level field holds (where a number is a size)."""
    if key in ("shapes", "extents") and isinstance(value, dict):
        return [n for v in value.values() for n in _names_in("", v)]
    if key in _WORDS:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def parse_symbolic(doc: Any, source: str | None) -> SymbolicOp | None:
    """The op as a SymbolicOp when it names a size, None when every size is a number (an ordinary op)."""
    if not isinstance(doc, dict) or "ops" in doc:
        return None
    where = Where(source, "")
    names: list[str] = []
    for key, value in doc.items():
        # Only a word can be meant as a symbol; "4" or "" in a size is a number written wrongly, which the
        # ordinary loader reports as such.
        names += [n for n in _names_in(key, value) if n not in names and _WORD.match(n)]
    declared = doc.get("symbols")
    if declared is None and not names:
        return None
    if declared is None:
        declared = {}
    if not isinstance(declared, dict):
        raise where.at("symbols").error(f"expected an object of symbol: [least, greatest], got {short(declared)}")
    ranges: dict[str, tuple[int, int]] = {}
    for name in [*declared, *[n for n in names if n not in declared]]:
        if not _SYMBOL.match(name):
            raise where.at("symbols" if name in declared else _field_of(doc, name)).error(
                f"{short(name)} is not a size: a symbolic size is a lower-case identifier of at most 32 characters "
                "(e.g. \"m\", \"seq\")")
        rng = declared.get(name, [1, DEFAULT_MAX])
        ok = isinstance(rng, list) and len(rng) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in rng)
        if not ok or not 1 <= rng[0] <= rng[1] <= MAX_SYMBOL_VALUE:
            raise where.at(f"symbols.{name}").error(
                f"expected [least, greatest] with 1 <= least <= greatest <= {MAX_SYMBOL_VALUE}, got {short(rng)}")
        if name not in names:
            raise where.at(f"symbols.{name}").error("declared but no size of the op names it")
        ranges[name] = (int(rng[0]), int(rng[1]))
    op = SymbolicOp(copy.deepcopy(doc), ranges, source)
    # Loading it at both ends of every range finds what no single value would: a window that does not fit the
    # least size, a name in a field that takes no size.
    op.instantiate({s: lo for s, (lo, hi) in ranges.items()})
    op.instantiate({s: hi for s, (lo, hi) in ranges.items()})
    return op


def _field_of(doc: dict[str, Any], name: str) -> str:
    for key, value in doc.items():
        if name in _names_in(key, value):
            return key
    return ""


def load_symbolic(src: Any) -> SymbolicOp | None:
    """A SymbolicOp from an op.json path or dict that names a size; None for anything else (an ordinary op, a
    TensorExpr, a file of several ops), which the ordinary loader then reads."""
    if isinstance(src, dict):
        return parse_symbolic(src, None)
    if not isinstance(src, (str, os.PathLike)):
        return None
    path = Path(src)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # the ordinary loader reports it
    if len(data) > MAX_FILE_BYTES:
        return None
    return parse_symbolic(read_json(text, str(src)), str(src))
