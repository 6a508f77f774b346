"""Reading op.json: one op object or ``{"ops": [...]}``, generic (``expr``) or named (``op``); an op with
symbolic sizes is ``roller.ir.symbolic``'s, and is refused here in words."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from roller.errors import InputError
from roller.ir.build import Where, short
from roller.ir.opdoc import MAX_FILE_BYTES, MAX_OPS, parse_op, read_json
from roller.ir.symbolic import SymbolicOp, parse_symbolic
from roller.ir.tensor_expr import TensorExpr

OpLike = str | os.PathLike | dict | TensorExpr


def load_ops(src: OpLike) -> list[TensorExpr]:
    """Every op of a file, a dict (one op or ``{"ops": [...]}``) or an already parsed TensorExpr."""
    if isinstance(src, TensorExpr):
        return [src]
    if isinstance(src, dict):
        return parse_ops(src, None)
    return parse_ops(*read_op_file(src))


def read_op_file(src: str | os.PathLike) -> tuple[Any, str]:
    """(the JSON document, the path for messages) of an op file, read once; one-line InputErrors for a file
    that is missing, unreadable, too large or not JSON an op file may hold."""
    path = Path(src)
    if path.exists() and not path.is_file() and not path.is_dir():   # a FIFO would block the read forever
        raise InputError("not a regular file", source=str(src))
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
    return read_json(text, str(src)), str(src)


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
    if not isinstance(item, dict):
        return
    op = parse_symbolic(item, where.source)
    if op is not None:
        raise symbolic_refused(op, where)


def symbolic_refused(op: SymbolicOp, where: Where | None = None) -> InputError:
    """The error for an op with symbolic sizes where only ops at fixed sizes are taken."""
    where = where or Where(op.source, "")
    return where.error(f"op {op.name!r} has symbolic sizes ({', '.join(op.symbols)}): roller build and "
                       "roller.compile build it for every size (one op to a file); here, write a number in place of "
                       "each")
