"""Reading op.json: one op object or ``{"ops": [...]}``, generic (``expr``) or named (``op``)."""
from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

from roller.errors import InputError
from roller.ir.build import FLOAT32_MAX, Where, build_expr, short
from roller.ir.named import expand
from roller.ir.tensor_expr import TensorExpr
from roller.names import check_name

_GENERIC_FIELDS = {"name", "expr", "shapes", "dtype", "dtypes", "pad_value", "extents", "comment"}

# Bounds on what an op file may hold, so that a hostile file fails in one line instead of exhausting memory, time
# or the interpreter's stack. Far above any real op: roller119.json is 40 KB, 119 ops, nested 4 deep.
MAX_FILE_BYTES = 8 * 2**20
MAX_OPS = 10_000
MAX_JSON_DEPTH = 32
MAX_INT_DIGITS = 40

OpLike = str | os.PathLike | dict | TensorExpr


def load_ops(src: OpLike) -> list[TensorExpr]:
    """Every op of a file, a dict (one op or ``{"ops": [...]}``) or an already parsed TensorExpr."""
    if isinstance(src, TensorExpr):
        return [src]
    if isinstance(src, dict):
        return parse_ops(src, None)
    path = Path(src)
    try:
        with open(path, "rb") as fh:
            # One byte more than allowed tells a file at the limit from a larger one without reading it all.
            data = fh.read(MAX_FILE_BYTES + 1)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise InputError("no such op file", source=str(src)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read op file: {err.__class__.__name__}", source=str(src)) from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"op file is larger than {MAX_FILE_BYTES // 2**20} MiB, the most an op file may be "
                         "(split it into several files)", source=str(src))
    return parse_ops(read_json(text, str(src)), str(src))


class _JSONProblem(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JSONProblem(f"duplicate key {key!r} in one object")
        out[key] = value
    return out


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _JSONProblem(f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _no_constant(name: str) -> Any:
    raise _JSONProblem(f"{name} is not a JSON number (give a finite number, or \"inf\"/\"-inf\" where allowed)")


def read_json(text: str, source: str | None) -> Any:
    """JSON text as data, with one-line InputErrors for what ``json`` accepts or crashes on but an op file must
    not hold: duplicate keys, NaN and Infinity, integers too long to be sizes, nesting deeper than
    ``MAX_JSON_DEPTH`` (checked without recursion, so it never exhausts the stack)."""
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_int=_bounded_int,
                         parse_constant=_no_constant)
    except json.JSONDecodeError as err:
        raise InputError(f"invalid JSON: {err.msg} (column {err.colno})", source=source, line=err.lineno) from None
    except _JSONProblem as err:
        raise InputError(f"invalid op file: {err}", source=source) from None
    except RecursionError:
        raise InputError(f"invalid op file: JSON nested more than {MAX_JSON_DEPTH} levels deep",
                         source=source) from None
    depth = _depth(doc)
    if depth > MAX_JSON_DEPTH:
        raise InputError(f"invalid op file: JSON nested {depth} levels deep (at most {MAX_JSON_DEPTH})",
                         source=source)
    return doc


def _depth(doc: Any) -> int:
    deepest = 0
    stack = [(doc, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in value)
    return deepest


def load_op(src: OpLike) -> TensorExpr:
    ops = load_ops(src)
    if len(ops) != 1:
        raise InputError(f"expected one op, found {len(ops)} (choose one with --op NAME)",
                         source=None if isinstance(src, (dict, TensorExpr)) else str(src))
    return ops[0]


def parse_ops(doc: Any, source: str | None) -> list[TensorExpr]:
    root = Where(source, "")
    if isinstance(doc, dict) and "ops" in doc:
        extra = set(doc) - {"ops", "comment"}
        if extra:
            raise root.at(min(extra)).error("unknown top-level field; expected 'ops'")
        items = doc["ops"]
        if not isinstance(items, list) or not items:
            raise root.at("ops").error(f"expected a non-empty list of ops, got {short(items)}")
        if len(items) > MAX_OPS:
            raise root.at("ops").error(f"{len(items)} ops in one file, more than {MAX_OPS} (split it)")
        wheres = [Where(source, f"ops[{i}]") for i in range(len(items))]
    elif isinstance(doc, dict):
        items, wheres = [doc], [root]
    else:
        raise root.error(f"expected an op object or {{\"ops\": [...]}}, got {type(doc).__name__}")
    ops: list[TensorExpr] = []
    seen: dict[str, str] = {}
    for i, (item, where) in enumerate(zip(items, wheres)):
        _no_symbols(item, where)
        op = parse_op(item, where, default_name=f"op{i}" if len(items) > 1 else "op")
        if op.name in seen:
            raise where.at("name").error(f"duplicate op name {op.name!r} (also {seen[op.name]})")
        seen[op.name] = where.field or "the op"
        ops.append(op)
    return ops


def _no_symbols(item: Any, where: Where) -> None:
    """An op with symbolic sizes is built for every size by ``roller build`` and ``roller.compile`` only; said
    here in words, not as the field error it would otherwise meet."""
    from roller.ir.symbolic import parse_symbolic

    if not isinstance(item, dict):
        return
    op = parse_symbolic(item, where.source)
    if op is not None:
        raise where.error(f"op {op.name!r} has symbolic sizes ({', '.join(op.symbols)}): roller build and "
                          "roller.compile build it for every size (one op to a file); here, write a number in place of each")


def parse_op(obj: Any, where: Where, default_name: str = "op") -> TensorExpr:
    if not isinstance(obj, dict):
        raise where.error(f"expected an op object, got {type(obj).__name__}")
    if "expr" in obj and "op" in obj:
        raise where.error("give either 'expr' (generic) or 'op' (named), not both")
    if "expr" not in obj and "op" not in obj:
        raise where.error("missing field 'expr' or 'op'")
    if "op" in obj and not isinstance(obj["op"], str):
        raise where.at("op").error(f"expected an op name (string), got {short(obj['op'])}")
    name = obj.get("name", obj.get("op", default_name) if "op" in obj else default_name)
    problem = check_name(name, "op")
    if problem:
        raise where.at("name").error(problem)
    assert isinstance(name, str)   # check_name accepts strings only
    dtype = obj.get("dtype", "float32")
    dtypes = obj.get("dtypes", {})
    if not isinstance(dtypes, dict):
        raise where.at("dtypes").error(f"expected an object of tensor: dtype, got {short(dtypes)}")
    if "op" in obj:
        exp = expand(obj, where)
        expr = build_expr(name, exp.text, exp.shapes, dtype=dtype, dtypes=dtypes, pad_value=exp.pad_value,
                          kind=obj["op"], extents=exp.extents, where=where,
                          params={k: v for k, v in obj.items() if k not in ("name", "op", "comment")})
        return expr
    for key in obj:
        if key not in _GENERIC_FIELDS:
            hint = difflib.get_close_matches(key, sorted(_GENERIC_FIELDS), n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise where.at(key).error(f"unknown field{extra}; expected one of {', '.join(sorted(_GENERIC_FIELDS))}")
    text = obj["expr"]
    if not isinstance(text, str) or not text.strip():
        raise where.at("expr").error(f"expected an expression string, got {short(text)}")
    shapes = obj.get("shapes", {})
    if not isinstance(shapes, dict):
        raise where.at("shapes").error(f"expected an object of tensor: shape, got {short(shapes)}")
    extents = obj.get("extents", {})
    if not isinstance(extents, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                for v in extents.values()):
        raise where.at("extents").error(f"expected an object of axis: positive integer, got {short(extents)}")
    pad = _pad_value(obj.get("pad_value", 0), where.at("pad_value"))
    return build_expr(name, text, shapes, dtype=dtype, dtypes=dtypes, pad_value=pad, extents=extents,
                      where=where)


def _pad_value(v: Any, where: Where) -> float:
    if isinstance(v, str) and v in ("-inf", "inf"):
        return float(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        # The kernels hold the pad value in float32: a larger one would become infinity there but stay finite in
        # the reference.
        if abs(v) <= FLOAT32_MAX:  # False for NaN and infinities too
            return float(v)
        raise where.error(f"expected a number within float32's range (at most {FLOAT32_MAX:.8g} in magnitude), "
                          f"\"-inf\" or \"inf\", got {short(v)}")
    raise where.error(f"expected a number, \"-inf\" or \"inf\", got {short(v)}")
