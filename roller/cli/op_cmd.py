"""``roller op``: show and check op files (op.json).

``roller op show FILE [--op NAME] [--format text|json]`` prints what the IR made of each op: the expression,
axes, tensors, FLOPs, compulsory bytes, arithmetic intensity, and the prepared form construction works on
(implicit GEMM of a convolution, fused axes) when it differs. ``roller op check FILE...`` parses every op of
every file and stops at the first bad one with its one-line error (exit 2).
"""
from __future__ import annotations

import argparse
import difflib
import json
import sys
from typing import Any

from roller.errors import InputError
from roller.ir import TensorDecl, TensorExpr, load_ops
from roller.ir.fuse import prepare


def register(sub: Any) -> None:
    parser = sub.add_parser("op", help="show and check op files (op.json)",
                            description="Operator files: one op object or {\"ops\": [...]}, generic or named.")
    osub = parser.add_subparsers(dest="op_command", metavar="ACTION", parser_class=type(parser))
    parser.set_defaults(func=lambda args: _help(parser))

    p = osub.add_parser("show", help="print the parsed ops: expression, axes, tensors, FLOPs, bytes, "
                                     "prepared form")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--op", dest="op_name", metavar="NAME", default=None, help="show only the op with this name")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    p.set_defaults(func=cmd_show)

    p = osub.add_parser("check", help="parse every op of every file; exit 2 at the first bad one")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=cmd_check)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


# -- description of one op ------------------------------------------------------------------------------------

def _tensor_doc(t: TensorDecl, role: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": t.name, "role": role, "shape": list(t.shape), "dtype": t.dtype}
    if tuple(t.storage_shape) != tuple(t.shape):
        doc["storage_shape"] = list(t.storage_shape)
    if t.view is not None:
        doc["view"] = "reshape" if t.view.is_reshape() else ("scatter" if role == "output" else "gather")
    elif t.orig_shape is not None and tuple(t.orig_shape) != tuple(t.shape):
        doc["view"] = "reshape"
    return doc


def _expr_doc(e: TensorExpr) -> dict[str, Any]:
    return {
        "expr": e.statement(),
        "axes": [{"name": a.name, "extent": a.extent, "kind": "reduction" if a.reduce else "spatial"}
                 for a in e.axes],
        "tensors": [_tensor_doc(t, "input") for t in e.inputs] + [_tensor_doc(e.output, "output")],
    }


def _pad_doc(v: float) -> Any:
    if v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return int(v) if float(v).is_integer() else v


def _prepared_label(e: TensorExpr, p: TensorExpr) -> str:
    if any(t.view is not None and not t.view.is_reshape() for t in p.tensors):
        return "implicit GEMM"
    return "fused axes"


def describe(e: TensorExpr) -> dict[str, Any]:
    """Everything ``op show`` prints about one op, as plain data."""
    doc: dict[str, Any] = {"name": e.name, "kind": e.kind}
    doc.update(_expr_doc(e))
    doc.update({
        "reduce": e.reduce_op,
        "pad_value": _pad_doc(e.pad_value),
        "flops": e.flops,
        "bytes": e.bytes,
        "intensity": round(e.flops / e.bytes, 4) if e.bytes else None,
        "content_hash": e.content_hash(),
    })
    p = prepare(e)
    if p is not e and (p.statement() != e.statement() or p.axes != e.axes):
        prepared = {"form": _prepared_label(e, p)}
        prepared.update(_expr_doc(p))
        doc["prepared"] = prepared
    return doc


def _fmt_count(n: int, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n} ({n / scale:.3g} {prefix}{unit})"
    return f"{n} ({unit})" if unit else str(n)


def _axes_text(axes: list[dict[str, Any]]) -> str:
    spatial = " ".join(f"{a['name']}={a['extent']}" for a in axes if a["kind"] == "spatial")
    red = " ".join(f"{a['name']}={a['extent']}" for a in axes if a["kind"] == "reduction")
    text = f"spatial {spatial}" if spatial else "spatial (none)"
    return text + (f" | reduction {red}" if red else "")


def _tensor_lines(tensors: list[dict[str, Any]], indent: str) -> list[str]:
    width = max(len(t["name"]) for t in tensors)
    lines = []
    for t in tensors:
        shape = "[" + ",".join(str(d) for d in t["shape"]) + "]"
        line = f"{indent}{t['name'].ljust(width)}  {t['role']:<6}  {shape}  {t['dtype']}"
        if "view" in t:
            src = "[" + ",".join(str(d) for d in t.get("storage_shape", t["shape"])) + "]"
            line += f"  ({t['view']} of {src})"
        lines.append(line)
    return lines


def format_text(doc: dict[str, Any]) -> str:
    lines = [f"op {doc['name']} ({doc['kind']})",
             f"  {doc['expr']}",
             f"  axes:      {_axes_text(doc['axes'])}",
             "  tensors:"]
    lines += _tensor_lines(doc["tensors"], "    ")
    lines.append(f"  flops:     {_fmt_count(doc['flops'], 'FLOP')}")
    lines.append(f"  bytes:     {_fmt_count(doc['bytes'], 'B')} (compulsory: every input and the output once)")
    if doc["intensity"] is not None:
        lines.append(f"  intensity: {doc['intensity']:.4g} FLOP/B")
    if doc["pad_value"] != 0:
        lines.append(f"  pad_value: {doc['pad_value']}")
    lines.append(f"  hash:      {doc['content_hash']}")
    prep = doc.get("prepared")
    if prep:
        lines.append(f"  prepared ({prep['form']}):")
        lines.append(f"    {prep['expr']}")
        lines.append(f"    axes:    {_axes_text(prep['axes'])}")
        lines.append("    tensors:")
        lines += _tensor_lines(prep["tensors"], "      ")
    return "\n".join(lines)


# -- subcommands ----------------------------------------------------------------------------------------------

def cmd_show(args: argparse.Namespace) -> int:
    ops = load_ops(args.file)
    if args.op_name is not None:
        names = [e.name for e in ops]
        chosen = [e for e in ops if e.name == args.op_name]
        if not chosen:
            hint = difflib.get_close_matches(args.op_name, names, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise InputError(f"no op named {args.op_name!r}{extra}; the file has {', '.join(names)}",
                             source=args.file, field="--op")
        ops = chosen
    docs = [describe(e) for e in ops]
    if args.format == "json":
        print(json.dumps({"file": args.file, "ops": docs}, indent=2))
    else:
        print("\n\n".join(format_text(d) for d in docs))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    for path in args.files:
        ops = load_ops(path)  # InputError propagates: the CLI prints it and exits 2
        print(f"{path}: {len(ops)} op{'s' if len(ops) != 1 else ''} OK")
    return 0
