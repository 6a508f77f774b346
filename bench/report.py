"""Write BENCHMARKS.md from the result files in bench/results/: the current figures of every area.

    python bench/report.py            # rewrite BENCHMARKS.md
    python bench/report.py --check    # exit 1 if BENCHMARKS.md is not what this would write

An area's current figures come from its newest result file for each machine and hardware description it was
measured on (newest: the later ``date``, then the later ``time`` of one day, then the later name); older
files stay in bench/results and are named under their area, and earlier pages are in git (``git log -p
BENCHMARKS.md``).

A file's kind is its name's prefix: ``models-`` (bench/models.py --json), ``layers-`` (bench/layers.py
--json), ``dynamic-`` (bench/dynamic.py --json), ``fidelity-`` (bench/fidelity.py --json), ``gpu-``
(bench/gpu.py and bench/gpu_checks.py runs collected by bench/gpu_session.sh), ``pocl-`` (bench/pocl.py's
matmul against numpy and memory-bound ops against a copy kernel), ``construct-`` (bench/construct.py),
``checks-`` (the CUDA and HIP compile checks), ``compare-`` (``roller compare``), ``compile-time-``
(issue 39's bench/compile_time.py), ``light-zoo-`` (bench/light_zoo.py), ``quantized-`` (bench/quantized.py),
``float16-`` (bench/float16_models.py), ``farm-`` (bench/farm.py) and ``launch-`` (bench/launch.py). Other ``.json`` files are named as
not read.

Where, when and how a file was measured: its own top-level fields ``date`` (YYYY-MM-DD), ``time`` (HH:MM,
only to order the runs of one day), ``machine`` (else its ``cpu`` or ``device``), ``description``,
``command``, ``note``, ``before`` (true: a run of earlier code stored beside the run after it, never
current) and ``transcribed_from``. Files that predate these fields have them in bench/results/sources.json,
whose entry wins over the file's own fields; without either, the date comes from the file name.

The ``pocl-``, ``construct-``, ``checks-``, ``compare-``, ``compile-time-``, ``language-``, ``generation-``,
``light-zoo-``, ``quantized-``, ``float16-``, ``farm-`` and ``launch-`` files are loose: ``rows`` is a list of objects whose keys become
the table's columns; ``target`` is shown above the table and ``remark`` below it. A ``pocl-`` file holds ``matmul`` ({``n``, ``numpy_gflops``, ``rows``: [{``what``, ``vs_numpy``,
optional ``gflops``}]}) and ``memory`` ({``rows``: [{``op``, ``vs_copy``: one ratio or a list, one per run,
optional ``gbps``, ``copy_gbps``}]}). Expected of compile time (issue 39), one row per build timed::

    {"date": "2027-01-05", "machine": "...", "description": "pocl-cpu",
     "command": "python bench/compile_time.py",
     "rows": [{"what": "resnet18, empty caches", "seconds": 41.2, "kernels": 22}, ...]}
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "BENCHMARKS.md"
SOURCES = "sources.json"
#: file-name prefix -> what writes such a file
KINDS = {"models": "python bench/models.py --json FILE", "layers": "python bench/layers.py --json FILE",
         "dynamic": "python bench/dynamic.py --json FILE", "fidelity": "python bench/fidelity.py --json FILE",
         "gpu": "bash bench/gpu_session.sh", "pocl": "python bench/pocl.py",
         "construct": "python bench/construct.py", "checks": "the CUDA and HIP compile checks",
         "compare": "roller compare", "compile-time": "python bench/compile_time.py",
         "language": "python bench/language.py --json FILE",
         "generation": "python bench/generation.py --json FILE",
         "light-zoo": "python bench/light_zoo.py --json FILE",
         "quantized": "python bench/quantized.py --zoo DIR --json FILE",
         "float16": "python bench/float16_models.py --zoo DIR --json FILE",
         "farm": "python bench/farm.py --json FILE", "launch": "python bench/launch.py --json FILE"}
META = ("date", "time", "machine", "description", "command", "note", "before", "transcribed_from")


class ReportError(Exception):
    """A result file this report cannot read; the message names the file."""


@dataclass
class Result:
    path: Path
    kind: str
    doc: Any
    date: str       # "" when unknown: sorts before every dated run
    time: str
    machine: str
    description: str
    command: str
    note: str
    before: bool
    transcribed: str

    @property
    def order(self) -> tuple[str, str, str]:
        return (self.date, self.time, self.path.name)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ReportError(f"{path}: not readable JSON ({err})") from None


def _guard(r: Result, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), with a damaged or unexpected file reported as one line naming it instead of a traceback."""
    try:
        return fn(*args)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError) as err:
        raise ReportError(f"{r.path}: not a {r.kind} result as `{KINDS[r.kind]}` writes it "
                          f"({type(err).__name__}: {err})") from None


def _description(kind: str, doc: Any) -> str:
    where = {"models": lambda: doc["rows"][0]["hw"], "dynamic": lambda: doc["hw"],
             "gpu": lambda: doc["description"], "fidelity": lambda: doc["records"][0]["hw"]}
    return str(where[kind]()) if kind in where else "-"


def load(folder: Path) -> tuple[list[Result], list[str], dict[str, Any]]:
    """Every result file of ``folder``, the names of its .json files of no known kind, and sources.json."""
    sources = _read_json(folder / SOURCES) if (folder / SOURCES).exists() else {}
    entries = sources.get("files", {}) if isinstance(sources, dict) else None
    if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
        raise ReportError(f"{folder / SOURCES}: 'files' is not an object of file name -> fields")
    missing = sorted(set(entries) - {p.name for p in folder.glob("*.json")})
    if missing:   # a renamed or deleted file would otherwise lose its provenance silently
        raise ReportError(f"{folder / SOURCES}: names files that are not there: {', '.join(missing)}")
    prefixes = sorted(KINDS, key=len, reverse=True)
    results, unread = [], []
    for path in sorted(p for p in folder.glob("*.json") if p.name != SOURCES):
        kind = next((k for k in prefixes if path.name.startswith(k + "-")), None)
        if kind is None:
            unread.append(path.name)
            continue
        doc = _read_json(path)
        own = {k: doc[k] for k in META if k in doc} if isinstance(doc, dict) else {}
        meta = {**own, **entries.get(path.name, {})}
        dated = re.search(r"\d{4}-\d{2}-\d{2}", path.name)
        fallback = (doc.get("cpu") or doc.get("device")) if isinstance(doc, dict) else None
        r = Result(path, kind, doc, str(meta.get("date") or (dated.group() if dated else "")),
                   str(meta.get("time", "")), str(meta.get("machine") or fallback or "machine not recorded"),
                   "-", str(meta.get("command") or KINDS[kind]), str(meta.get("note", "")),
                   bool(meta.get("before")), str(meta.get("transcribed_from", "")))
        r.description = str(meta.get("description") or _guard(r, _description, kind, doc))
        results.append(r)
    return results, unread, sources


def newest(results: Iterable[Result], parts: Callable[[Result], list[str]] = lambda r: [""]
           ) -> list[tuple[str, Result]]:
    """(part, newest file) for each machine, description and part, newest first; ``parts`` names the parts
    of an area a file holds (a dynamic-shapes file may hold single ops and whole models, measured apart)."""
    best: dict[tuple[str, str, str], Result] = {}
    for r in results:
        for part in [] if r.before else _guard(r, parts, r):
            key = (r.machine, r.description, part)
            if key not in best or r.order > best[key].order:
                best[key] = r
    return sorted(((k[2], r) for k, r in best.items()), key=lambda kr: (kr[1].order, kr[0]), reverse=True)


# -- formatting ---------------------------------------------------------------------------------------------

def _f(x: Any, fmt: str = "{:.2f}") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return fmt.format(x)


def _geomean(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None and x > 0]
    return statistics.geometric_mean(vals) if vals else None


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    # A column that no row fills (a field older files lack) is left out rather than shown as dashes.
    keep = [i for i in range(len(head)) if i == 0 or any(row[i] != "-" for row in rows)]
    out = ["| " + " | ".join(head[i] for i in keep) + " |", "|" + "---|" * len(keep)]
    return out + ["| " + " | ".join(row[i] for i in keep) + " |" for row in rows]


def _heading(r: Result, part: str = "") -> str:
    desc = "" if r.description == "-" else f", `{r.description}`"
    note = f"; {r.note}" if r.note else ""
    copied = f"; transcribed from {r.transcribed}" if r.transcribed else ""
    return (f"**{r.machine}{desc}, {r.date or 'undated'}**{': ' + part if part else ''} "
            f"(`bench/results/{r.path.name}`; `{r.command}`{note}){copied}.")


def _older(results: Iterable[Result], chosen: Iterable[tuple[str, Result]]) -> list[str]:
    shown = {id(r) for _, r in chosen}
    rest = sorted((r for r in results if id(r) not in shown), key=lambda r: r.order, reverse=True)
    names = ", ".join(f"`{r.path.name}` ({r.date or 'undated'})" for r in rest)
    return ["", f"Older runs: {names}."] if rest else []


def _missing(kind: str) -> list[str]:
    return ["", f"No result file yet (`bench/results/{kind}-*.json`, from `{KINDS[kind]}`)."]


def _area(results: list[Result], kind: str, head: list[str], body: Callable[[Result, str], list[str]],
          parts: Callable[[Result], list[str]] = lambda r: [""], absent: str = "") -> list[str]:
    """The heading and text ``head``, then for each current file (and part) its heading line and ``body``."""
    mine = [r for r in results if r.kind == kind]
    chosen = newest(mine, parts)
    out = list(head)
    for part, r in chosen:
        out += ["", _heading(r, part), *_guard(r, body, r, part)]
    if not chosen:
        return out + (["", absent] if absent else _missing(kind))
    return out + _older(mine, chosen)


# -- areas --------------------------------------------------------------------------------------------------

def _ratio(x: dict[str, Any], key: str) -> float | None:
    return x[key] / x["ort_ms"] if x.get(key) else None


def _models(r: Result) -> list[str]:
    rows = r.doc["rows"]
    vino = all(x.get("openvino_ms") for x in rows)   # OpenVINO's columns where every row has it
    plain = all(x.get("unblocked_ms") for x in rows)   # images in the model's own layout (no blocked channels)
    body = [[x["model"], _f(x["ort_ms"], "{:.1f}"), _f(x["roller_ms"], "{:.1f}"),
             _f(_ratio(x, "roller_ms"), "{:.2f}x"), *([_f(_ratio(x, "unblocked_ms"), "{:.2f}x")] if plain else []),
             _f(_ratio(x, "unfused_ms"), "{:.2f}x"),
             _f(x.get("evaluated_ms"), "{:.1f}"), _f(_ratio(x, "evaluated_ms"), "{:.2f}x"),
             *([_f(x["openvino_ms"], "{:.1f}"), _f(_ratio(x, "openvino_ms"), "{:.2f}x")] if vino else []),
             str(x["kernels_launched"]), _f(x.get("max_abs_error"), "{:.1e}")] for x in rows]
    keys = ("roller_ms", "unfused_ms", "evaluated_ms", "openvino_ms", "unblocked_ms")
    geo = [_geomean(_ratio(x, k) for x in rows) for k in keys]
    body.append(["**geomean**", "-", "-", _f(geo[0], "**{:.2f}x**"), *([_f(geo[4], "{:.2f}x")] if plain else []),
                 _f(geo[1], "{:.2f}x"), "-",
                 _f(geo[2], "**{:.2f}x**"), *(["-", _f(geo[3], "**{:.2f}x**")] if vino else []), "-", "-"])
    return ["", *_table(["model", "onnxruntime ms", "Roller ms (top-1)", "top-1 / ORT",
                         *(["unblocked / ORT"] if plain else []), "unfused / ORT",
                         "top-10 timed ms", "top-10 timed / ORT",
                         *(["OpenVINO ms", "OpenVINO / ORT"] if vino else []), "kernels launched", "max abs err"],
                        body)] + (["", str(r.doc["remark"])] if r.doc.get("remark") else [])


MODELS = ["## Whole models against onnxruntime (CPU)", "",
          ("Each zoo model (`python -m bench.zoo`) compiled by Roller for the machine's OpenCL device (PoCL) "
           "and run against onnxruntime on the same cores, alternating rounds in one process, medians. "
           "Ratio: Roller's time / onnxruntime's (below 1: Roller is faster). *Top-1* builds every kernel as "
           "the model ranks it first, *top-10 timed* times each kernel's top-10 on the device "
           "(`evaluate=True`), *unfused* is one kernel per operator.")]


def _layer_summary(r: Result) -> list[str]:
    best = [x["best10_ratio"] for x in r.doc]
    top1 = [x["top1_ratio"] for x in r.doc]
    lowest = r.doc[best.index(min(best))]["layer"]
    return [r.machine, f"`{r.description}`", r.date or "undated", str(len(best)),
            f"{_geomean(best):.2f} ({min(best):.2f}, {lowest})", f"{_geomean(top1):.2f} ({min(top1):.2f})",
            f"`{r.path.name}`"]


def _layer_rows(doc: list[dict[str, Any]]) -> list[str]:
    rows = [[x["model"], x["layer"], f"{x['gflop']:.3f}", f"{x['ort_gflops']:.1f}", f"{x['top1_gflops']:.1f}",
             f"{x['top1_ratio']:.2f}", f"{x['best10_gflops']:.1f}", f"{x['best10_ratio']:.2f}"] for x in doc]
    return _table(["model", "layer", "GFLOP", "ORT GFLOP/s", "top-1 GFLOP/s", "top-1 vs ORT",
                   "best of top-10 GFLOP/s", "best vs ORT"], rows)


def layers_area(results: list[Result]) -> list[str]:
    mine = [r for r in results if r.kind == "layers"]
    out = ["## Model layers against onnxruntime (CPU)", "",
           ("Every distinct convolution and matmul layer of ResNet-18, MobileNetV2 and a BERT-base layer, "
            "each a one-node ONNX model, against onnxruntime, alternating in one process, medians. Ratio: "
            "onnxruntime's time / Roller's (above 1: Roller is faster), for the model's top-1 and for the "
            "best of the top-10 timed.")]
    chosen = newest(mine)
    if not chosen:
        return out + _missing("layers")
    head = ["machine", "description", "date", "layers", "best of top-10 vs ORT, geomean (lowest)",
            "top-1 vs ORT, geomean (lowest)", "file"]
    out += ["", *_table(head, [_guard(r, _layer_summary, r) for _, r in chosen]), ""]
    out += [f"- {_heading(r)}" for _, r in chosen]
    top = chosen[0][1]
    out += ["", f"Per layer, {top.machine}, {top.date or 'undated'}:", "", *_guard(top, _layer_rows, top.doc)]
    return out + _older(mine, chosen)


def _pocl(r: Result) -> list[str]:
    out = []
    if "matmul" in r.doc:
        mm = r.doc["matmul"]
        rows = [[x["what"], _f(x.get("gflops"), "{:.1f}"), _f(x["vs_numpy"])] for x in mm["rows"]]
        out += ["", (f"float32 matmul {mm['n']}x{mm['n']}x{mm['n']}; numpy (OpenBLAS) in the same rounds: "
                     f"{_f(mm.get('numpy_gflops'), '{:.0f}')} GFLOP/s."),
                "", *_table(["what", "GFLOP/s", "vs numpy"], rows)]
    if "memory" in r.doc:
        rows = [[x["op"], _f(x.get("gbps"), "{:.1f}"), _f(x.get("copy_gbps"), "{:.1f}"),
                 " / ".join(f"{v:.2f}" for v in x["vs_copy"]) if isinstance(x["vs_copy"], list)
                 else _f(x["vs_copy"])] for x in r.doc["memory"]["rows"]]
        out += ["", *_table(["memory-bound op", "GB/s", "copy GB/s", "vs copy kernel"], rows)]
    return out


POCL = ["## Matmul against numpy, memory-bound ops against a copy kernel (CPU)", "",
        ("Single kernels on the machine's OpenCL device (PoCL): a float32 matmul against numpy's (OpenBLAS), "
         "and memory-bound ops' GB/s of compulsory traffic against a plain float4 copy kernel, each timed "
         "alternately with its reference in one process. Ratio: Roller's speed / the reference's (above 1: "
         "Roller is faster). `bench/pocl.py` and `bench/layers.py` print these tables and write no JSON "
         "yet.")]


def _latest(x: dict[str, Any], key: str) -> dict[str, Any]:
    """``x`` if it holds ``key``, else its last variant that does: a file of several runs keeps them in
    order (``before``, ``after``, ...), and the last one is the current."""
    return x if key in x else [v for v in x.values() if isinstance(v, dict) and key in v][-1]


def _gpu(r: Result) -> list[str]:
    doc, paper = r.doc, r.doc["paper_suite"]
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for x in paper["rows"]:
        kind = "matmul" if x["category"].startswith("gemm") else x["kind"]
        groups.setdefault((kind, x["dtype"], x["baseline"] or "-", x["category"]), []).append(x)
    rows = []
    for (kind, dtype, base, cat), g in groups.items():
        best = [x["ratio"] for x in g if x["ratio"]]
        top1 = [x["baseline_ms"] / x["top1_ms"] for x in g if x["baseline_ms"] and x["top1_ms"]]
        rows.append([kind, dtype, base, str(len(g)), str(sum(bool(x["ok"]) for x in g)), _f(_geomean(best)),
                     _f(_geomean(top1)), _f(min(best, default=None)), _f(max(best, default=None)),
                     _f(paper["summary"].get(cat, {}).get("target"), "{}")])
    cats = "; ".join(f"{c} {_f(s['geomean'])} {s['what']} ({s['ops']} ops, {'' if s['met'] else 'not '}met)"
                     for c, s in paper["summary"].items())
    picked = paper["meta"].get("selection", "all")
    timing = paper["meta"].get("timing", "CUDA events around each launch")
    title = (f"Paper suite ({paper['meta']['suite']}{'' if picked == 'all' else ', --ops ' + picked}, "
             f"{len(paper['rows'])} ops; {timing}):")
    out = ["", title, "",
           *_table(["kind", "dtype", "against", "ops", "correct", f"best of top-{paper['meta'].get('top_k', 10)}",
                    "top-1", "min", "max",
                    "target"], rows), "", f"By category: {cats}."]
    out += _gpu_extras(doc, paper["rows"])
    if "scaled_suite" in doc:
        scaled = _latest(doc["scaled_suite"], "rows")["rows"]
        out[-1] += f" Scaled suite: {sum(bool(x['ok']) for x in scaled)} of {len(scaled)} ops correct."
    if doc.get("sanitizer"):
        out += ["", "compute-sanitizer: " + "; ".join(s.strip("= ") for s in doc["sanitizer"]) + "."]
    if "models" in doc:
        rows = [[x["model"], str(x["kernels_launched"]), _f(x["roller_ms"]), _f(x.get("kernel_sum_ms")),
                 _f(x.get("torch_eager_ms")), _f(x["max_abs_error"], "{:.1e}"), x.get("checked_against", "-")]
                for x in _latest(doc["models"], "records")["records"]]
        out += ["", *_table(["model", "kernels launched", "Roller ms", "sum of kernels ms",
                             "PyTorch eager ms", "max abs error", "checked against"], rows)]
    if "dynamic" in doc:
        recs = _latest(doc["dynamic"], "records")["records"]
        sets = [s for rec in recs.values() for s in rec.values()]
        sizes = [v for s in sets for v in s["sizes"].values()]
        late = sum(s["compiled_after"] - s["compiled"] for s in sets)
        out += ["", (f"Kernel sets over an open size ({', '.join(recs)}; the model's and timed sets): "
                     f"{sum(bool(v['ok']) for v in sizes)} of {len(sizes)} sizes correct, {late} kernels "
                     "compiled after the build.")]
    return out


def _gpu_extras(doc: dict[str, Any], main: list[dict[str, Any]]) -> list[str]:
    """A quick session's ceilings, large GEMMs and ablations (each a description variant with one feature off,
    timed on the ops it changes: Roller's time off / on, above 1 the feature helped)."""
    out = []
    if "ceilings" in doc:
        c = doc["ceilings"]
        copies = ", ".join(f"{k} {v:.0f}" for k, v in c.get("copy_gbps", {}).items())
        lat = ", ".join(f"{k} {v:.0f} ns" for k, v in c.get("latency_ns", {}).items())
        blas = ", ".join(f"{k} {_f(v, '{:.1f}')}" for k, v in c.get("cublas_tflops", {}).items())
        out += ["", f"Ceilings: copy GB/s {copies}; dependent-load latency {lat}; cuBLAS TFLOP/s {blas}."]
    if "large" in doc:
        rows = [[x["name"], _f(x["roller_ms"]), x.get("rate") or "-", _f(x["baseline_ms"]), _f(x["ratio"]),
                 "yes" if x["ok"] else "NO", f"`{x['line']}`"] for x in doc["large"]["rows"]]
        out += ["", *_table(["large op", "Roller ms", "Roller rate", "cuBLAS ms", "ratio", "correct",
                             "kernel"], rows)]
    on = {x["name"]: x for x in main}
    for name, variant in doc.get("ablations", {}).items():
        rows, gains = [], []
        for x in variant["rows"]:
            m = on.get(x["name"])
            if m and m.get("roller_ms") and x.get("roller_ms"):
                gains.append(x["roller_ms"] / m["roller_ms"])
                rows.append([x["name"], _f(x["roller_ms"]), _f(m["roller_ms"]), _f(gains[-1], "{:.2f}x")])
        out += ["", f"Ablation `{name}` ({variant.get('what', '')}): geomean {_f(_geomean(gains), '{:.2f}x')}.",
                "", *_table(["op", "feature off ms", "on ms", "off / on"], rows)]
    return out


GPU = ["## GPU against the vendor libraries", "",
       ("Every op's top-10 compiled and timed on the GPU (CUDA events, medians), the fastest kept and "
        "checked against `roller.reference`, next to cuBLAS (matmuls), cuDNN (convolutions) or the "
        "device-to-device copy (memory-bound ops) in the same run. Ratio: the library's time / Roller's "
        "(above 1: Roller is faster); for memory-bound ops, the fraction of copy bandwidth. Whole models: "
        "the graph executor on the GPU, against PyTorch eager.")]


def _dyn_ops(r: Result, timed: bool) -> list[str]:
    res = [x for x in r.doc["results"] if bool(x.get("evaluated")) == timed]
    rows = [[x["op"], f"{x['kernels']} / {x['exact_kernels']}", _f(x["build_s"], "{:.1f}"),
             str(len(x["rows"])), _f(x["geomean_ratio"]), _f(x["worst_ratio"]),
             _f(x.get("geomean_ratio_eval"))] for x in res]
    every = [y["ratio"] for x in res for y in x["rows"]]
    vs_timed = _geomean(y.get("ratio_eval") for x in res for y in x["rows"])
    extra = f", {vs_timed:.2f}x the exact kernels with their top-10 timed" if vs_timed else ""
    return ["", *_table(["op", "kernels (set / exact)", "build s", "sizes", "set / exact, geomean", "worst",
                         "set / exact with top-10 timed"], rows), "",
            f"All {len(every)} sizes: geomean {_f(_geomean(every))}x the exact kernels{extra}."]


def _dyn_model(m: dict[str, Any]) -> list[str]:
    rows, exact, ort = [], [], []
    for x in m["rows"]:   # bench/dynamic.py names the BERT layer's columns and ResNet-18's differently
        exact.append(x.get("vs_exact", x.get("generic_vs_exact")))
        ort.append(x.get("vs_ort", x.get("generic_vs_ort")))
        rows.append([str(x.get("seq", x.get("batch"))), _f(x["first_call_s"]),
                     _f(x.get("compiled_at_first_call"), "{}"), _f(x.get("roller_ms", x.get("generic_ms"))),
                     _f(x["exact_ms"]), _f(exact[-1]), _f(x["onnxruntime_ms"]), _f(ort[-1]),
                     _f(x["max_abs_err"], "{:.1e}")])
    rows.append(["**geomean**", "-", "-", "-", "-", _f(_geomean(exact), "**{:.2f}**"), "-", _f(_geomean(ort)),
                 "-"])
    why = f" ({m['why']})" if m.get("why") else ""
    return ["", f"Mode `{m['mode']}`{why}; one build {m['build_s']:.1f} s, {m['kernels']} kernels.", "",
            *_table(["size", "first call s", "kernels compiled at it", "Roller ms", "exact-size ms",
                     "Roller / exact", "onnxruntime ms", "Roller / ORT", "max abs err"], rows)]


#: the parts of a dynamic-shapes file, each measured apart: part -> (does the file hold it, its tables)
DYN_PARTS: dict[str, tuple[Callable[[Any], bool], Callable[[Result], list[str]]]] = {
    "single ops, kernel sets chosen by the model": (
        lambda d: any(not x.get("evaluated") for x in d["results"]), lambda r: _dyn_ops(r, False)),
    "single ops, kernel sets chosen by timing (`--eval`)": (
        lambda d: any(x.get("evaluated") for x in d["results"]), lambda r: _dyn_ops(r, True)),
    "BERT-base-sized layer over its sequence length (`--model`)": (
        lambda d: bool(d.get("model")), lambda r: _dyn_model(r.doc["model"])),
    "ResNet-18 over its batch (`--cnn`)": (lambda d: bool(d.get("cnn")), lambda r: _dyn_model(r.doc["cnn"]))}

DYNAMIC = ["## Dynamic shapes", "",
           ("One build for every size (`roller.compile` / `roller.compile_model` with `ranges`) against a "
            "build for each exact size, alternating in one process, medians. Ratio: the one build's time / "
            "the exact build's (below 1: the one build is faster); *first call* is the wall time of the "
            "first run at a new size.")]


def _fidelity_row(r: Result) -> list[str]:
    s = r.doc["summary"] if r.kind == "fidelity" else _latest(r.doc["fidelity_summary"], "ops")
    return [r.machine, f"`{r.description}`", r.date or "undated", str(s["ops"]),
            _f(s["top1_within_10pct_share"], "{:.0%}"), _f(s["median_top1_over_best"]),
            _f(s["median_spearman"]), _f(s.get("median_repeat_spearman")),
            _f(s["geomean_model_error"], "x{:.2f}"), f"`{r.path.name}`"]


def fidelity_area(results: list[Result]) -> list[str]:
    mine = [r for r in results if r.kind == "fidelity"]
    # A GPU session's file carries the fidelity run made in it: the newest figure for that GPU.
    gpu = [r for r in results if r.kind == "gpu" and isinstance(r.doc, dict) and "fidelity_summary" in r.doc]
    out = ["## Model fidelity", "",
           ("For every op of the scaled suite, the model's top-10 all timed on the device in two passes: how "
            "often the model's top-1 is within 10% of the fastest, its time / the fastest's, and Spearman's "
            "rank correlation of predicted and measured times; *passes agree* is the Spearman between the "
            "two passes, about the most the model's can show on that machine.")]
    chosen = newest(mine + gpu)
    if not chosen:
        return out + _missing("fidelity")
    head = ["machine", "description", "date", "ops", "top-1 within 10%", "median top-1 / best",
            "median Spearman", "passes agree", "geomean model error", "file"]
    out += ["", *_table(head, [_guard(r, _fidelity_row, r) for _, r in chosen]), ""]
    return out + [f"- {_heading(r)}" for _, r in chosen] + _older(mine, chosen)


def _loose(r: Result) -> list[str]:
    rows = r.doc["rows"]
    keys = list(dict.fromkeys(k for row in rows for k in row))
    def cell(x: Any) -> str:
        return _f(x, "{:.1f}") if isinstance(x, float) else "-" if x is None else str(x)
    out = ["", f"Target: {r.doc['target']}."] if r.doc.get("target") else []
    body = [[cell(row.get(k)) for k in keys] for row in rows]
    out += ["", *_table([k.replace("_", " ") for k in keys], body)]
    return out + (["", str(r.doc["remark"])] if r.doc.get("remark") else [])


def render(folder: Path = RESULTS) -> str:
    """The page for the result files in ``folder``."""
    results, unread, sources = load(folder)
    history = sources.get("history_only", {}) if isinstance(sources, dict) else {}
    lines = ["# Benchmarks", "",
             ("Generated from the result files in `bench/results/` by `python bench/report.py`: do not edit "
              "by hand. To refresh a figure, run the command shown with it, store its JSON in "
              "`bench/results/` under a new dated name (bench/report.py says which fields it needs) and run "
              "the script again. The history, with each session's notes on what changed and why, is in git: "
              "`git log -p BENCHMARKS.md`."), "",
             ("Each area shows its current figures: the newest result file for each machine and hardware "
              "description it was measured on; older files are named under it. The machines are small shared "
              "virtual machines and noisy, so Roller is timed against a reference in the same process, in "
              "alternating rounds: compare the ratios, not absolute times across tables."), ""]
    loose = [("language", "Language models against onnxruntime (CPU)",
              ("BERT-base, GPT-2 small and a Llama-style layer, built as their exports are "
               "(`tests/support/language_graphs.py`), token ids and masks on the device; one run each "
               "(inputs uploaded, outputs downloaded) against onnxruntime in the same process, alternating, "
               "medians (`bench/language.py`)."),
              "Not measured yet: `python bench/language.py --json bench/results/language-DATE.json`."),
             ("generation", "Greedy generation with a KV cache against onnxruntime (CPU)",
              ("GPT-2 small's structure with random weights, exported with and without its cache; Roller's "
               "decoder built once at the context size (`roller.compiler.generation`: a static cache masked "
               "by the attention mask) and its prefill once (over every prompt length, or at the longest, a prompt "
               "padded to it), onnxruntime growing the cache a position a step; the same prompt through each, alternating, median time of a new "
               "token (`bench/generation.py`)."),
              "Not measured yet: `python bench/generation.py --json bench/results/generation-DATE.json`."),
             ("compile-time", "Compile time: an ONNX file to its first result (CPU)",
              ("Each model built in a child process from empty caches (Roller's kernel cache and PoCL's), then "
               "again with them full; the stages `compile_model` records (import, fuse, pad, pack, build: "
               "construction and rendering, kernels two at a time; compile: PoCL's, all kernels as one program "
               "or one per core; plan), the first run, onnxruntime's session creation for the same file in the "
               "same process, and where given IREE's import and compile for this CPU "
               "(`bench/compile_time.py`)."),
              "Not measured yet: `python bench/compile_time.py --zoo DIR --json bench/results/compile-time-DATE.json`."),
             ("light-zoo", "The ONNX package's light zoo (opset 9, as shipped) against onnxruntime (CPU)",
              ("The nine models of `onnx/backend/test/data/light` with random weights in place of their constant "
               "ones, opset 9 upgraded at import; built, checked against onnxruntime, then one run each "
               "(inputs uploaded, outputs downloaded) alternating with onnxruntime's, medians "
               "(`bench/light_zoo.py`)."),
              "Not measured yet: `python bench/light_zoo.py --json bench/results/light-zoo-DATE.json`."),
             ("quantized", "int8 models against onnxruntime's int8 run (CPU)",
              ("The bench zoo's CNNs quantized by onnxruntime (`quantize_static`: QDQ, int8 weights per channel, "
               "uint8 activations, random calibration), built by Roller and timed against onnxruntime's int8 "
               "run and both float32 models, in one process, alternating, medians; the int8 outputs compared "
               "with onnxruntime's in steps of the output's quantization (`bench/quantized.py`)."),
              "Not measured yet: `python bench/quantized.py --zoo DIR --json bench/results/quantized-DATE.json`."),
             ("float16", "float16 models against onnxruntime (CPU)",
              ("The bench zoo's models with float16 weights, constants, inputs and outputs, built by Roller and "
               "timed against onnxruntime's run of the same file and both float32 models, in one process, "
               "alternating, medians (`bench/float16_models.py`)."),
              "Not measured yet: `python bench/float16_models.py --zoo DIR --json bench/results/float16-DATE.json`."),
             ("construct", "Construction time",
              "Wall time of `roller.construct` for the top-10 of each op, per bundled description.", ""),
             ("checks", "Compile checks (CUDA, HIP; no GPU)",
              "Every op of the suites rendered and compiled for each description's target.", ""),
             ("compare", "Cross-device report (`roller compare`)",
              "Every op of the suite built for every bundled description, and the report written.", ""),
             ("farm", "Build farm on Dask (`roller compare --scheduler`)",
              ("`roller compare`'s builds (construction, the model's ranking, rendering) of a model zoo's distinct "
               "operators x descriptions: serial in the client process, then on local Dask clusters of one and "
               "two single-threaded workers started by the script, alternating rounds, medians; every run's "
               "entries equal the serial build's (`bench/farm.py`). One machine: its workers share its cores."),
              "Not measured yet: `python bench/farm.py --json bench/results/farm-DATE.json`."),
             ("launch", "Kernel launches on PoCL (CPU)",
              ("What one launch costs on the local OpenCL device: an empty kernel and a 64 KiB copy, each waited "
               "for alone and queued 100 back to back, alternating rounds, medians (`bench/launch.py`). A model "
               "run queues its steps; `roller run --profile` times each step in chains of its own launches."),
              "Not measured yet: `python bench/launch.py --json bench/results/launch-DATE.json`.")]
    areas = [_area(results, "models", MODELS, lambda r, _: _models(r)), layers_area(results),
             _area(results, "pocl", POCL, lambda r, _: _pocl(r)),
             _area(results, "gpu", GPU, lambda r, _: _gpu(r)),
             _area(results, "dynamic", DYNAMIC, lambda r, part: DYN_PARTS[part][1](r),
                   lambda r: [part for part, (held, _) in DYN_PARTS.items() if held(r.doc)]),
             fidelity_area(results)]
    areas += [_area(results, kind, [f"## {title}", "", what], lambda r, _: _loose(r), absent=absent)
              for kind, title, what, absent in loose]
    for area in areas:
        lines += [*area, ""]
    if history.get("figures"):
        page = history.get("page", "git log -p BENCHMARKS.md")
        lines += ["## Only in git history", "",
                  f"These figures of earlier pages have no result file (`{page}`):", "",
                  *[f"- {x}" for x in history["figures"]], ""]
    if unread:
        lines += [f"Files in `bench/results/` of no kind this report reads: {', '.join(unread)}.", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page is not what would be written")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the folder of result files")
    ap.add_argument("--out", type=Path, default=PAGE, help="the page to write or check")
    args = ap.parse_args(argv)
    try:
        text = render(args.results)
    except ReportError as err:
        print(f"bench/report.py: error: {err}", file=sys.stderr)
        return 2
    if args.check:
        if not args.out.exists() or args.out.read_text(encoding="utf-8") != text:
            print(f"{args.out} is stale: run python bench/report.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
