"""Model fidelity: how well the micro-performance model ranks the top-10 candidates, measured on a device.

For every op of a suite: construct the top-10 from a description, time all ten on the local device (OpenCL on
PoCL here; ``--backend cuda`` on a GPU), and report per op the model's rank of the fastest candidate, top-1 /
best time, and Spearman's rank correlation between predicted and measured times. In total: the share of ops
whose top-1 is within 10% of the best, the median top-1 / best, the median Spearman, and the geomean and worst
model error (max(predicted/measured, measured/predicted)), grouped by op kind and by the named bottleneck.

    python bench/fidelity.py --hw pocl-cpu [--suite bench/suites/scaled.json] [--json out.json] [--md out.md]
    python bench/fidelity.py --probe here.yaml --json out.json     # describe this machine first (roller hw probe)
    python bench/fidelity.py --hw pocl-cpu --repredict bench/results/fidelity-pocl-cpu.json   # no device

Every candidate is timed in two passes over the whole suite, so that the rest of the suite (half a minute or
more) runs between an op's two measurements; a candidate's time is the better of the two, and the Spearman
between the passes says how well the measurement repeats itself, about the most that the model's Spearman can
show on this machine.

``--repredict`` re-ranks candidates measured earlier with the current model and description: how a change to
the model scores against measurements already taken, in a second instead of half an hour.

The JSON holds one record per op (``{"hw", "op", "kind", "measured_ms", "predicted_ms", ...}``): the format
``roller compare --measured`` reads.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import roller.hw as H
from roller.backends import get
from roller.compiler.tune import spearman as rank_correlation
from roller.construction import construct
from roller.errors import InputError, RollerError
from roller.ir import load_ops
from roller.ir.reference import random_inputs

ROOT = Path(__file__).resolve().parent.parent
# Two runs of the same candidates ranked them alike to a median Spearman of 0.64-0.70 with 7 rounds and 0.83
# with 15 (BENCHMARKS.md): the model cannot be scored more finely than the measurement repeats. The rounds are
# split over PASSES passes over the suite: on a 2-core KVM guest the time of a kernel of a few microseconds
# depends on how recently the cores were busy (one candidate ran 0.4 us in one process and 3.0 us in another),
# and passes half a minute or more apart show some of that drift where rounds milliseconds apart do not.
ROUNDS = 16
PASSES = 2
ROUND_S = 0.01
MAX_REPEAT = 200


def spearman(a: list[float], b: list[float]) -> float:
    """roller.compiler.tune.spearman, with this report's conventions where it is undefined: one candidate or two
    constant sides agree perfectly (1), one constant side against a varying one does not correlate (0)."""
    r = rank_correlation(a, b)
    if r is not None:
        return r
    if len(a) < 2:
        return 1.0
    return 1.0 if len(set(a)) == 1 and len(set(b)) == 1 else 0.0


@dataclass
class Candidates:
    """An op's top-k, compiled, with its inputs and the times of each pass."""
    op: Any
    progs: list[Any]
    runners: list[Any]
    args: list[Any]
    reps: list[int]
    passes: list[list[float]] = field(default_factory=list)   # seconds, [pass][candidate]


def compile_top_k(op, hw, be, k: int, repeat: int) -> Candidates:  # type: ignore[no-untyped-def]
    x = random_inputs(op, seed=0)
    args = [x[t.name] for t in op.inputs]
    progs = construct(op, hw, top_k=k, matrix=be.matrix_support)
    runners = []
    for p in progs:
        runner = be.compile(be.render(p, hw), hw)
        runner(args)
        runners.append(runner)
    # Short kernels get more runs per round (about ROUND_S of kernel time each, at least ``repeat``): the median
    # of 5 runs of a 10 us kernel is mostly dispatch jitter.
    reps = [min(MAX_REPEAT, max(repeat, int(ROUND_S / max(r.time(args, repeat=3, warmup=1), 1e-7))))
            for r in runners]
    return Candidates(op, progs, runners, args, reps)


def time_pass(c: Candidates, rounds: int) -> None:
    """Round-robin rounds, best round kept: a burst of load from another process then slows one round of one
    candidate, not the candidate's figure."""
    best = [math.inf] * len(c.runners)
    for _ in range(rounds):
        for i, runner in enumerate(c.runners):
            best[i] = min(best[i], runner.time(c.args, repeat=c.reps[i], warmup=1))
    c.passes.append(best)


def candidate_rows(c: Candidates) -> list[dict]:
    best = [min(ts) for ts in zip(*c.passes)]
    return [{"rank": rank, "program": p.line(), "predicted_ms": p.prediction.time_ms,
             "bottleneck": p.prediction.bottleneck, "measured_ms": t * 1e3,
             "passes_ms": [ts[rank - 1] * 1e3 for ts in c.passes], "rprogram": p.to_json()}
            for rank, (p, t) in enumerate(zip(c.progs, best), 1)]


def summarize(records: list[dict]) -> dict:
    within = [r["top1_over_best"] <= 1.10 for r in records]
    errs = [r["model_error"] for r in records]
    by_kind: dict[str, list[float]] = defaultdict(list)
    by_bottleneck: dict[str, list[float]] = defaultdict(list)
    for r in records:
        by_kind[r["kind"]].append(r["model_error"])
        by_bottleneck[r["bottleneck"]].append(r["model_error"])
    gm = lambda xs: math.exp(statistics.mean(math.log(x) for x in xs))
    repeats = [r["repeat_spearman"] for r in records if r.get("repeat_spearman") is not None]
    return {
        "ops": len(records),
        "median_repeat_spearman": statistics.median(repeats) if repeats else None,
        "top1_within_10pct_share": sum(within) / len(records),
        "median_top1_over_best": statistics.median(r["top1_over_best"] for r in records),
        "median_spearman": statistics.median(r["spearman"] for r in records),
        "geomean_model_error": gm(errs),
        "worst_model_error": max(errs),
        "model_error_by_kind": {k: gm(v) for k, v in sorted(by_kind.items())},
        "model_error_by_bottleneck": {k: gm(v) for k, v in sorted(by_bottleneck.items())},
    }


def op_record(hw_name: str, op, rows: list[dict]) -> dict:  # type: ignore[no-untyped-def]
    """Per-op figures from its candidates, ``rows`` in the model's order (rows[0] is its top-1)."""
    meas = [r["measured_ms"] for r in rows]
    pred = [r["predicted_ms"] for r in rows]
    best = min(range(len(rows)), key=lambda i: meas[i])
    passes = [r["passes_ms"] for r in rows if r.get("passes_ms")]
    repeat = spearman([p[0] for p in passes], [p[1] for p in passes]) \
        if len(passes) == len(rows) and all(len(p) >= 2 for p in passes) else None
    return {"hw": hw_name, "op": op.name, "kind": op.kind, "candidates": rows, "repeat_spearman": repeat,
            "predicted_ms": pred[0], "measured_ms": meas[0], "best_ms": meas[best],
            "rank_of_best": best + 1, "top1_over_best": meas[0] / meas[best],
            "spearman": spearman(pred, meas), "bottleneck": rows[0]["bottleneck"],
            "model_error": max(pred[0] / meas[0], meas[0] / pred[0])}


def repredicted(op, hw, rec: dict) -> list[dict]:  # type: ignore[no-untyped-def]
    """The stored candidates of ``rec`` with the current model's predictions, in its new order (ties keep the
    stored order): a model change tried against measurements already taken, with no device."""
    from roller.construction import repredict
    from roller.program import RProgram

    rows = []
    for c in rec["candidates"]:
        try:
            p = repredict(RProgram.from_json(c["rprogram"], op), hw)
        except (ValueError, KeyError) as err:   # measured for another op, suite or description
            raise InputError(f"--repredict: candidate {c.get('program')!r} of {op.name}: {err}") from None
        rows.append({**c, "predicted_ms": p.prediction.time_ms, "bottleneck": p.prediction.bottleneck,
                     "rprogram": p.to_json()})
    rows.sort(key=lambda r: r["predicted_ms"])
    return [{**r, "rank": i} for i, r in enumerate(rows, 1)]


def report(hw_name: str, backend: str, top_k: int, summary: dict) -> str:
    repeat = summary.get("median_repeat_spearman")
    repeat_line = None if repeat is None else \
        f"| median Spearman between the two passes (the measurement's own repeatability) | {repeat:.2f} |"
    lines = [f"Model fidelity on {hw_name} ({backend}), {summary['ops']} ops, top-{top_k}:", "",
             "| metric | value |", "|---|---|",
             f"| top-1 within 10% of best | {summary['top1_within_10pct_share']:.0%} |",
             f"| median top-1 / best | {summary['median_top1_over_best']:.2f} |",
             f"| median Spearman (predicted vs measured) | {summary['median_spearman']:.2f} |",
             *([repeat_line] if repeat_line else []),
             f"| geomean model error | x{summary['geomean_model_error']:.2f} |",
             f"| worst model error | x{summary['worst_model_error']:.1f} |", "",
             "Model error by op kind: " + ", ".join(f"{k} x{v:.1f}" for k, v in
                                                    summary["model_error_by_kind"].items()),
             "Model error by bottleneck: " + ", ".join(f"{k} x{v:.1f}" for k, v in
                                                       summary["model_error_by_bottleneck"].items())]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hw", default="pocl-cpu", help="description name or YAML (e.g. one from roller hw probe)")
    ap.add_argument("--probe", metavar="YAML",
                    help="describe the local OpenCL device first (roller hw probe), write it here and use it "
                         "instead of --hw")
    ap.add_argument("--backend", default=None)
    ap.add_argument("--suite", default=str(ROOT / "bench/suites/scaled.json"))
    ap.add_argument("--op", action="append", metavar="NAME", help="only this op of the suite (repeatable)")
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--repredict", metavar="JSON",
                    help="no device: re-rank the candidates measured in this earlier --json output with the "
                         "current model and description")
    ap.add_argument("--json", help="write per-op records and the summary here")
    ap.add_argument("--md", help="write the markdown summary here")
    args = ap.parse_args()
    if args.probe and args.repredict:
        raise InputError("--probe measures this machine and --repredict uses no device: give one of them")
    hw = probed(args.probe) if args.probe else H.load(args.hw)
    from roller.backends import for_hw

    be = get(args.backend) if args.backend else for_hw(hw)
    stored = {}
    if args.repredict:
        try:
            stored = {r["op"]: r for r in json.loads(Path(args.repredict).read_text())["records"]}
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise InputError(f"{args.repredict}: not a bench/fidelity.py --json output ({err})") from None
    t0 = time.perf_counter()
    ops = load_ops(args.suite)
    unknown = set(args.op or ()) - {op.name for op in ops}
    if unknown:
        raise InputError(f"{args.suite}: no op named {', '.join(sorted(unknown))}")
    ops = [op for op in ops if not args.op or op.name in args.op]
    if args.repredict:
        rows_of = [(op, repredicted(op, hw, stored[op.name])) for op in ops if op.name in stored]
    else:
        tops = []
        for op in ops:
            tops.append(compile_top_k(op, hw, be, args.top_k, args.repeat))
            print(f"compiled {op.name}", file=sys.stderr, flush=True)
        for n in range(PASSES):
            for c in tops:
                time_pass(c, ROUNDS // PASSES)
            print(f"pass {n + 1} of {PASSES} timed", file=sys.stderr, flush=True)
        rows_of = [(c.op, candidate_rows(c)) for c in tops]
    records = []
    for op, rows in rows_of:
        rec = op_record(hw.name, op, rows)
        records.append(rec)
        repeat = "" if rec["repeat_spearman"] is None else f"  passes agree {rec['repeat_spearman']:+.2f}"
        print(f"{op.name:24s} rank-of-best {rec['rank_of_best']:2d}  top1/best {rec['top1_over_best']:.2f}  "
              f"spearman {rec['spearman']:+.2f}  model error x{rec['model_error']:.1f}{repeat}", flush=True)
    summary = summarize(records)
    summary["seconds"] = time.perf_counter() - t0
    text = report(hw.name, be.name, args.top_k, summary)
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "records": records}, indent=1))


def probed(path: str):  # type: ignore[no-untyped-def]
    """The description ``roller hw probe`` writes for this machine, saved at ``path``: the issue's "description
    produced by roller hw probe", so that the model's tables are this machine's and not another's."""
    from roller.atomic import write_atomic
    from roller.backends.opencl import probe

    if not Path(path).resolve().parent.is_dir():   # before the probe's half minute, not after it
        raise InputError("folder does not exist", source=str(Path(path).parent), field="--probe")
    text = probe.probe().to_yaml(probe.description_name(Path(path).stem))
    hw = H.load_text(text, path)
    write_atomic(path, text.encode("utf-8"))   # never a half-written description where a later --hw reads
    return hw


if __name__ == "__main__":
    try:
        main()
    except RollerError as err:  # bad input, no device for the backend, a compiler failure: one line, its code
        print(f"fidelity.py: error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
