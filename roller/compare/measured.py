"""Measured times for the report's measured columns, read from files other commands wrote.

Accepted (``roller compare --measured FILE_OR_DIR``, repeatable):

* ``report.json`` of ``roller build --eval`` (``DIR/<op>/report.json``): ``op``, ``hw.name``, ``backend``,
  ``device``, ``candidates[].line`` / ``measured_ms``;
* ``eval.json`` beside it: ``op``, ``hw`` (a name), ``backend``, ``device``, ``candidates[].line`` /
  ``measured_ms``;
* a records file (``bench/fidelity.py --json``, ``bench/gpu.py``, or written by hand): ``{"records": [...]}``
  or a plain list, each record ``{"hw": NAME, "op": NAME, "measured_ms": T}`` with optional ``line`` or
  ``program`` (the rProgram's one-line form), ``predicted_ms``, ``backend``, ``device`` and ``candidates``
  (``[{"line" or "program", "measured_ms"}]``);
* ``bench/gpu.py --json``: ``{"meta": {"hw", "device"}, "rows": [{"name", "top1_ms", "roller_ms", "line"}]}``
  (``top1_ms``: the model's top-1 timed; ``roller_ms`` and ``line``: the fastest of the top-K);
* a folder: searched recursively for ``report.json`` files and records files (other JSON is skipped).

A measurement is attached to the report's entry with the same op and description name. When it lists the
timed program's line, the time of the very program the report shows is used; otherwise (or when that
program was not among those timed) the model's top-1 of the measurement, flagged ``same_program: false``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roller.errors import InputError


@dataclass
class Measurement:
    op: str
    hw: str
    measured_ms: float | None  # the measurement's own top-1 (model's choice), when known
    by_line: dict[str, float] = field(default_factory=dict)
    backend: str | None = None
    device: str | None = None
    source: str = ""


def _number(value: Any, where: str, source: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InputError(f"expected a positive number of milliseconds, got {value!r}", source=source, field=where)
    return float(value)


def _text(value: Any, where: str, source: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(f"expected a non-empty string, got {value!r}", source=source, field=where)
    return value


def _candidates(doc: dict[str, Any], where: str, source: str) -> tuple[dict[str, float], float | None]:
    """(measured ms by program line, measured ms of rank 1) from a ``candidates`` list."""
    cands = doc.get("candidates") or []
    if not isinstance(cands, list):
        raise InputError("expected a list", source=source, field=f"{where}candidates")
    by_line: dict[str, float] = {}
    first: float | None = None
    for i, c in enumerate(cands):
        if not isinstance(c, dict):
            raise InputError("expected an object", source=source, field=f"{where}candidates[{i}]")
        ms = _number(c.get("measured_ms"), f"{where}candidates[{i}].measured_ms", source)
        line = c.get("line", c.get("program"))
        if ms is None:
            continue
        if isinstance(line, str):
            by_line.setdefault(line, ms)
        if c.get("rank", i + 1) == 1:
            first = ms
    return by_line, first


def _from_build(doc: dict[str, Any], source: str) -> list[Measurement]:
    hw = doc.get("hw")
    hw_name = hw.get("name") if isinstance(hw, dict) else hw
    by_line, first = _candidates(doc, "", source)
    if not by_line and first is None:
        return []  # a build without --eval: nothing was measured
    return [Measurement(_text(doc.get("op"), "op", source), _text(hw_name, "hw", source), first, by_line,
                        doc.get("backend"), doc.get("device"), source)]


def _from_records(records: list[Any], source: str, prefix: str) -> list[Measurement]:
    out = []
    for i, r in enumerate(records):
        where = f"{prefix}[{i}]"
        if not isinstance(r, dict):
            raise InputError("expected an object with hw, op and measured_ms", source=source, field=where)
        by_line, first = _candidates(r, f"{where}.", source)
        ms = _number(r.get("measured_ms"), f"{where}.measured_ms", source)
        if ms is None and first is None:
            raise InputError("missing measured_ms", source=source, field=where)
        line = r.get("line", r.get("program"))
        if isinstance(line, str) and ms is not None:
            by_line.setdefault(line, ms)
        out.append(Measurement(_text(r.get("op"), f"{where}.op", source), _text(r.get("hw"), f"{where}.hw", source),
                               ms if ms is not None else first, by_line, r.get("backend"), r.get("device"), source))
    return out


def _from_gpu_rows(doc: dict[str, Any], source: str) -> list[Measurement]:
    meta = doc["meta"]
    hw = _text(meta.get("hw"), "meta.hw", source)
    out = []
    for i, r in enumerate(doc["rows"]):
        where = f"rows[{i}]"
        if not isinstance(r, dict):
            raise InputError("expected an object", source=source, field=where)
        top1 = _number(r.get("top1_ms"), f"{where}.top1_ms", source)
        best = _number(r.get("roller_ms"), f"{where}.roller_ms", source)
        if top1 is None and best is None:
            continue  # the op failed on the device; the row says why
        line = r.get("line")
        by_line = {line: best} if isinstance(line, str) and best is not None else {}
        out.append(Measurement(_text(r.get("name"), f"{where}.name", source), hw, top1, by_line, None,
                               meta.get("device"), source))
    return out


def _kind(doc: Any) -> str | None:
    if isinstance(doc, list):
        return "records"
    if isinstance(doc, dict):
        if isinstance(doc.get("records"), list):
            return "records"
        if isinstance(doc.get("rows"), list) and isinstance(doc.get("meta"), dict):
            return "gpu"
        if "op" in doc and "hw" in doc and "candidates" in doc:
            return "build"
    return None


def load_file(path: Path, explicit: bool = True) -> list[Measurement]:
    source = str(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("no such file or folder", source=source, field="--measured") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read: {err.__class__.__name__}", source=source, field="--measured") from None
    except json.JSONDecodeError as err:
        if not explicit:
            return []
        raise InputError(f"invalid JSON: {err.msg} (column {err.colno})", source=source, line=err.lineno) from None
    kind = _kind(doc)
    if kind == "build":
        return _from_build(doc, source)
    if kind == "gpu":
        return _from_gpu_rows(doc, source)
    if kind == "records":
        return _from_records(doc if isinstance(doc, list) else doc["records"], source,
                             "" if isinstance(doc, list) else "records")
    if explicit:
        raise InputError("not a measured-results file: expected a roller build report.json/eval.json, a "
                         "bench/gpu.py --json file, or {\"records\": [{\"hw\", \"op\", \"measured_ms\"}, ...]}",
                         source=source)
    return []


def load(paths: list[str]) -> list[Measurement]:
    """Every measurement in ``paths`` (files or folders), in the order found."""
    out: list[Measurement] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            for f in sorted(path.rglob("*.json")):
                # eval.json repeats what report.json beside it holds; only read it when it stands alone.
                if f.name == "eval.json" and (f.parent / "report.json").exists():
                    continue
                if f.name in ("rprogram.json", "launch.json"):
                    continue
                out.extend(load_file(f, explicit=False))
        else:
            out.extend(load_file(path))
    return out


def comparable(m: Measurement, hw_backend: str) -> bool:
    """False when the measurement ran through another backend than the description's (e.g. an MI50
    description's kernels run on PoCL with ``--backend opencl``): its time is not the described device's."""
    if not m.backend or m.backend == hw_backend:
        return True
    from roller.backends import registry

    try:
        be = registry().get(m.backend)
    except Exception:  # noqa: BLE001 - a broken backend package only loses this check
        return False
    return be is not None and hw_backend == be.name


def attach(entries: list[dict[str, Any]], measurements: list[Measurement], backends: dict[str, str]
           ) -> dict[str, Any]:
    """Fill each entry's ``measured`` from the matching measurement (the last one read wins); returns how
    many matched and which did not."""
    by_key = {(m.op, m.hw): m for m in measurements}
    used: set[tuple[str, str]] = set()
    for e in entries:
        m = by_key.get((e["op"], e["hw"]))
        if m is None:
            continue
        used.add((e["op"], e["hw"]))
        same = e["line"] in m.by_line
        ms = m.by_line[e["line"]] if same else m.measured_ms
        if ms is None:
            continue
        ok = comparable(m, backends[e["hw"]])
        pred = e["predicted_ms"]
        err = max(pred / ms, ms / pred) if ok and pred else None
        e["measured"] = {"measured_ms": ms, "model_error": err, "same_program": same, "comparable": ok,
                         "backend": m.backend, "device": m.device, "source": m.source}
    unmatched = sorted({f"{m.op}@{m.hw}" for m in measurements if (m.op, m.hw) not in used})
    return {"read": len(measurements), "matched": len(used), "unmatched": unmatched}
