"""What the benchmarks that time a zoo model in several forms share (bench/quantized.py,
bench/float16_models.py): the alternating timing of the forms in one process, and the driver over the zoo's
files that writes the result."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.models import ORT_SETTLE_S, round_order


def alternating_ms(jobs: dict[str, Callable[[], Any]], rounds: int, per_round: int = 5) -> dict[str, float]:
    """Median milliseconds of each job: each is run once first, then ``rounds`` rounds each run every job
    ``per_round`` times (their median), each round in an order of its own (``round_order``), so that drift on a
    shared machine, and the job before, fall on all of them alike."""
    for fn in jobs.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in jobs}
    for r in range(rounds):
        for key in round_order(list(jobs), r):
            once = []
            for _ in range(per_round):
                t = time.perf_counter()
                jobs[key]()
                once.append(time.perf_counter() - t)
            times[key].append(statistics.median(once))
            time.sleep(ORT_SETTLE_S)   # onnxruntime's threads spin after its runs: not on the next job's time
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def zoo_main(argv: list[str] | None, prog: str, doc: str, models: tuple[str, ...],
             measure: Callable[[str, Path, int], dict[str, Any]], remark: str) -> int:
    """``python bench/<prog> --zoo DIR [--models ...] [--rounds N] [--json FILE]``: one row per model found in
    the zoo folder (``measure(name, zoo, rounds)``), printed as it comes, all written to FILE."""
    from bench.models import cpu_name

    ap = argparse.ArgumentParser(prog=f"python bench/{prog}", description=doc.split("\n")[0])
    ap.add_argument("--zoo", type=Path, required=True, help="folder of the exported .onnx files (bench.zoo)")
    ap.add_argument("--models", nargs="+", default=list(models))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = []
    for name in args.models:
        if not (args.zoo / f"{name}.onnx").exists():
            print(f"{name}: not in {args.zoo}, skipped", file=sys.stderr)
            continue
        rows.append(measure(name, args.zoo, args.rounds))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        out = {"date": time.strftime("%Y-%m-%d"), "machine": f"{cpu_name()} ({os.cpu_count()} cores)",
               "command": f"python bench/{prog} --zoo DIR --json FILE",
               "target": "pocl-cpu (PoCL on this CPU); onnxruntime 2 threads, same process, alternating",
               "remark": remark, "rows": rows}
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0
