"""Reading op.json: one op object or ``{"ops": [...]}``, generic (``expr``) or named (``op``)."""
from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

from roller.errors import InputError
from roller.ir.build import Where, build_expr
from roller.ir.named import expand
from roller.ir.names import check_identifier
from roller.ir.tensor_expr import TensorExpr

_GENERIC_FIELDS = {"name", "expr", "shapes", "dtype", "dtypes", "pad_value", "extents", "comment"}

OpLike = str | os.PathLike | dict | TensorExpr


def load_ops(src: OpLike) -> list[TensorExpr]:
    """Every op of a file, a dict (one op or ``{"ops": [...]}``) or an already parsed TensorExpr."""
    if isinstance(src, TensorExpr):
        return [src]
    if isinstance(src, dict):
        return parse_ops(src, None)
    path = Path(src)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError("no such op file", source=str(src)) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read op file: {err.__class__.__name__}", source=str(src)) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"invalid JSON: {err.msg} (column {err.colno})", source=str(src), line=err.lineno) from None
    return parse_ops(doc, str(src))


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
            raise root.at("ops").error(f"expected a non-empty list of ops, got {items!r}")
        wheres = [Where(source, f"ops[{i}]") for i in range(len(items))]
    elif isinstance(doc, dict):
        items, wheres = [doc], [root]
    else:
        raise root.error(f"expected an op object or {{\"ops\": [...]}}, got {type(doc).__name__}")
    ops: list[TensorExpr] = []
    seen: dict[str, str] = {}
    for i, (item, where) in enumerate(zip(items, wheres)):
        op = parse_op(item, where, default_name=f"op{i}" if len(items) > 1 else "op")
        if op.name in seen:
            raise where.at("name").error(f"duplicate op name {op.name!r} (also {seen[op.name]})")
        seen[op.name] = where.field or "the op"
        ops.append(op)
    return ops


def parse_op(obj: Any, where: Where, default_name: str = "op") -> TensorExpr:
    if not isinstance(obj, dict):
        raise where.error(f"expected an op object, got {type(obj).__name__}")
    if "expr" in obj and "op" in obj:
        raise where.error("give either 'expr' (generic) or 'op' (named), not both")
    if "expr" not in obj and "op" not in obj:
        raise where.error("missing field 'expr' or 'op'")
    name = obj.get("name", obj.get("op", default_name) if "op" in obj else default_name)
    problem = check_identifier(name)
    if problem:
        raise where.at("name").error(problem)
    dtype = obj.get("dtype", "float32")
    dtypes = obj.get("dtypes", {})
    if not isinstance(dtypes, dict):
        raise where.at("dtypes").error(f"expected an object of tensor: dtype, got {dtypes!r}")
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
        raise where.at("expr").error(f"expected an expression string, got {text!r}")
    shapes = obj.get("shapes", {})
    if not isinstance(shapes, dict):
        raise where.at("shapes").error(f"expected an object of tensor: shape, got {shapes!r}")
    extents = obj.get("extents", {})
    if not isinstance(extents, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                for v in extents.values()):
        raise where.at("extents").error(f"expected an object of axis: positive integer, got {extents!r}")
    pad = _pad_value(obj.get("pad_value", 0), where.at("pad_value"))
    return build_expr(name, text, shapes, dtype=dtype, dtypes=dtypes, pad_value=pad, extents=extents,
                      where=where)


def _pad_value(v: Any, where: Where) -> float:
    if v in ("-inf", "inf"):
        return float(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise where.error(f"expected a number, \"-inf\" or \"inf\", got {v!r}")
