"""CUDA kernels on an NVIDIA GPU: correctness against roller.reference and speed against the vendor libraries,
all measured in one run.

For every op of a suite (default: the paper's 119 ops, plus float16 copies of its matmul and convolution ops
with --fp16): construct the top-K rPrograms for the description of this GPU, compile and time each (CUDA
events around samples of back-to-back launches, median of --repeat samples), keep the fastest, check its output
against ``roller.reference``, and time the reference implementation of the same op the same way:

* matmul / batch matmul: cuBLAS through ``cupy.matmul`` (float16 inputs: cuBLAS tensor cores);
* conv2d / depthwise conv2d: cuDNN through ``torch.nn.functional.conv2d`` (benchmark mode) when torch with
  CUDA is importable, else no baseline;
* elementwise, pooling, reductions, transposes (memory-bound): the compulsory traffic (inputs + output bytes)
  per second as a fraction of device-to-device copy bandwidth (``cupy`` copy of a 256 MiB buffer).

Ops whose tensors exceed --max-gib, or whose numpy reference would exceed --max-gflop, have their batch
dimension halved until they fit (the report says so). The markdown table goes to --md (for BENCHMARKS.md),
the raw rows to --json.

Run on a machine with an NVIDIA GPU and ``pip install -e '.[cuda]'`` (plus torch for the cuDNN baseline):
``python bench/gpu.py --md gpu.md --json gpu.json``. Without a GPU it stops with exit 5 and says why.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from roller.atomic import write_atomic

SUITES = {"roller119": ROOT / "bench/suites/roller119.json", "scaled": ROOT / "bench/suites/scaled.json",
          "large": ROOT / "bench/suites/large.json", "sanitize": ROOT / "bench/suites/sanitize.json"}
#: --ops quick: the paper suite's ops a short GPU run times (every GEMM in both dtypes, convolutions of each
#: shape class, depthwise, and memory-bound ops of every kind), about two minutes at top-4
QUICK_OPS = ("M0,M1,M2,M3,M4,M5,M6,M0_f16,M1_f16,M2_f16,M3_f16,M4_f16,M5_f16,M6_f16,C0,C1,C3,C10,C20,C0_f16,"
             "C1_f16,C3_f16,C10_f16,C20_f16,D0,D8,E0,E1,E4,E9,E12,E14,E19,E23,P0,P3,P7,R0,R1,R2,R3")
#: GPU name substring -> bundled description
DESCRIPTIONS = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("V100", "v100"))
GEMM_KINDS = ("matmul", "batch_matmul")
CONV_KINDS = ("conv2d", "depthwise_conv2d")
#: the issue's targets, per category: (what, threshold)
TARGETS = {"gemm_float32": ("x cuBLAS", 0.9), "gemm_float16": ("x cuBLAS (tensor cores)", 0.8),
           "conv": ("x cuDNN (geomean)", 0.9), "memory": ("of copy bandwidth", 0.8)}
#: the parameter that is the batch of each named op (halved to fit memory); None: the first dim of a shape
#: (a matmul's rows are its batch: BERT's vocabulary projection M6 is 65536 tokens, 4 TFLOP and 8 GB)
BATCH_PARAM = {"conv2d": "N", "depthwise_conv2d": "N", "avgpool2d": "N", "maxpool2d": "N", "batch_matmul": "B",
               "matmul": "M"}


@dataclass
class Row:
    name: str
    kind: str
    dtype: str
    category: str
    shrunk: str = ""  # "N 128->32" when the batch was reduced
    roller_ms: float | None = None
    top1_ms: float | None = None
    baseline: str = ""
    baseline_ms: float | None = None
    ratio: float | None = None  # baseline time / roller time (>1: roller faster); memory: fraction of copy bw
    rate: str = ""
    max_rel_err: float | None = None
    ok: bool | None = None
    line: str = ""
    error: str = ""
    candidates: list[float | None] = field(default_factory=list)


# -- op selection (no GPU needed) -------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench/gpu.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", choices=sorted(SUITES), default="roller119")
    ap.add_argument("--hw", default=None, help="description (default: from the GPU's name: h200/h100/a100/v100)")
    ap.add_argument("--ops", default=None, help="comma-separated op names, or 'quick' (QUICK_OPS; default: all)")
    ap.add_argument("--fp16", action="store_true", help="add float16 copies of matmul/batch matmul/conv ops")
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--max-gib", type=float, default=8.0, help="tensor bytes per op before the batch is halved")
    ap.add_argument("--max-gflop", type=float, default=200.0,
                    help="numpy reference work per op before the batch is halved")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds after which no further op is started (the report covers the ops run)")
    ap.add_argument("--precompile", action="store_true",
                    help="no GPU: compile every candidate for --hw's target (default h200) into the roller cache, "
                         "so that a run on the GPU (with that cache) loads them without compiling")
    ap.add_argument("--differing-ops", default=None, metavar="HW",
                    help="no GPU: print the selected ops (comma-separated) whose top-k kernels for --hw differ "
                         "from those for HW: the ops an ablation of one description knob has to time")
    ap.add_argument("--sass", type=Path, default=None, metavar="JSON",
                    help="with --precompile: each kernel's SASS features (cuobjdump) added to this file; a kernel "
                         "that claims a pipeline or vectors its SASS lacks fails the precompile (spills are counted)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiler processes at a time")
    ap.add_argument("--resume", type=Path, default=None,
                    help="an earlier --json of the same selection: its ops are kept, not run again (a run its "
                         "--deadline stopped goes on where it stopped)")
    ap.add_argument("--md", type=Path, default=None, help="write the markdown table here")
    ap.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    if args.top_k < 1 or args.repeat < 1 or args.jobs < 1 or args.max_gib <= 0 or args.max_gflop <= 0:
        ap.error("--top-k, --repeat, --jobs, --max-gib and --max-gflop must be positive")
    if args.deadline is not None and args.deadline <= 0:
        ap.error("--deadline must be positive")
    if args.differing_ops and args.precompile:
        ap.error("--differing-ops and --precompile are two runs")
    if args.precompile and (args.resume or args.deadline is not None or args.md or args.json):
        ap.error("--precompile only compiles: --resume, --deadline, --md and --json are for a run on the GPU")
    return args


def category(kind: str, dtype: str) -> str:
    if kind in GEMM_KINDS:
        return f"gemm_{dtype}"
    if kind in CONV_KINDS:
        return "conv"
    return "memory"


def op_cost(op: dict) -> tuple[int, float]:
    """(bytes of all tensors, GFLOP) of an op given as a dict."""
    from roller.ir import load_ops

    e = load_ops(op)[0]
    nbytes = sum(math.prod(t.shape) * t.itemsize for t in e.tensors)
    flops = math.prod(a.extent for a in e.axes) * e.flops_per_point
    return nbytes, flops / 1e9


def shrink_batch(op: dict, max_bytes: float, max_gflop: float) -> tuple[dict, str]:
    """``op`` with its batch halved until its tensors fit ``max_bytes`` and its work ``max_gflop``; the note
    says what changed ("" when nothing did)."""
    out = copy.deepcopy(op)
    kind = op.get("op", "generic")
    key = BATCH_PARAM.get(kind)
    first = last = None
    while True:
        nbytes, gflop = op_cost(out)
        if nbytes <= max_bytes and gflop <= max_gflop:
            break
        if key is not None and out.get(key, 1) > 1:
            first = first if first is not None else out[key]
            out[key] = out[key] // 2
            last = out[key]
        elif key is None and kind in ("elementwise",) and all(s[0] > 1 for s in out["shapes"].values()):
            first = first if first is not None else next(iter(out["shapes"].values()))[0]
            out["shapes"] = {k: [max(1, s[0] // 2)] + list(s[1:]) for k, s in out["shapes"].items()}
            last = next(iter(out["shapes"].values()))[0]
        elif key is None and kind in ("reduce", "transpose") and out["shape"][0] > 1:
            first = first if first is not None else out["shape"][0]
            out["shape"] = [out["shape"][0] // 2] + list(out["shape"][1:])
            last = out["shape"][0]
        else:
            break  # nothing left to halve: run it as it is
    note = f"{key or 'dim0'} {first}->{last}" if first is not None else ""
    return out, note


def select_ops(suite: str, names: str | None, fp16: bool, max_gib: float, max_gflop: float
               ) -> list[tuple[dict, str]]:
    """The suite's ops (filtered by name, float16 copies added), each with its batch-reduction note."""
    doc = json.loads(SUITES[suite].read_text())
    ops = list(doc["ops"])
    if fp16:
        ops += [dict(copy.deepcopy(o), dtype="float16", name=f"{o['name']}_f16") for o in ops
                if o.get("op") in GEMM_KINDS + ("conv2d",)]
    if names:
        wanted = [n.strip() for n in (QUICK_OPS if names == "quick" else names).split(",") if n.strip()]
        known = {o["name"] for o in ops}
        missing = [n for n in wanted if n not in known]
        if missing:
            raise SystemExit(f"bench/gpu.py: --ops: no op named {', '.join(missing)} in {suite}")
        ops = [o for o in ops if o["name"] in wanted]
    return interleaved([shrink_batch(o, max_gib * 2**30, max_gflop) for o in ops])


def interleaved(ops: list[tuple[dict, str]]) -> list[tuple[dict, str]]:
    """The ops taken in turn from each (kind, dtype), each group in its own order: a run stopped by --deadline
    then reports on every kind."""
    groups: dict[tuple[str, str], list[tuple[dict, str]]] = {}
    for item in ops:
        groups.setdefault((item[0].get("op", "generic"), item[0].get("dtype", "float32")), []).append(item)
    out: list[tuple[dict, str]] = []
    while any(groups.values()):
        for g in groups.values():
            if g:
                out.append(g.pop(0))
    return out


def description_for(gpu_name: str) -> str:
    for key, desc in DESCRIPTIONS:
        if key.lower() in gpu_name.lower():
            return desc
    raise SystemExit(f"bench/gpu.py: no bundled description for GPU {gpu_name!r}; pass --hw")


# -- report (no GPU needed) ---------------------------------------------------------------------------------------

def geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def summary(rows: Sequence[Row]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for cat, (what, target) in TARGETS.items():
        ratios = [r.ratio for r in rows if r.category == cat and r.ratio is not None]
        g = geomean(ratios)
        out[cat] = {"ops": len(ratios), "geomean": g, "min": min(ratios) if ratios else math.nan,
                    "target": target, "what": what, "met": bool(ratios) and g >= target}
    return out


def markdown(rows: Sequence[Row], meta: dict[str, Any]) -> str:
    """The BENCHMARKS.md section: header with date and device, the summary against the targets, one row per op."""
    def f(x: float | None, fmt: str = "{:.3g}") -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)

    intro = (f"Suite {meta['suite']}, best of top-{meta['top_k']} (median of {meta['repeat']} samples of "
             "back-to-back launches each); "
             f"copy bandwidth {f(meta.get('copy_gbps'), '{:.0f}')} GB/s; cuDNN baseline: "
             f"{meta.get('cudnn', 'none')}. Ratio = baseline time / roller time (memory-bound ops: fraction of "
             "copy bandwidth).")
    lines = [f"### CUDA on {meta['device']} ({meta['hw']}), {meta['date']}", "", intro, "",
             "| category | ops | geomean | min | target | met |", "|---|---|---|---|---|---|"]
    for cat, s in summary(rows).items():
        lines.append(f"| {cat} | {s['ops']} | {f(s['geomean'])} | {f(s['min'])} | {s['target']} {s['what']} | "
                     f"{'yes' if s['met'] else 'no'} |")
    header = ("| op | kind | dtype | batch | roller ms | top-1 ms | baseline | baseline ms | ratio | rate | "
              "max rel err | check | rProgram |")
    lines += ["", header, "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        check = "-" if r.ok is None else ("ok" if r.ok else "FAIL")
        if r.error:
            check = f"error: {r.error[:60]}"
        lines.append(f"| {r.name} | {r.kind} | {r.dtype} | {r.shrunk or '-'} | {f(r.roller_ms)} | {f(r.top1_ms)} | "
                     f"{r.baseline or '-'} | {f(r.baseline_ms)} | {f(r.ratio)} | {r.rate or '-'} | "
                     f"{f(r.max_rel_err, '{:.1e}')} | {check} | `{r.line}` |")
    return "\n".join(lines) + "\n"


# -- on the GPU ---------------------------------------------------------------------------------------------------

def _baseline(kind: str, op: dict, expr: Any, dev_inputs: list[Any], repeat: int) -> tuple[str, float | None]:
    """(name, seconds) of the vendor library on the same inputs, or ("", None) when there is none here."""
    import cupy as cp

    from roller.backends.cuda.launcher import time_events

    if kind in GEMM_KINDS:
        a, b = dev_inputs
        if op.get("transpose_a"):
            a = cp.swapaxes(a, -1, -2)
        if op.get("transpose_b"):
            b = cp.swapaxes(b, -1, -2)
        return "cuBLAS", time_events(lambda: cp.matmul(a, b), repeat)
    if kind in CONV_KINDS:
        try:
            import torch
            import torch.nn.functional as F
        except ImportError:
            return "", None
        if not torch.cuda.is_available():
            return "", None
        torch.backends.cudnn.benchmark = True
        x, w = (torch.as_tensor(t, device="cuda") for t in dev_inputs)
        nhwc = op.get("layout", "NCHW") == "NHWC"
        if nhwc:
            x = x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
        if kind == "conv2d":
            w = w.permute(3, 2, 0, 1).contiguous() if nhwc else w
            groups = 1
        else:
            w = w.unsqueeze(1).contiguous()  # [C, KH, KW] in both layouts
            groups = x.shape[1]
        pad = op.get("padding", "SAME")
        pad_arg: Any = pad.lower() if isinstance(pad, str) else int(pad)
        stride, dil = int(op.get("stride", 1)), int(op.get("dilation", 1))
        if pad_arg == "same" and stride > 1:
            kh, kw = op["KH"], op["KW"]
            pad_arg = (((kh - 1) * dil) // 2, ((kw - 1) * dil) // 2)  # torch refuses 'same' with stride

        def run() -> None:
            F.conv2d(x, w, stride=stride, padding=pad_arg, dilation=dil, groups=groups)

        return "cuDNN", time_events(run, repeat)
    return "", None


def copy_bandwidth(repeat: int) -> float:
    """Device-to-device copy bandwidth in GB/s (read + write bytes per second)."""
    import cupy as cp

    from roller.backends.cuda.launcher import time_events

    src = cp.ones(64 * 2**20, dtype=cp.float32)
    dst = cp.empty_like(src)
    secs = time_events(lambda: cp.copyto(dst, src), repeat)
    return 2 * src.nbytes / secs / 1e9


#: kernel time each candidate is timed for at most (long candidates get fewer launches, at least 3)
TIME_BUDGET_S = 0.05


def candidates(op: dict, hw: Any, be: Any, top_k: int) -> tuple[Any, list[Any]]:
    """(the op's TensorExpr, its top-k rPrograms) for ``hw``."""
    from roller.construction import construct
    from roller.ir import load_ops

    expr = load_ops(op)[0]
    return expr, construct(expr, hw, top_k=top_k, matrix=be.matrix_support, split_k=be.split_k,
                           vectors=be.vector_programs)


def compile_all(progs: Sequence[Any], hw: Any, be: Any, target: str, jobs: int,
                sass: dict[str, Any] | None = None) -> list[str]:
    """Render the programs and compile their kernels for ``target`` into the roller cache (``compile_artifacts``);
    the errors, one line each, of those that failed. ``sass`` (where cuobjdump is here) gets each kernel's
    SASS features under its rProgram's line."""
    from roller.errors import RollerError

    arts, labels, errors = [], [], []
    for prog in progs:
        try:
            arts.append(be.render(prog, hw))
            labels.append(prog.line() + (" | wmma" if prog.use_matrix else ""))
        except RollerError as err:
            errors.append(str(err).splitlines()[0])
    return errors + compile_artifacts(arts, target, jobs, sass, labels)


#: SASS opcodes a kernel's features show as (roller.backends.cuda.sass.count prefixes)
SASS_FEATURES = ("LDGSTS", "LDG.E.128", "STG.E.128", "LDS.128", "HMMA", "BAR.SYNC", "LDL", "STL")


def sass_problems(launch: dict[str, Any], feats: dict[str, int]) -> list[str]:
    """What a kernel's SASS lacks that its launch claims. Spills (LDL/STL) are counted in the features, not
    refused: ptxas spills a few candidates (a 64x16 warp tile of 512 threads), which costs speed, not
    correctness, and the timing shows it."""
    out = []
    if int(launch.get("stages", 1)) > 1 and not feats.get("LDGSTS"):
        out.append("a pipelined kernel without LDGSTS (cp.async)")
    if " vector " in str(launch.get("rprogram", "")) and not feats.get("LDG.E.128"):
        out.append("a vector program without 16-byte loads (LDG.E.128)")
    from roller.dtypes import dtype

    shared = re.search(r"shared-vector (\d+)", str(launch.get("rprogram", "")))
    args = launch.get("arguments") or [{"dtype": "float32"}]
    wide = shared is not None and int(shared.group(1)) * dtype(str(args[0]["dtype"])).itemsize == 16
    if wide and not feats.get("LDS.128"):
        out.append("a shared-vector program without 16-byte shared reads (LDS.128)")
    return out


def compile_artifacts(arts: Sequence[Any], target: str, jobs: int, sass: dict[str, Any] | None = None,
                      labels: Sequence[str] = ()) -> list[str]:
    """Compile rendered CUDA kernels for ``target`` into the roller cache with their cubins, ``jobs`` at a time
    (a cached kernel is not compiled again); the errors, one line each, of those that failed. ``sass`` gets
    each kernel's SASS features under its label (default its kernel name)."""
    from roller.backends.cuda import sass as sass_reader
    from roller.backends.cuda.toolchain import compile_unit
    from roller.errors import RollerError

    read = sass is not None and sass_reader.available()

    def one(i: int) -> str:
        art = arts[i]
        try:
            res = compile_unit(art.source, target, None, art.kernel_name, keep_cubin=True)
            if res.cubin is not None:
                if read and sass is not None:
                    ops = sass_reader.instructions(res.cubin, art.kernel_name)
                    feats = {f: sass_reader.count(ops, f) for f in SASS_FEATURES}
                    sass[labels[i] if i < len(labels) else art.kernel_name] = {
                        **feats, "problems": sass_problems(art.launch, feats)}
                shutil.rmtree(res.cubin.parent, ignore_errors=True)
            return ""
        except RollerError as err:
            return str(err).splitlines()[0]

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return [e for e in pool.map(one, range(len(arts))) if e]


def run_op(op: dict, note: str, hw: Any, be: Any, top_k: int, repeat: int, copy_gbps: float, jobs: int,
           checks: ThreadPoolExecutor) -> tuple[Row, Future | None]:
    """Time the op's top-k on the GPU and its vendor baseline; the check of the fastest against roller.reference
    runs in ``checks`` (its future fills the row's check fields) while the next op is timed."""
    from roller.backends.cuda.launcher import device_target
    from roller.compiler.check import check_against
    from roller.errors import CheckError
    from roller.ir.reference import random_inputs

    expr, progs = candidates(op, hw, be, top_k)
    dtype = expr.inputs[0].dtype if expr.inputs else expr.output.dtype
    kind = op.get("op", "generic")
    row = Row(op["name"], kind, dtype, category(kind, dtype), shrunk=note)
    compile_all(progs, hw, be, device_target(), jobs)  # failures are met again, and reported, below
    x = random_inputs(expr, seed=0)
    host = [x[t.name] for t in expr.inputs]
    best: tuple[float, Any, Any] | None = None
    dev: list[Any] | None = None
    for i, prog in enumerate(progs):
        try:
            runner = be.compile(be.render(prog, hw), hw)
            dev = dev if dev is not None else runner.upload(host)
            out = runner.alloc_output()
            once = runner.time_device(dev, out, repeat=1, warmup=1)
            reps = max(3, min(repeat, int(TIME_BUDGET_S / max(once, 1e-7))))
            # a candidate 4x slower than the best so far cannot become the best: its one launch is its time
            slow = best is not None and once > 4 * best[0]
            secs = once if slow else runner.time_device(dev, out, repeat=reps, warmup=0)
        except Exception as err:  # noqa: BLE001 - one failing candidate is reported, the rest still run
            row.candidates.append(None)
            row.error = row.error or f"candidate {i + 1}: {str(err).splitlines()[0] if str(err) else err!r}"
            continue
        row.candidates.append(secs * 1e3)
        if i == 0:
            row.top1_ms = secs * 1e3
        if best is None or secs < best[0]:
            best = (secs, prog, runner)
    if best is None:
        return row, None
    secs, prog, runner = best
    row.roller_ms, row.line = secs * 1e3, prog.line() + (" | wmma" if prog.use_matrix else "")
    y = runner(host)

    def check() -> None:
        try:
            _, max_rel = check_against(expr.name, expr, x, y)
            row.ok, row.max_rel_err = True, max_rel
        except CheckError as err:
            row.ok, row.error = False, row.error or str(err).splitlines()[0]

    pending = checks.submit(check)
    gflop = math.prod(a.extent for a in expr.axes) * expr.flops_per_point / 1e9
    if row.category == "memory":
        nbytes = sum(math.prod(t.shape) * t.itemsize for t in expr.tensors)
        gbps = nbytes / secs / 1e9
        row.rate, row.ratio, row.baseline = f"{gbps:.0f} GB/s", gbps / copy_gbps, "copy"
        row.baseline_ms = nbytes / (copy_gbps * 1e9) * 1e3
    else:
        row.rate = f"{gflop / secs / 1e3:.1f} TFLOP/s"
        assert dev is not None
        name, base = _baseline(kind, op, expr, dev, repeat)
        if base is not None:
            row.baseline, row.baseline_ms, row.ratio = name, base * 1e3, base / secs
    return row, pending


def precompile(args: argparse.Namespace) -> int:
    """--precompile: every candidate of the selected ops compiled for --hw's target, no GPU needed."""
    import roller.hw as H
    from roller.backends import get

    hw = H.load(args.hw or "h200")
    be = get("cuda")
    ops = select_ops(args.suite, args.ops, args.fp16, args.max_gib, args.max_gflop)
    t0, failed = time.time(), 0
    gate: dict[str, Any] = json.loads(args.sass.read_text()) if args.sass and args.sass.exists() else {}
    for n, (op, _) in enumerate(ops):
        _, progs = candidates(op, hw, be, args.top_k)
        feats: dict[str, Any] = {}
        errors = compile_all(progs, hw, be, hw.target, args.jobs, feats if args.sass else None)
        errors += [f"SASS of {line}: {p}" for line, f in feats.items() for p in f["problems"]]
        if args.sass:
            gate[f"{hw.name}/{op['name']}"] = feats
            write_atomic(args.sass, json.dumps(gate, indent=1).encode())
        failed += len(errors)
        print(f"[{n + 1}/{len(ops)}] {op['name']}: {len(progs)} kernels for {hw.target}"
              + (f", {len(errors)} failed: {errors[0]}" if errors else "") + f" ({time.time() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    return 4 if failed else 0


def differing_ops(args: argparse.Namespace) -> list[str]:
    """--differing-ops: the names of the selected ops whose top-k rendered kernels for --hw are not those for
    the other description."""
    import roller.hw as H
    from roller.backends import get

    be = get("cuda")
    descs = [H.load(args.hw or "h200"), H.load(args.differing_ops)]
    out = []
    for op, _ in select_ops(args.suite, args.ops, args.fp16, args.max_gib, args.max_gflop):
        sources = [[be.render(p, hw).source for p in candidates(op, hw, be, args.top_k)[1]] for hw in descs]
        if sources[0] != sources[1]:
            out.append(op["name"])
    return out


def resumed(path: Path, names: set[str]) -> tuple[list[Row], dict[str, Any]]:
    """The rows of an earlier --json run of the ops ``names`` (others dropped) and its meta."""
    try:
        doc = json.loads(path.read_text())
        rows = [Row(**r) for r in doc["rows"] if r["name"] in names]
        return rows, dict(doc["meta"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"bench/gpu.py: --resume {path}: not a bench/gpu.py --json output ({err})") from None


def write_report(args: argparse.Namespace, rows: Sequence[Row], meta: dict[str, Any]) -> str:
    text = markdown(rows, meta)
    if args.md:
        write_atomic(args.md, text.encode())
    if args.json:
        doc = {"meta": meta, "rows": [asdict(r) for r in rows], "summary": summary(rows)}
        write_atomic(args.json, json.dumps(doc, indent=2).encode())
    return text


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.precompile:
        return precompile(args)
    if args.differing_ops:
        print(",".join(differing_ops(args)))
        return 0
    import roller.hw as H
    from roller.backends import get
    from roller.backends.cuda.launcher import device_name
    from roller.backends.cuda.toolchain import gpu_present

    ok, why = gpu_present()
    if not ok:
        print(f"bench/gpu.py: {why}", file=sys.stderr)
        return 5
    gpu = device_name()
    hw = H.load(args.hw or description_for(gpu))
    be = get("cuda")
    ops = select_ops(args.suite, args.ops, args.fp16, args.max_gib, args.max_gflop)
    copy_gbps = copy_bandwidth(args.repeat)
    try:
        import torch

        cudnn = f"torch {torch.__version__}" if torch.cuda.is_available() else "none (torch without CUDA)"
        # Roller's float32 kernels compute in float32: cuDNN is held to the same (no TF32 tensor cores).
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    except ImportError:
        cudnn = "none (torch not installed)"
    rows: list[Row] = []
    t0 = time.time()
    meta = {"device": gpu, "hw": hw.name, "date": datetime.date.today().isoformat(), "suite": args.suite,
            "top_k": args.top_k, "repeat": args.repeat, "copy_gbps": copy_gbps, "cudnn": cudnn,
            "ops_selected": len(ops), "selection": args.ops or "all",
            "timing": "medians of samples of back-to-back launches (time_events)"}
    selected = len(ops)
    if args.resume:
        rows, earlier = resumed(args.resume, {o["name"] for o, _ in ops})
        ops = [(o, n) for o, n in ops if o["name"] not in {r.name for r in rows}]
        meta["resumed"] = {"ops": len(rows), "copy_gbps": earlier.get("copy_gbps"), "date": earlier.get("date")}
    with ThreadPoolExecutor(max_workers=4) as checks:
        pending: list[Future] = []
        for n, (op, note) in enumerate(ops):
            if args.deadline is not None and time.time() - t0 > args.deadline:
                print(f"bench/gpu.py: --deadline {args.deadline:g} s reached after {n} of {len(ops)} ops",
                      file=sys.stderr)
                break
            row, check = run_op(op, note, hw, be, args.top_k, args.repeat, copy_gbps, args.jobs, checks)
            rows.append(row)
            pending += [check] if check is not None else []
            print(f"[{n + 1}/{len(ops)}] {row.name}: roller {row.roller_ms} ms (top-1 {row.top1_ms}), "
                  f"{row.baseline or 'no baseline'} {row.baseline_ms} ms, ratio {row.ratio} {row.error}",
                  file=sys.stderr, flush=True)
            write_report(args, rows, {**meta, "seconds": time.time() - t0, "complete": len(rows) == selected})
        for f in pending:
            f.result()
    meta.update(seconds=time.time() - t0, complete=len(rows) == selected)
    print(write_report(args, rows, meta))
    bad = [r for r in rows if r.ok is False or r.roller_ms is None]
    return 4 if bad else 0


if __name__ == "__main__":
    from roller.errors import RollerError

    try:
        raise SystemExit(main())
    except RollerError as err:   # a bad description or op: one line and its exit code
        print(f"bench/gpu.py: error: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
