"""One op object of an op file, and the JSON text op files are read from: what both the ordinary loader
(``roller.ir.opfile``) and the symbolic one (``roller.ir.symbolic``) parse with."""
from __future__ import annotations

import difflib
import json
from typing import Any

from roller.errors import InputError
from roller.ir.build import FLOAT32_MAX, Where, build_expr, short
from roller.ir.identifiers import check_name
from roller.ir.named import expand
from roller.ir.tensor_expr import TensorExpr

_GENERIC_FIELDS = {"name", "expr", "shapes", "dtype", "dtypes", "pad_value", "extents", "comment"}

# Bounds on what an op file may hold, so that a hostile file fails in one line instead of exhausting memory, time
# or the interpreter's stack. Far above any real op: roller119.json is 40 KB, 119 ops, nested 4 deep.
MAX_FILE_BYTES = 8 * 2**20
MAX_OPS = 10_000
MAX_JSON_DEPTH = 32
MAX_INT_DIGITS = 40


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
