"""``roller compare``: build every op for every description and write a cross-device report.

    roller compare --hw v100 --hw mi50 --hw ipu-gc200 --hw path/to/new.yaml OPS.json -o report/

writes ``report/index.html`` (self-contained), ``report.md``, ``results.csv``, ``results.json`` and ``plots/``;
with ``--kernels`` also ``kernels/<hw>/<op>/`` (the generated sources, linked from the report). Without ``--hw``
every bundled description is compared.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from roller.cli.common import positive_int
from roller.compiler.inputs import ModelInput, OpInput, SymbolicInput
from roller.errors import InputError
from roller.settings import settings


def register(sub: Any) -> None:
    from roller import hw
    from roller.compiler.target import local_names

    p = sub.add_parser(
        "compare", help="compare what ops become on several devices: HTML/markdown/CSV/JSON report",
        description="Construct, predict and generate code for every op of OPS.json on every description, and "
                    "write a report: index.html (one self-contained file), report.md, results.csv, results.json, "
                    "plots/ (and kernels/ with --kernels). Measured times (roller build --eval, bench/gpu.py, bench/fidelity.py) "
                    "can be added with --measured.")
    p.add_argument("file", metavar="OPS.json|MODEL.onnx",
                   help="op file (one op or {\"ops\": [...]}) or an ONNX model (its distinct operators, with "
                        "whole-model totals)")
    p.add_argument("--shape", action="append", default=None, metavar="INPUT=D0,D1,...",
                   help="a model input's static shape (repeatable), where the model leaves it open")
    p.add_argument("--hw", dest="hws", action="append", default=[], metavar="NAME|FILE",
                   help="a description to compare (repeatable; bundled: " + ", ".join(hw.list_bundled())
                        + "".join(f"; measured here: {n}" for n in local_names()) + "; default: all bundled)")
    p.add_argument("-o", "--output", default="roller-compare", metavar="DIR",
                   help="report folder (default: ./roller-compare); an earlier report there is replaced")
    p.add_argument("--op", dest="op_names", action="append", default=[], metavar="NAME",
                   help="only this op (repeatable; default: every op of the file)")
    p.add_argument("--top-k", dest="top_k", type=positive_int, default=10, metavar="K",
                   help="candidates constructed per op, as roller build (default: 10); the report shows the top-1")
    p.add_argument("--baseline", default=None, metavar="NAME",
                   help="description the ratios and explanations are relative to (default: the first --hw)")
    p.add_argument("--measured", action="append", default=[], metavar="FILE_OR_DIR",
                   help="measured times to show beside the predictions (repeatable): a roller build --eval output "
                        "folder or report.json/eval.json, bench/gpu.py --json, or a records JSON "
                        "(bench/fidelity.py --json); see docs/compare.md")
    p.add_argument("--no-codegen", dest="codegen", action="store_false",
                   help="construct and predict only; skip rendering kernels through the backends")
    p.add_argument("--kernels", action="store_true",
                   help="also write the generated sources to DIR/kernels/<hw>/<op>/ and link them from the report "
                        "(thousands of files for a large suite: slower to write and to replace)")
    p.add_argument("--no-plots", dest="plots", action="store_false", help="leave out the matplotlib charts")
    p.add_argument("-j", "--jobs", type=positive_int, default=None, metavar="N",
                   help="worker processes (default: the CPUs available, at most 8)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="build on the workers of this Dask scheduler (tcp://host:8786) instead of local processes; "
                        "default: $ROLLER_SCHEDULER where set (docs/compare.md, 'A build farm')")
    p.set_defaults(func=cmd_compare)


def _ops(given: OpInput, names: list[str]) -> list:
    from roller.cli.common import select_ops

    if not names:
        return select_ops(given, None)
    out = []
    for n in dict.fromkeys(names):
        out += select_ops(given, n)
    return out


def cmd_compare(args: argparse.Namespace) -> int:
    from roller import hw
    from roller.cli.common import read_input
    from roller.cli.model_cmd import model_ops
    from roller.compare import report as rep
    from roller.compiler.target import load_description
    from roller.ir.opfile import symbolic_refused
    from roller.progress import Progress

    t0 = time.perf_counter()
    model = None
    given = read_input(args)
    if isinstance(given, ModelInput):
        if args.op_names:
            raise InputError("--op selects ops of an op file; a model is compared whole", field="--op")
        ops, model = model_ops(given, args.shape)
    elif isinstance(given, SymbolicInput):
        raise symbolic_refused(given.op)
    elif isinstance(given, OpInput):
        ops = _ops(given, args.op_names)
    else:
        raise InputError("roller compare takes an op file or a model, not a build folder", source=args.file)
    hws = [load_description(h) for h in (args.hws or hw.list_bundled())]
    out_dir = Path(args.output)
    tmp = rep.prepare_output(out_dir)
    bar = Progress(len(ops) * len(hws), f"compare {len(ops)} ops x {len(hws)} devices")
    try:
        def step(n: int, note: str) -> None:
            for _ in range(n):
                bar.step(note)

        kernels = tmp / "kernels" if args.codegen and args.kernels else None
        report = rep.build(ops, hws, ops_file=args.file, top_k=args.top_k, codegen=args.codegen,
                           measured=args.measured, baseline=args.baseline, jobs=args.jobs, kernels_dir=kernels,
                           plots=args.plots, on_step=step, model=model,
                           scheduler=args.scheduler or settings.farm.scheduler)
        written = rep.write_files(report, tmp, started=t0)
        rep.move_into_place(tmp, out_dir)
    finally:
        bar.close()
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    t = report.timing
    print(f"wrote {out_dir}/ ({', '.join(written)}): {len(ops)} ops x {len(hws)} devices in {t['total_s']:.1f} s "
          f"(build {t['build_s']:.1f} s, plots {t['plots_s']:.1f} s, writing {t['write_s']:.1f} s)")
    for d in report.devices:
        s = report.device_summary[d["name"]]
        cg = ", ".join(f"{k} {v}" for k, v in s["codegen"].items())
        meas = f"; measured {s['measured']}" if s["measured"] else ""
        print(f"  {d['name']:<12} sum of predicted {s['total_predicted_ms']:.4g} ms; codegen: {cg}{meas}")
    if report.model is not None:
        totals = ", ".join(f"{n} {ms:.4g} ms" for n, ms in report.model["total_predicted_ms"].items())
        print(f"  model {report.model['name']} ({report.model['nodes']} operator nodes): {totals}")
    if report.plot_note and args.plots:
        print(f"note: {report.plot_note}", file=sys.stderr)
    if report.measured["unmatched"]:
        print(f"note: {len(report.measured['unmatched'])} measurements match no op x device of this report",
              file=sys.stderr)
    return 0
