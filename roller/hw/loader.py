"""Read and check hardware descriptions (YAML) with file:line and key-path error messages.

Every problem becomes one ``InputError`` line (exit code 2) such as
``hwdesc/x.yaml:14 memory[1].banks: expected a positive integer, got 0``. The checks here are the authority;
``schema.json`` mirrors them for editors. See docs/hwdesc.md for the schema.
"""
from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from roller.errors import InputError
from roller.hw.desc import (
    DTYPES,
    SCOPES,
    Calibration,
    ComputePeak,
    DtypeCompute,
    FrozenDict,
    HardwareDesc,
    MatrixInstruction,
    MemoryLayer,
    Parallelism,
    TileThroughput,
)
from roller.hw.rules import backend_rules

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "hwdesc"
OVERRIDE = "--set"   # marks a key path whose value came from a --set override


TOP_KEYS = ("extends", "name", "vendor", "backend", "target", "notes", "memory", "parallelism", "compute",
            "matrix_instructions", "calibration")
TOP_REQUIRED = ("name", "vendor", "backend", "target", "memory", "parallelism", "compute")
LAYER_KEYS = ("name", "scope", "capacity_bytes", "capacity_per_unit_bytes", "capacity_per_block_bytes",
              "capacity_per_thread_bytes", "bandwidth_gbps", "transaction_bytes", "line_bytes", "banks",
              "bank_width_bytes", "streaming_stores", "alias_bytes", "vector_bytes", "latency_ns",
              "capacity_per_block_optin_bytes", "max_stages")
# scope -> (required capacity/bank keys, optional ones); everything else of LAYER_KEYS' capacity/bank keys
# is not used by that scope and is an error.
SCOPE_KEYS = {
    "device": (("capacity_bytes",), ("banks", "bank_width_bytes", "streaming_stores", "vector_bytes",
                                     "latency_ns")),
    "cache": (("capacity_bytes",), ("capacity_per_unit_bytes", "banks", "bank_width_bytes", "alias_bytes")),
    "block": (("capacity_per_unit_bytes", "capacity_per_block_bytes", "banks", "bank_width_bytes"),
              ("capacity_per_block_optin_bytes", "max_stages", "vector_bytes")),
    "thread": (("capacity_per_unit_bytes", "capacity_per_thread_bytes"), ("banks", "bank_width_bytes")),
}
SCOPED_KEYS = ("capacity_bytes", "capacity_per_unit_bytes", "capacity_per_block_bytes",
               "capacity_per_thread_bytes", "banks", "bank_width_bytes", "streaming_stores", "alias_bytes",
               "vector_bytes", "latency_ns", "capacity_per_block_optin_bytes", "max_stages")
# The key that holds what one consumer of the layer can use, compared between neighbouring layers.
CONSUMER_CAPACITY = {"device": "capacity_bytes", "cache": "capacity_bytes",
                     "block": "capacity_per_block_bytes", "thread": "capacity_per_thread_bytes"}
PAR_KEYS = ("compute_units", "sub_partitions", "warp_size", "max_threads_per_block", "max_threads_per_unit",
            "max_blocks_per_unit", "registers_per_unit", "max_registers_per_thread", "register_tile_budget",
            "hardware_threads_per_unit", "max_split_k")
PAR_REQUIRED = PAR_KEYS[:-2]
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")

# Plausible ranges of the physical quantities, by key: (lowest, highest, unit). Wide enough for any device from a
# microcontroller to a future wafer, narrow enough that the model's arithmetic (products of bandwidths, unit
# counts and times) stays finite and non-zero.
_DEFAULT_RANGE: tuple[float, float, str] = (1, 2**30, "")
PLAUSIBLE: dict[str, tuple[float, float, str]] = {
    "peak": (1e-3, 1e8, " GB/s"), "effective": (1e-3, 1e8, " GB/s"),
    "peak_tflops": (1e-6, 1e6, " TFLOP/s"), "effective_tflops": (1e-6, 1e6, " TFLOP/s"),
    "launch_us": (1e-3, 1e7, " us"), "per_block_us": (1e-6, 1e7, " us"), "join_us": (1e-6, 1e7, " us"),
    "gflops": (1e-6, 1e9, " GFLOP/s"),
    "capacity_bytes": (1, 2**50, " bytes"), "capacity_per_unit_bytes": (1, 2**40, " bytes"),
    "capacity_per_block_bytes": (1, 2**40, " bytes"), "capacity_per_thread_bytes": (1, 2**20, " bytes"),
    "capacity_per_block_optin_bytes": (1, 2**40, " bytes"), "latency_ns": (1e-3, 1e7, " ns"),
    "max_stages": (1, 16, ""),
    "transaction_bytes": (1, 2**20, " bytes"), "line_bytes": (1, 2**20, " bytes"), "banks": (1, 2**16, ""),
    "bank_width_bytes": (1, 2**10, " bytes"), "vector_bytes": (1, 256, " bytes"),
    "compute_units": (1, 2**24, ""), "sub_partitions": (1, 2**10, ""), "warp_size": (1, 2**12, ""),
    "max_threads_per_block": (1, 2**20, ""), "max_threads_per_unit": (1, 2**24, ""),
    "max_blocks_per_unit": (1, 2**20, ""), "registers_per_unit": (1, 2**30, ""),
    "max_registers_per_thread": (1, 2**20, ""), "register_tile_budget": (1, 2**20, ""),
    "hardware_threads_per_unit": (1, 2**20, ""), "max_split_k": (1, 1024, ""), "rows": (1, 2**16, ""), "cols": (1, 2**16, ""),
}

_UNITS = {"": 1, "B": 1,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGTkmgt]i?B|B)?\s*")


# --------------------------------------------------------------------------------------------------------
# small helpers

def parse_size(value: Any) -> int | None:
    """``96KiB`` -> 98304, ``48KB`` -> 48000 (SI), ``1024`` -> 1024; None if it is not a size."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if not isinstance(value, str):
        return None
    m = _SIZE_RE.fullmatch(value)
    if not m:
        return None
    unit = (m.group(2) or "").upper()
    number = float(m.group(1)) * _UNITS[unit]
    return int(number) if number.is_integer() else None


def format_size(n: int | None) -> str:
    """98304 -> '96KiB'; sizes that are not a whole number of KiB stay plain integers."""
    if n is None:
        return "null"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def format_path(path: Iterable[Any]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def show(value: Any) -> str:
    """A value as error messages print it after 'got'."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        if len(value) <= 8 and all(isinstance(v, (int, float, str)) and not isinstance(v, bool)
                                   for v in value):
            return "[" + ", ".join(str(v) for v in value) + "]"
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _suggest(key: str, choices: Iterable[str]) -> str:
    choices = list(choices)
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
    if close:
        return f"unknown key; did you mean {close[0]!r}?"
    return "unknown key; expected one of: " + ", ".join(choices)


_PATH_TOKEN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def parse_key_path(text: str) -> tuple:
    """``memory[1].banks`` -> ("memory", 1, "banks"); raises InputError when malformed."""
    parts: list[Any] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        if parts and not text.startswith("[", pos):
            if not text.startswith(".", pos):
                break
            pos += 1
        m = _PATH_TOKEN.match(text, pos)
        if not m or (not parts and m.group(2) is not None):
            break
        parts.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
        pos = m.end()
    else:
        if parts:
            return tuple(parts)
    raise InputError(f"expected a key path like memory[1].banks, got {text!r}", source=OVERRIDE)


def parse_overrides(items: Iterable[str] | None) -> dict[str, str]:
    """``["parallelism.warp_size=64", ...]`` (from repeated --set) -> {"parallelism.warp_size": "64"}."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"expected KEY=VALUE (e.g. parallelism.warp_size=64), got {item!r}",
                             source=OVERRIDE)
        out[key.strip()] = value.strip()
    return out


# --------------------------------------------------------------------------------------------------------
# YAML -> plain data + line of every key path

class _Doc:
    """Where each key path of a description came from: a line of this file (int), of a file it extends
    ((file, line)), or a --set override (OVERRIDE)."""

    def __init__(self, display: str) -> None:
        self.display = display
        self.lines: dict[tuple, Any] = {}

    def where(self, path: tuple) -> tuple[str, int | None]:
        p = tuple(path)
        while True:
            mark = self.lines.get(p)
            if mark == OVERRIDE:
                return OVERRIDE, None
            if isinstance(mark, tuple):
                return mark
            if mark is not None:
                return self.display, mark
            if not p:
                return self.display, None
            p = p[:-1]

    def fail(self, path: tuple, message: str) -> InputError:
        source, line = self.where(path)
        return InputError(message, source=source, line=line, field=format_path(path) or None)


# Bounds on a description's YAML, checked before anything is built from it: a description is a few kilobytes
# of a few hundred values nested 4 deep, while a few hundred bytes of aliases can expand to gigabytes and
# deep nesting exhausts the recursive composer's stack.
MAX_YAML_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_YAML_VALUES = 100_000  # values after expanding aliases


def _prescan(text: str, display: str) -> None:
    """Check size and nesting on the parser's event stream (no recursion, no expansion)."""
    if len(text) > MAX_YAML_BYTES:
        raise InputError(f"description is larger than {MAX_YAML_BYTES // 1024} KiB, the most one may be",
                         source=display)
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise InputError(f"invalid YAML: nested more than {MAX_YAML_DEPTH} levels deep",
                                     source=display,
                                     line=event.start_mark.line + 1 if event.start_mark is not None else None)
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError:
        return  # reported with its line by the composer


def _compose(text: str, doc: _Doc) -> Any:
    _prescan(text, doc.display)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        problem = err.problem or err.context or "malformed"
        raise InputError(f"invalid YAML: {problem}", source=doc.display,
                         line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as err:
        raise InputError(f"invalid YAML: {err}", source=doc.display) from None
    if node is None:
        raise InputError("empty file, expected a hardware description mapping", source=doc.display)
    constructor = yaml.SafeLoader("")
    doc.lines[()] = node.start_mark.line + 1
    _check_expansion(node, doc.display)
    return _to_data(node, (), doc, constructor, set())


def _check_expansion(root: Any, display: str) -> None:
    """Reject a document whose aliases (and merge keys) would expand to more than MAX_YAML_VALUES values, or
    refer to themselves. Aliases share nodes in the composed graph, so the expanded size is a sum over that
    graph computed once per node, depth first without recursion: a few hundred bytes of aliases of aliases
    cost nothing here, where expanding them would take gigabytes."""
    size: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    open_nodes: set[int] = set()  # expanded, not finished: the current path
    while stack:
        node, finished = stack.pop()
        children = [n for pair in node.value for n in pair] if isinstance(node, MappingNode) else \
            list(node.value) if isinstance(node, SequenceNode) else []
        if finished:
            open_nodes.discard(id(node))
            size[id(node)] = 1 + sum(size[id(c)] for c in children)
            if size[id(node)] > MAX_YAML_VALUES:
                raise InputError(f"invalid YAML: expands to more than {MAX_YAML_VALUES} values (aliases of "
                                 "aliases?)", source=display, line=node.start_mark.line + 1)
            continue
        if id(node) in size:
            continue
        if id(node) in open_nodes:
            raise InputError("invalid YAML: recursive alias", source=display, line=node.start_mark.line + 1)
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)


_PLAIN_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


def _to_data(node: Any, path: tuple, doc: _Doc, constructor: yaml.SafeLoader, active: set) -> Any:
    line = node.start_mark.line + 1
    if id(node) in active:
        raise InputError("invalid YAML: recursive alias", source=doc.display, line=line)
    if len(path) > MAX_YAML_DEPTH:  # merge keys and aliases can nest deeper than the text does
        raise InputError(f"invalid YAML: nested more than {MAX_YAML_DEPTH} levels deep", source=doc.display,
                         line=line)
    if isinstance(node, (MappingNode, SequenceNode)) and node.tag not in _PLAIN_TAGS:
        # A tag on a mapping or list (!!python/object/apply:..., !!set, !!omap) would otherwise be dropped
        # silently here; a description holds plain mappings and lists only.
        raise InputError(f"invalid YAML: tag {node.tag} is not allowed in a description", source=doc.display,
                         line=line, field=format_path(path) or None)
    try:
        if isinstance(node, MappingNode):
            active.add(id(node))
            constructor.flatten_mapping(node)
            out: dict[str, Any] = {}
            for knode, vnode in node.value:
                kline = knode.start_mark.line + 1
                if not isinstance(knode, ScalarNode):
                    raise InputError("expected a plain key, got a " +
                                     ("mapping" if isinstance(knode, MappingNode) else "list"),
                                     source=doc.display, line=kline, field=format_path(path) or None)
                key = knode.value
                sub = path + (key,)
                if key in out:
                    raise InputError("duplicate key", source=doc.display, line=kline, field=format_path(sub))
                doc.lines[sub] = kline
                out[key] = _to_data(vnode, sub, doc, constructor, active)
            active.discard(id(node))
            return out
        if isinstance(node, SequenceNode):
            active.add(id(node))
            items = []
            for i, item in enumerate(node.value):
                doc.lines[path + (i,)] = item.start_mark.line + 1
                items.append(_to_data(item, path + (i,), doc, constructor, active))
            active.discard(id(node))
            return items
        return constructor.construct_object(node)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        raise InputError(f"invalid YAML: {err.problem or err.context}", source=doc.display,
                         line=mark.line + 1 if mark else line) from None


# --------------------------------------------------------------------------------------------------------
# extends: a description as another one with some values changed

#: how many descriptions one may stack with ``extends`` (a chain longer than this is a mistake, or a loop)
MAX_EXTENDS = 8


def _extend(data: Any, doc: _Doc, base_dir: Path, chain: tuple[str, ...],
            local: Mapping[str, Callable[[], Path]] | None = None) -> Any:
    """``data`` merged over the description its ``extends`` names (resolved as a bundled name, or a path
    relative to ``base_dir``, or one of ``local``'s names): mappings merge key by key, lists of named entries (memory layers, matrix
    instructions) entry by entry by name, anything else is replaced. ``doc.lines`` then says, for every
    key path, which file and line its value came from."""
    if not isinstance(data, dict) or "extends" not in data:
        return data
    ref = data["extends"]
    if not isinstance(ref, str) or not ref.strip():
        raise doc.fail(("extends",), f"expected the name or path of a description, got {show(ref)}")
    if len(chain) >= MAX_EXTENDS:
        raise doc.fail(("extends",), f"expected at most {MAX_EXTENDS} descriptions extending one another, got "
                                     f"{' -> '.join(chain)}")
    near = base_dir / ref
    path, display = (near, _display(near)) if near.is_file() else _resolve_or_fail(ref, doc, local)
    key = str(path.resolve())
    if key in chain:
        raise doc.fail(("extends",), f"expected no loop of extends, got {' -> '.join((*chain, key))}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise doc.fail(("extends",), f"cannot read {display}: {err}") from None
    base_doc = _Doc(display)
    base = _extend(_compose(text, base_doc), base_doc, path.parent, (*chain, key), local)
    if not isinstance(base, dict):
        raise doc.fail(("extends",), f"{display} is not a description mapping")
    if "name" not in data:
        raise doc.fail((), "missing key 'name' (a description that extends another needs a name of its own)")
    merged_lines: dict[tuple, Any] = {(): doc.lines.get(())}
    own = {k: v for k, v in data.items() if k != "extends"}
    merged = _merge(base, (), base_doc, own, (), doc, (), merged_lines)
    doc.lines = merged_lines
    return merged


def _resolve_or_fail(ref: str, doc: _Doc, local: Mapping[str, Callable[[], Path]] | None) -> tuple[Path, str]:
    try:
        return resolve(ref, local)
    except InputError as err:
        raise doc.fail(("extends",), err.bare) from None


def _copy_lines(src: _Doc, src_path: tuple, dst_path: tuple, out: dict[tuple, Any]) -> None:
    for p, mark in src.lines.items():
        if p[:len(src_path)] == src_path:
            out[dst_path + p[len(src_path):]] = mark if isinstance(mark, tuple) or mark == OVERRIDE \
                else (src.display, mark)


def _named(items: Any) -> bool:
    return isinstance(items, list) and all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items)


def _merge(base: Any, bpath: tuple, bdoc: _Doc, over: Any, opath: tuple, odoc: _Doc, dst: tuple,
           lines: dict[tuple, Any]) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out: dict[str, Any] = {}
        for k in list(base) + [k for k in over if k not in base]:
            if k in over and k in base:
                lines[dst + (k,)] = (odoc.display, odoc.lines.get(opath + (k,)))
                out[k] = _merge(base[k], bpath + (k,), bdoc, over[k], opath + (k,), odoc, dst + (k,), lines)
            elif k in over:
                _copy_lines(odoc, opath + (k,), dst + (k,), lines)
                out[k] = over[k]
            else:
                _copy_lines(bdoc, bpath + (k,), dst + (k,), lines)
                out[k] = base[k]
        return out
    if _named(base) and _named(over):
        index = {item["name"]: i for i, item in enumerate(base)}
        result: list[Any] = []
        taken: dict[int, int] = {}   # base index -> over index
        for j, item in enumerate(over):
            if item["name"] in index:
                taken[index[item["name"]]] = j
        for i, item in enumerate(base):
            d = dst + (len(result),)
            if i in taken:
                j = taken[i]
                lines[d] = (odoc.display, odoc.lines.get(opath + (j,)))
                result.append(_merge(item, bpath + (i,), bdoc, over[j], opath + (j,), odoc, d, lines))
            else:
                _copy_lines(bdoc, bpath + (i,), d, lines)
                result.append(item)
        for j, item in enumerate(over):
            if j not in taken.values():
                _copy_lines(odoc, opath + (j,), dst + (len(result),), lines)
                result.append(item)
        return result
    _copy_lines(odoc, opath, dst, lines)
    return over


def _apply_overrides(data: Any, overrides: Mapping[str, Any], doc: _Doc) -> None:
    for key, raw in overrides.items():
        path = parse_key_path(key)
        if isinstance(raw, str):
            _prescan(raw, OVERRIDE)
            try:
                value = yaml.safe_load(raw) if raw.strip() else None
            except yaml.YAMLError:
                raise InputError(f"expected a YAML value, got {raw!r}", source=OVERRIDE,
                                 field=format_path(path)) from None
        else:
            value = raw
        parent = data
        for i, part in enumerate(path[:-1]):
            here = format_path(path[: i + 1])
            if isinstance(part, int):
                if not isinstance(parent, list) or part >= len(parent):
                    size = len(parent) if isinstance(parent, list) else 0
                    raise InputError(f"no such entry in {doc.display} ({size} entries)", source=OVERRIDE,
                                     field=here)
                parent = parent[part]
            else:
                if not isinstance(parent, dict) or part not in parent:
                    raise InputError(f"no such key in {doc.display}", source=OVERRIDE, field=here)
                parent = parent[part]
        last = path[-1]
        if isinstance(last, int):
            if not isinstance(parent, list) or last >= len(parent):
                size = len(parent) if isinstance(parent, list) else 0
                raise InputError(f"no such entry in {doc.display} ({size} entries)", source=OVERRIDE,
                                 field=format_path(path))
        elif not isinstance(parent, dict):
            raise InputError(f"{format_path(path[:-1]) or 'the top level'} is not a mapping in {doc.display}",
                             source=OVERRIDE, field=format_path(path))
        parent[last] = value
        for p in [p for p in doc.lines if p[: len(path)] == path]:
            del doc.lines[p]
        doc.lines[path] = OVERRIDE


# --------------------------------------------------------------------------------------------------------
# checks

class _Checker:
    def __init__(self, doc: _Doc) -> None:
        self.doc = doc

    def fail(self, path: tuple, message: str) -> InputError:
        return self.doc.fail(path, message)

    def mapping(self, value: Any, path: tuple, allowed: Iterable[str], required: Iterable[str]) -> dict:
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping, got {show(value)}")
        allowed = list(allowed)
        for key in value:
            if key not in allowed:
                raise self.fail(path + (key,), _suggest(key, allowed))
        for key in required:
            if key not in value:
                raise self.fail(path, f"missing key {key!r}")
        return value

    def string(self, value: Any, path: tuple, pattern: re.Pattern | None = None, what: str = "") -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(path, f"expected a non-empty string, got {show(value)}")
        if pattern is not None and not pattern.fullmatch(value):
            raise self.fail(path, f"expected {what}, got {show(value)}")
        return value

    def choice(self, value: Any, path: tuple, choices: Iterable[str]) -> str:
        choices = list(choices)
        if value not in choices:
            raise self.fail(path, f"expected one of {', '.join(choices)}, got {show(value)}")
        return value

    def pos_int(self, value: Any, path: tuple) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(path, f"expected a positive integer, got {show(value)}")
        return self.plausible(value, path)

    def plausible(self, value: Any, path: tuple) -> Any:
        """``value`` if it lies in the plausible range of its quantity (PLAUSIBLE, by key); values far outside
        any device overflow or underflow the model's arithmetic (1e308 GB/s, 1e-300 TFLOP/s)."""
        lo, hi, unit = PLAUSIBLE.get(str(path[-1]), _DEFAULT_RANGE)
        if not lo <= value <= hi:
            raise self.fail(path, f"expected {_num(lo)} to {_num(hi)}{unit} (a plausible value for any device), "
                                  f"got {show(value)}")
        return value

    def pow2(self, value: Any, path: tuple) -> int:
        n = self.pos_int(value, path)
        if n & (n - 1):
            raise self.fail(path, f"expected a power of two, got {n}")
        return n

    def size(self, value: Any, path: tuple) -> int:
        n = parse_size(value)
        if n is None or n <= 0:
            raise self.fail(path, f"expected a positive size in bytes (an integer or e.g. 96KiB), got {show(value)}")
        return self.plausible(n, path)

    def number(self, value: Any, path: tuple) -> float:
        if isinstance(value, str) and re.fullmatch(r"[+]?\d+(\.\d*)?[eE][-+]?\d+", value.strip()):
            value = float(value)   # YAML 1.1 reads 1e3 as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value <= 0:
            raise self.fail(path, f"expected a positive number, got {show(value)}")
        return float(self.plausible(value, path))

    # -- sections ----------------------------------------------------------------------------------------
    def top(self, data: Any) -> HardwareDesc:
        if not isinstance(data, dict):
            raise InputError(f"expected a mapping at the top level, got {show(data)}", source=self.doc.display,
                             line=self.doc.lines.get(()))
        self.mapping(data, (), TOP_KEYS, TOP_REQUIRED)
        name = self.string(data["name"], ("name",), NAME_RE, "a name of letters, digits, '-', '_' or '.'")
        vendor = self.string(data["vendor"], ("vendor",))
        # The backends declare which descriptions they serve and what their targets look like (roller.hw.rules).
        rules = backend_rules()
        backend = self.choice(data["backend"], ("backend",), tuple(sorted(rules)))
        target = self.string(data["target"], ("target",))
        if not rules[backend].matches_target(target):
            raise self.fail(("target",), f"expected {rules[backend].target_hint} for backend {backend!r}, "
                                         f"got {show(target)}")
        notes = data.get("notes")
        if notes is None:
            notes = ""
        elif not isinstance(notes, str):
            raise self.fail(("notes",), f"expected a string, got {show(notes)}")
        par = self.parallelism(data["parallelism"], backend, rules[backend].required_parallelism)
        memory = self.memory(data["memory"], par)
        compute = self.compute(data["compute"])
        mis = self.matrix_instructions(data.get("matrix_instructions"), compute)
        cal = None if data.get("calibration") is None else self.calibration(data["calibration"])
        return HardwareDesc(name=name, vendor=vendor, backend=backend, target=target, memory=memory,
                            parallelism=par, compute=compute, matrix_instructions=mis, notes=notes.strip(),
                            calibration=cal, source=self.doc.display)

    def calibration(self, value: Any) -> Calibration:
        path: tuple = ("calibration",)
        self.mapping(value, path, ("launch_us", "per_block_us", "join_us", "register_tile_gflops",
                                   "gathered_tile_gflops"), ())
        times = {key: None if value.get(key) is None else self.number(value[key], path + (key,))
                 for key in ("launch_us", "per_block_us", "join_us")}
        return Calibration(launch_us=times["launch_us"], per_block_us=times["per_block_us"],
                           join_us=times["join_us"],
                           register_tiles=self.tile_table(value, path, "register_tile_gflops"),
                           gathered_tiles=self.tile_table(value, path, "gathered_tile_gflops"))

    def tile_table(self, value: dict, path: tuple, key: str) -> tuple[TileThroughput, ...]:
        tiles = value.get(key)
        if tiles is None:
            return ()
        if not isinstance(tiles, list):
            raise self.fail(path + (key,), f"expected a list, got {show(tiles)}")
        seen: dict[tuple[int, int], int] = {}
        out = []
        for i, item in enumerate(tiles):
            ip = path + (key, i)
            self.mapping(item, ip, ("rows", "cols", "gflops"), ("rows", "cols", "gflops"))
            shape = (self.pos_int(item["rows"], ip + ("rows",)), self.pos_int(item["cols"], ip + ("cols",)))
            if shape in seen:
                raise self.fail(ip, f"expected each rows x cols once, got {shape[0]}x{shape[1]} again "
                                    f"(also {key}[{seen[shape]}])")
            seen[shape] = i
            out.append(TileThroughput(*shape, self.number(item["gflops"], ip + ("gflops",))))
        return tuple(out)

    def memory(self, value: Any, par: Parallelism) -> tuple[MemoryLayer, ...]:
        path: tuple = ("memory",)
        if not isinstance(value, list):
            raise self.fail(path, f"expected a list of memory layers (outermost first), got {show(value)}")
        if len(value) < 2:
            raise self.fail(path, f"expected at least 2 layers (outermost first), got {len(value)}")
        layers = [self.layer(item, path + (i,)) for i, item in enumerate(value)]
        # cross-checks between layers
        seen: dict[str, int] = {}
        for i, layer in enumerate(layers):
            lp = path + (i,)
            if layer.name in seen:
                raise self.fail(lp + ("name",), f"expected a name not used by memory[{seen[layer.name]}], "
                                                f"got {show(layer.name)}")
            seen[layer.name] = i
        if layers[0].scope != "device":
            raise self.fail(path + (0, "scope"), f"expected 'device' for the outermost layer, "
                                                 f"got {show(layers[0].scope)}")
        last = len(layers) - 1
        if layers[last].scope != "thread":
            raise self.fail(path + (last, "scope"), f"expected 'thread' for the innermost layer, "
                                                    f"got {show(layers[last].scope)}")
        scopes = [layer.scope for layer in layers]
        if "block" not in scopes and not (len(scopes) >= 3 and scopes[-2] == "cache"):
            # What roller.construction.levels needs to place a block's tile: checked here, so that a description
            # that validates also builds.
            raise self.fail(path, "expected a 'block' layer (shared memory, LDS, local memory, tile SRAM) or a "
                                  "'cache' layer just above the registers, to hold a block's tile")
        for i in range(1, len(layers)):
            outer, inner = layers[i - 1], layers[i]
            if SCOPES.index(inner.scope) < SCOPES.index(outer.scope):
                raise self.fail(path + (i, "scope"), f"expected {outer.scope!r} or a scope inside it "
                                                     f"(layers go outermost first), got {show(inner.scope)}")
            okey, ikey = CONSUMER_CAPACITY[outer.scope], CONSUMER_CAPACITY[inner.scope]
            if inner.capacity >= outer.capacity:
                raise self.fail(path + (i, ikey), f"expected less than memory[{i - 1}].{okey} "
                                                  f"({format_size(outer.capacity)}), "
                                                  f"got {format_size(inner.capacity)}")
        reg = layers[last]
        rp = path + (last,)
        want = 4 * par.registers_per_unit
        if reg.capacity_per_unit_bytes != want:
            raise self.fail(rp + ("capacity_per_unit_bytes",),
                            f"expected 4 x parallelism.registers_per_unit = {format_size(want)}, "
                            f"got {format_size(reg.capacity_per_unit_bytes)}")
        most = 4 * par.max_registers_per_thread
        if (reg.capacity_per_thread_bytes or 0) > most:
            raise self.fail(rp + ("capacity_per_thread_bytes",),
                            f"expected at most 4 x parallelism.max_registers_per_thread = {most}, "
                            f"got {reg.capacity_per_thread_bytes}")
        return tuple(layers)

    def layer(self, value: Any, path: tuple) -> MemoryLayer:
        self.mapping(value, path, LAYER_KEYS, ("name", "scope"))
        name = self.string(value["name"], path + ("name",), IDENT_RE,
                           "an identifier (letters, digits, '_', '-', '.')")
        scope = self.choice(value["scope"], path + ("scope",), SCOPES)
        required, optional = SCOPE_KEYS[scope]
        for key in value:
            if key in SCOPED_KEYS and key not in required and key not in optional:
                raise self.fail(path + (key,), f"not used by {scope!r} layers; remove it")
        for key in LAYER_KEYS:
            if (key in required or key not in SCOPED_KEYS) and key not in value:
                raise self.fail(path, f"missing key {key!r}")
        sizes: dict[str, int | None] = {}
        for key in ("capacity_bytes", "capacity_per_unit_bytes", "capacity_per_block_bytes",
                    "capacity_per_thread_bytes", "capacity_per_block_optin_bytes"):
            v = value.get(key)
            sizes[key] = None if (v is None and key not in required) else self.size(v, path + (key,))
        bw_path = path + ("bandwidth_gbps",)
        bw = self.mapping(value["bandwidth_gbps"], bw_path, ("peak", "effective"), ("peak", "effective"))
        peak = self.number(bw["peak"], bw_path + ("peak",))
        eff = self.number(bw["effective"], bw_path + ("effective",))
        if eff > peak:
            raise self.fail(bw_path + ("effective",), f"expected at most the peak ({_num(peak)}), got {_num(eff)}")
        transaction = self.pow2(value["transaction_bytes"], path + ("transaction_bytes",))
        line = self.pow2(value["line_bytes"], path + ("line_bytes",))
        if line % transaction:
            raise self.fail(path + ("line_bytes",), f"expected a multiple of transaction_bytes ({transaction}), "
                                                    f"got {line}")
        banks = value.get("banks")
        width = value.get("bank_width_bytes")
        banks = None if banks is None and "banks" not in required else self.pos_int(banks, path + ("banks",))
        width = None if width is None and "bank_width_bytes" not in required else \
            self.pow2(width, path + ("bank_width_bytes",))
        if (banks is None) != (width is None):
            missing = "bank_width_bytes" if width is None else "banks"
            raise self.fail(path, f"missing key {missing!r} (banks and bank_width_bytes go together)")
        streaming = value.get("streaming_stores", False)
        if not isinstance(streaming, bool):
            raise self.fail(path + ("streaming_stores",), f"expected true or false, got {show(streaming)}")
        alias = value.get("alias_bytes")
        if alias is not None:
            alias = self.pow2(alias, path + ("alias_bytes",))
            if alias < line:
                raise self.fail(path + ("alias_bytes",), f"expected at least line_bytes ({line}), got {alias}")
        vector = value.get("vector_bytes")
        if vector is not None:
            vector = self.pow2(vector, path + ("vector_bytes",))
        latency = value.get("latency_ns")
        latency = None if latency is None else self.number(latency, path + ("latency_ns",))
        stages = value.get("max_stages", 1)
        stages = self.pos_int(stages, path + ("max_stages",))
        for inner, outer in (("capacity_per_block_bytes", "capacity_per_unit_bytes"),
                             ("capacity_per_thread_bytes", "capacity_per_unit_bytes"),
                             ("capacity_per_block_optin_bytes", "capacity_per_unit_bytes"),
                             ("capacity_per_block_bytes", "capacity_per_block_optin_bytes")):
            small, big = sizes[inner], sizes[outer]
            if small is not None and big is not None and small > big:
                raise self.fail(path + (inner,), f"expected at most {outer} ({format_size(big)}), "
                                                 f"got {format_size(small)}")
        return MemoryLayer(name=name, scope=scope, capacity_bytes=sizes["capacity_bytes"],
                           capacity_per_unit_bytes=sizes["capacity_per_unit_bytes"],
                           capacity_per_block_bytes=sizes["capacity_per_block_bytes"],
                           capacity_per_thread_bytes=sizes["capacity_per_thread_bytes"],
                           bandwidth_peak_gbps=peak, bandwidth_effective_gbps=eff,
                           transaction_bytes=transaction, line_bytes=line, banks=banks, bank_width_bytes=width,
                           streaming_stores=streaming, alias_bytes=alias, vector_bytes=vector,
                           latency_ns=latency,
                           capacity_per_block_optin_bytes=sizes["capacity_per_block_optin_bytes"],
                           max_stages=stages)

    def parallelism(self, value: Any, backend: str, required: tuple[str, ...]) -> Parallelism:
        path: tuple = ("parallelism",)
        self.mapping(value, path, PAR_KEYS, PAR_REQUIRED)
        v = {key: self.pos_int(value[key], path + (key,)) for key in PAR_REQUIRED}
        for key in required:
            if value.get(key) is None:
                raise self.fail(path, f"missing key {key!r} (required for backend {backend!r})")
        hw_threads = value.get("hardware_threads_per_unit")
        if hw_threads is not None:
            hw_threads = self.pos_int(hw_threads, path + ("hardware_threads_per_unit",))
        warp = v["warp_size"]
        for key in ("max_threads_per_block", "max_threads_per_unit"):
            if v[key] % warp:
                raise self.fail(path + (key,), f"expected a multiple of parallelism.warp_size ({warp}), "
                                               f"got {v[key]}")
        if v["max_threads_per_unit"] < v["max_threads_per_block"]:
            raise self.fail(path + ("max_threads_per_unit",),
                            f"expected at least max_threads_per_block ({v['max_threads_per_block']}), "
                            f"got {v['max_threads_per_unit']}")
        if v["max_registers_per_thread"] > v["registers_per_unit"]:
            raise self.fail(path + ("max_registers_per_thread",),
                            f"expected at most registers_per_unit ({v['registers_per_unit']}), "
                            f"got {v['max_registers_per_thread']}")
        if v["register_tile_budget"] > v["max_registers_per_thread"]:
            raise self.fail(path + ("register_tile_budget",),
                            f"expected at most max_registers_per_thread ({v['max_registers_per_thread']}), "
                            f"got {v['register_tile_budget']}")
        split = value.get("max_split_k")
        split = Parallelism.max_split_k if split is None else self.pos_int(split, path + ("max_split_k",))
        return Parallelism(**v, hardware_threads_per_unit=hw_threads, max_split_k=split)

    def peak(self, value: Any, path: tuple) -> ComputePeak:
        self.mapping(value, path, ("peak_tflops", "effective_tflops"), ("peak_tflops", "effective_tflops"))
        peak = self.number(value["peak_tflops"], path + ("peak_tflops",))
        eff = self.number(value["effective_tflops"], path + ("effective_tflops",))
        if eff > peak:
            raise self.fail(path + ("effective_tflops",), f"expected at most peak_tflops ({_num(peak)}), "
                                                          f"got {_num(eff)}")
        return ComputePeak(peak_tflops=peak, effective_tflops=eff)

    def compute(self, value: Any) -> FrozenDict:
        path: tuple = ("compute",)
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping of dtype to peaks, got {show(value)}")
        for key in value:
            if key not in DTYPES:
                close = difflib.get_close_matches(key, DTYPES, n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}?" if close else "expected one of: " + ", ".join(DTYPES)
                raise self.fail(path + (key,), f"unknown dtype; {hint}")
        if "float32" not in value:
            raise self.fail(path, "missing key 'float32'")
        out = {}
        for dtype in value:
            dp = path + (dtype,)
            entry = self.mapping(value[dtype], dp, ("vector", "matrix"), ("vector",))
            vector = self.peak(entry["vector"], dp + ("vector",))
            matrix = None if entry.get("matrix") is None else self.peak(entry["matrix"], dp + ("matrix",))
            out[dtype] = DtypeCompute(vector=vector, matrix=matrix)
        return FrozenDict(out)

    def matrix_instructions(self, value: Any, compute: Mapping[str, DtypeCompute]) \
            -> tuple[MatrixInstruction, ...]:
        path: tuple = ("matrix_instructions",)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.fail(path, f"expected a list, got {show(value)}")
        out = []
        names: dict[str, int] = {}
        keys = ("name", "shape", "input_dtype", "accumulator_dtype")
        for i, item in enumerate(value):
            ip = path + (i,)
            self.mapping(item, ip, keys, keys)
            name = self.string(item["name"], ip + ("name",), IDENT_RE, "an identifier")
            if name in names:
                raise self.fail(ip + ("name",), f"expected a name not used by matrix_instructions[{names[name]}], "
                                                f"got {show(name)}")
            names[name] = i
            shape = item["shape"]
            if not isinstance(shape, list) or len(shape) != 3 or not all(
                    isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape):
                raise self.fail(ip + ("shape",), f"expected [m, n, k], three positive integers, got {show(shape)}")
            in_dtype = self.choice(item["input_dtype"], ip + ("input_dtype",), DTYPES)
            acc_dtype = self.choice(item["accumulator_dtype"], ip + ("accumulator_dtype",), DTYPES)
            if in_dtype not in compute or compute[in_dtype].matrix is None:
                raise self.fail(ip + ("input_dtype",), f"expected a dtype with a compute.<dtype>.matrix peak, "
                                                       f"got {show(in_dtype)}")
            out.append(MatrixInstruction(name=name, shape=(shape[0], shape[1], shape[2]),
                                         input_dtype=in_dtype, accumulator_dtype=acc_dtype))
        return tuple(out)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


# --------------------------------------------------------------------------------------------------------
# public entry points

def list_bundled() -> list[str]:
    """Names of the bundled descriptions (file stems in roller/hwdesc)."""
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.yaml"))


def resolve(name_or_path: str | os.PathLike, local: Mapping[str, Callable[[], Path]] | None = None
            ) -> tuple[Path, str]:
    """(file to read, path to show in messages) for a file path, a bundled name, or one of ``local``'s names
    (descriptions of this machine's devices, measured the first time and cached: ``local[name]()`` gives the
    cached file; the backends provide them, through ``roller.compiler.target.load_description``)."""
    text = os.fspath(name_or_path)
    path = Path(text)
    if path.is_file():
        return path, text
    local = local or {}
    looks_like_path = os.sep in text or "/" in text or text.endswith((".yaml", ".yml"))
    if not looks_like_path:
        bundled = BUNDLED_DIR / f"{text.lower()}.yaml"
        if bundled.is_file():
            return bundled, _display(bundled)
        if text.lower() in local:
            found = local[text.lower()]()
            return found, str(found)
    # A path that is not there is not a name either: only names get the names measured here as hints.
    local_names = [] if looks_like_path else sorted(local)
    here = f"; measured here: {', '.join(local_names)}" if local_names else ""
    raise InputError(f"no hardware description {text!r} (bundled: {', '.join(list_bundled())}{here})")


def _display(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


_CACHE: dict[tuple, HardwareDesc] = {}


def load(name_or_path: str | os.PathLike, overrides: Mapping[str, Any] | None = None,
         local: Mapping[str, Callable[[], Path]] | None = None) -> HardwareDesc:
    """Load a bundled description by name (``"mi50"``), a YAML file, or one of ``local``'s names (``resolve``),
    apply ``overrides`` and check it.

    ``overrides`` maps key paths to values (``{"parallelism.warp_size": "64"}``); string values are read as
    YAML scalars, so ``"64"`` is an integer and ``"32KiB"`` a size. Raises InputError (exit 2) on any problem.
    """
    path, display = resolve(name_or_path, local)
    try:
        st = path.stat()
        key = (str(path.resolve()), display, st.st_mtime_ns, st.st_size,
               tuple((k, repr(v)) for k, v in (overrides or {}).items()))
    except OSError:
        key = None
    if key is not None and key in _CACHE:
        return _CACHE[key]
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read: {err}", source=display) from None
    desc = load_text(text, display, overrides, base_dir=path.parent, local=local)
    if key is not None:
        _CACHE[key] = desc
    return desc


def load_text(text: str, source: str = "<string>", overrides: Mapping[str, Any] | None = None,
              base_dir: Path | None = None,
              local: Mapping[str, Callable[[], Path]] | None = None) -> HardwareDesc:
    """Check YAML text as a hardware description; ``source`` is the name used in messages, ``base_dir`` the
    folder an ``extends`` path is relative to (default: the current folder), ``local`` the names measured on this
    machine that ``extends`` may name (``resolve``)."""
    doc = _Doc(source)
    data = _extend(_compose(text, doc), doc, base_dir or Path.cwd(), (), local)
    if overrides:
        if not isinstance(data, dict):
            raise InputError(f"expected a mapping at the top level, got {show(data)}", source=source,
                             line=doc.lines.get(()))
        _apply_overrides(data, overrides, doc)
    return _Checker(doc).top(data)


def from_dict(data: Mapping[str, Any], source: str = "<dict>",
              overrides: Mapping[str, Any] | None = None) -> HardwareDesc:
    """Check a description given as plain data (e.g. ``HardwareDesc.to_dict()``)."""
    text = yaml.safe_dump(_plain(data), sort_keys=False)
    return load_text(text, source, overrides)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
