"""Assembling a comparison report and writing it: ``index.html`` (one self-contained file), ``report.md``,
``results.csv``, ``results.json``, ``plots/*.svg`` and, with code generation, ``kernels/<hw>/<op>/``.

Everything is written into a temporary folder beside the output and renamed into place at the end, so an
interrupted or failed run leaves no half-written report.
"""
from __future__ import annotations

import base64
import csv
import io
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from roller.atomic import exchange, staging_dir
from roller.compare import collect as _collect
from roller.compare import measured as _measured
from roller.compare import plots as _plots
from roller.compare import summary as _summary
from roller.compare.facts import device_facts
from roller.compare.why import explain
from roller.errors import InputError

if TYPE_CHECKING:
    from roller.hw import HardwareDesc
    from roller.ir.tensor_expr import TensorExpr

TEMPLATES = Path(__file__).parent / "templates"
#: files a report folder holds; a folder with other content is not replaced
REPORT_FILES = ("index.html", "report.md", "results.csv", "results.json", "plots", "kernels")

CSV_COLUMNS = ("op", "kind", "hw", "tiles", "grid", "block", "reduce_threads", "predicted_ms", "fraction_of_peak",
               "bottleneck", "padding_waste", "measured_ms", "model_error", "measured_same_program",
               "codegen", "codegen_backend", "kernel", "construction_ms", "codegen_ms", "line")


@dataclass
class Report:
    meta: dict[str, Any]
    ops: list[dict[str, Any]]
    devices: list[dict[str, Any]]
    entries: list[dict[str, Any]]
    baseline: str
    kind_ratios: list[dict[str, Any]]
    pair_ratios: dict[str, dict[str, float | None]]
    device_summary: dict[str, dict[str, Any]]
    why: list[dict[str, Any]]
    measured: dict[str, Any]
    timing: dict[str, float] = field(default_factory=dict)
    plots: dict[str, str] = field(default_factory=dict)  # name -> SVG text
    plot_note: str | None = None
    model: dict[str, Any] | None = None  # a whole model's totals, when the ops are a model's operators

    @property
    def device_names(self) -> list[str]:
        return [d["name"] for d in self.devices]

    def to_json(self) -> dict[str, Any]:
        return {"meta": self.meta, "baseline": self.baseline, "devices": self.devices, "ops": self.ops,
                "results": self.entries, "kind_ratios": self.kind_ratios, "pair_ratios": self.pair_ratios,
                "device_summary": self.device_summary, "why": self.why, "measured": self.measured,
                "timing": self.timing, "plots": sorted(self.plots), "plot_note": self.plot_note,
                "model": self.model}


def _op_doc(op: TensorExpr) -> dict[str, Any]:
    src = op.source or op
    return {"name": op.name, "kind": op.kind, "statement": src.statement(), "flops": src.flops,
            "bytes": src.bytes, "hash": src.content_hash(), "dtype": src.output.dtype,
            "shapes": {t.name: list(t.storage_shape) for t in src.tensors}}


def build(ops: list[TensorExpr], hws: list[HardwareDesc], *, ops_file: str, top_k: int = 10,
          codegen: bool = True, measured: list[str] | None = None, baseline: str | None = None,
          jobs: int | None = None, kernels_dir: Path | None = None, plots: bool = True,
          on_step: Callable[[int, str], None] | None = None, model: Mapping[str, Any] | None = None,
          scheduler: str | None = None) -> Report:
    """Construct, predict and render every op for every description and summarize; writes nothing except
    kernel sources into ``kernels_dir`` (when given and ``codegen``). ``model`` ({"name", "uses": op name ->
    how many of the model's nodes it runs}) adds whole-model totals: each op's time counted per use.
    ``scheduler``: a Dask scheduler's address, whose workers build instead of local processes."""
    from roller import __version__

    names = [h.name for h in hws]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputError(f"two descriptions are named {dup[0]!r}; each --hw must have its own name", field="--hw")
    if baseline is None:
        baseline = names[0]
    elif baseline not in names:
        raise InputError(f"{baseline!r} is not one of the compared descriptions ({', '.join(names)})",
                         field="--baseline")
    meas = _measured.load(measured or [])  # read before the long part: a bad file fails fast
    t0 = time.perf_counter()
    entries = _collect.collect(ops, hws, top_k, codegen, kernels_dir, jobs or _collect.default_jobs(), on_step,
                               scheduler=scheduler)
    t_collect = time.perf_counter() - t0
    devices = []
    for h in hws:
        d = device_facts(h)
        be, why_none = _collect.backend_for(h)
        d["backend_registered"] = be.name if be else None
        d["backend_note"] = why_none
        d["source"] = h.source
        d["hash"] = h.content_hash()[:16]
        d["plot"] = f"roofline-{_collect.safe_component(h.name)}"
        devices.append(d)
    measured_info = _measured.attach(entries, meas, {h.name: h.backend for h in hws})
    t1 = time.perf_counter()
    kind_rows = _summary.kind_ratios(entries, names, baseline)
    report = Report(
        meta={"roller_version": __version__, "ops_file": ops_file, "top_k": top_k, "codegen": codegen,
              "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "jobs": jobs or _collect.default_jobs(),
              "measured_paths": list(measured or [])},
        ops=[_op_doc(o) for o in ops], devices=devices, entries=entries, baseline=baseline,
        kind_ratios=kind_rows, pair_ratios=_summary.pair_ratios(entries, names),
        device_summary=_summary.device_summary(entries, names),
        why=explain(entries, {d["name"]: d for d in devices}, baseline), measured=measured_info)
    t2 = time.perf_counter()
    if plots:
        report.plot_note = _plots.available()
        if report.plot_note is None:
            report.plots = _render_plots(report, jobs or _collect.default_jobs())
    else:
        report.plot_note = "plots were turned off (--no-plots)"
    if model is not None:
        report.model = model_totals(entries, names, model)
    t3 = time.perf_counter()
    report.timing = {"build_s": t_collect, "summaries_s": t2 - t1, "plots_s": t3 - t2,
                     "construction_s_sum": sum(e["construction_ms"] for e in entries) / 1e3,
                     "codegen_s_sum": sum(e["codegen"].get("ms") or 0 for e in entries) / 1e3}
    return report


def model_totals(entries: list[dict[str, Any]], names: list[str], model: Mapping[str, Any]) -> dict[str, Any]:
    """Per device: the model's predicted time (each operator's time times the nodes it runs), and per op its
    share on each device."""
    uses: Mapping[str, int] = model["uses"]
    totals = {n: 0.0 for n in names}
    rows: dict[str, dict[str, Any]] = {}
    for e in entries:
        ms = (e["predicted_ms"] or 0.0) * uses.get(e["op"], 1)
        totals[e["hw"]] += ms
        rows.setdefault(e["op"], {"op": e["op"], "uses": uses.get(e["op"], 1), "ms": {}})["ms"][e["hw"]] = ms
    for row in rows.values():
        row["share"] = {n: (row["ms"].get(n, 0.0) / totals[n]) if totals[n] else None for n in names}
    return {"name": model["name"], "nodes": sum(uses.values()), "operators": len(rows),
            "total_predicted_ms": totals, "ops": sorted(rows.values(), key=lambda r: -max(r["ms"].values()))}


def _render_plots(report: Report, jobs: int) -> dict[str, str]:
    names = report.device_names
    slim = _plots.slim(report.entries)
    op_docs = {o["name"]: {"kind": o["kind"], "flops": o["flops"], "bytes": o["bytes"]} for o in report.ops}
    tasks: list[tuple[str, tuple]] = [
        ("time-per-op", (slim, [{"name": o["name"], "kind": o["kind"]} for o in report.ops], names)),
        ("ratio-by-kind", (report.kind_ratios, names, report.baseline))]
    for d in report.devices:
        tasks.append((d["plot"], (d, [e for e in slim if e["hw"] == d["name"]], op_docs)))
    if jobs <= 1:
        done = [_plots.render(n, a) for n, a in tasks]
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), initializer=_collect.die_with_parent,
                                 initargs=(os.getpid(),)) as pool:
            done = list(pool.map(_plots.render, [n for n, _ in tasks], [a for _, a in tasks]))
    return dict(done)


# -- writers ---------------------------------------------------------------------------------------------------

def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _pct(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x * 100:.{digits}g}%"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}x"


def _md_cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             autoescape=jinja2.select_autoescape(["html.j2"]), trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(fmt=_fmt, pct=_pct, ratio=_ratio, md=_md_cell)
    return env


def _context(report: Report) -> dict[str, Any]:
    rows_by_op: dict[str, list[dict[str, Any]]] = {}
    for e in report.entries:
        rows_by_op.setdefault(e["op"], []).append(e)
    return {"r": report, "meta": report.meta, "devices": report.devices, "names": report.device_names,
            "rows_by_op": rows_by_op, "op_docs": {o["name"]: o for o in report.ops}}


def render_html(report: Report) -> str:
    ctx = _context(report)
    ctx["plot_uris"] = {k: "data:image/svg+xml;base64," + base64.b64encode(v.encode()).decode("ascii")
                        for k, v in report.plots.items()}
    ctx["css"] = (TEMPLATES / "report.css").read_text(encoding="utf-8")
    ctx["js"] = (TEMPLATES / "report.js").read_text(encoding="utf-8")
    return _environment().get_template("report.html.j2").render(**ctx)


def render_markdown(report: Report) -> str:
    return _environment().get_template("report.md.j2").render(**_context(report))


def csv_rows(report: Report) -> list[dict[str, Any]]:
    rows = []
    for e in report.entries:
        m = e["measured"] or {}
        cg = e["codegen"]
        rows.append({"op": e["op"], "kind": e["kind"], "hw": e["hw"], "tiles": e["tiles_text"], "grid": e["grid"],
                     "block": e["block"], "reduce_threads": e["reduce_threads"], "predicted_ms": e["predicted_ms"],
                     "fraction_of_peak": e["fraction_of_peak"], "bottleneck": e["bottleneck"],
                     "padding_waste": e["padding_waste"], "measured_ms": m.get("measured_ms"),
                     "model_error": m.get("model_error"), "measured_same_program": m.get("same_program"),
                     "codegen": cg["status"], "codegen_backend": cg.get("backend"), "kernel": cg.get("path"),
                     "construction_ms": e["construction_ms"], "codegen_ms": cg.get("ms"), "line": e["line"]})
    return rows


def render_csv(report: Report) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    for row in csv_rows(report):
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def write_files(report: Report, folder: Path, started: float | None = None) -> list[str]:
    """Write every report file into ``folder`` (which exists); returns the names written. ``started``
    (a ``time.perf_counter()`` value) makes ``timing.total_s`` in results.json, which is written last."""
    t = time.perf_counter()
    (folder / "plots").mkdir(exist_ok=True)
    for name, svg in report.plots.items():
        (folder / "plots" / f"{name}.svg").write_text(svg, encoding="utf-8")
    (folder / "results.csv").write_text(render_csv(report), encoding="utf-8")
    (folder / "report.md").write_text(render_markdown(report), encoding="utf-8")
    (folder / "index.html").write_text(render_html(report), encoding="utf-8")
    now = time.perf_counter()
    report.timing["write_s"] = now - t
    if started is not None:
        report.timing["total_s"] = now - started
    (folder / "results.json").write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
    return [n for n in REPORT_FILES if (folder / n).exists()]


# -- output folder ---------------------------------------------------------------------------------------------

def prepare_output(out_dir: Path) -> Path:
    """A fresh temporary folder beside ``out_dir``; InputError when ``out_dir`` is something a report must not
    replace (a file, or a folder holding other things than a report)."""
    if out_dir.exists():
        if not out_dir.is_dir():
            raise InputError("output exists and is not a folder", field="-o", source=str(out_dir))
        foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in REPORT_FILES)
        if foreign:
            raise InputError(f"output folder holds other files than a report ({', '.join(foreign[:3])}"
                             f"{', ...' if len(foreign) > 3 else ''}); give an empty or new folder",
                             field="-o", source=str(out_dir))
    try:
        return staging_dir(out_dir)
    except OSError as err:
        raise InputError(f"cannot write there: {err.strerror or err}", field="-o", source=str(out_dir)) from None


def move_into_place(tmp: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` (an earlier report, or nothing) with the finished ``tmp``."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; a report is as readable as any other output
    if out_dir.exists() and exchange(tmp, out_dir):
        shutil.rmtree(tmp, ignore_errors=True)  # now the earlier report
        return
    old = None
    if out_dir.exists():
        old = out_dir.resolve().parent / f".{out_dir.name}.tmp-{os.getpid()}-old"
        os.rename(out_dir, old)
    os.rename(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
