"""``roller build``: construct the top-K rPrograms of each op, render the best one, write it out.

``--dry-run`` constructs only and prints the top-K table (``--format json``: a JSON list of
``RProgram.to_json()``, every op's candidates best predicted first, ops in file order). Otherwise each op gets
``DIR/<op>/`` with the backend's files (``kernel.<ext>`` ...), ``launch.json``, ``rprogram.json`` (the chosen
candidate), ``report.json`` and, with ``--eval``, ``eval.json`` (predicted vs measured per candidate). Every op
is built into a temporary folder next to DIR first and renamed into place only when all succeeded.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from roller.cli.common import add_common, positive_int, read_input, select_ops, target_from_args
from roller.compiler.inputs import BuiltInput, ModelInput, OpInput, SymbolicInput
from roller.errors import InputError

# Test hook: called with the temporary op folder after its files are written, before anything is moved.
_after_write: Callable[[Path], None] | None = None


def register(sub: Any) -> None:
    p = sub.add_parser(
        "build", help="construct, render and write kernels (DIR/<op>/kernel.*, launch.json, rprogram.json, "
                      "report.json)",
        description="Construct the top-K rPrograms of each op for a hardware description (default: this "
                    "machine's own, --hw host), render the best one (by the model, or measured with --eval) and "
                    "write it to DIR/<op>/.")
    add_common(p)
    p.add_argument("--dry-run", action="store_true", help="construct only: print the top-K table, write nothing")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="output on stdout (default: text; json with --dry-run: a list of RProgram.to_json())")
    p.add_argument("--eval", dest="evaluate", action="store_true",
                   help="compile the top-K on this machine's device, time them, keep the fastest (eval.json)")
    p.add_argument("--repeat", type=positive_int, default=10, metavar="N",
                   help="timed runs per candidate with --eval (median; default: 10)")
    p.add_argument("-o", "--output", default="roller-out", metavar="DIR",
                   help="output folder (default: ./roller-out)")
    p.add_argument("--no-cache", dest="cache", action="store_false",
                   help="do not read or write the kernel cache")
    p.add_argument("--db", metavar="FILE", default=None,
                   help="also copy every kernel and compiled binary this build uses into the SQLite kernel "
                        "database FILE (made, or added to); ROLLER_KERNEL_DB=FILE reads it where the cache misses")
    p.set_defaults(func=cmd_build)


# -- table --------------------------------------------------------------------------------------------------------

def tiles_text(prog: Any) -> str:
    return " | ".join(f"{prog.layers[i]}>{prog.layers[i + 1]} {t.text()}" for i, t in enumerate(prog.tiles))


def table(progs: list, measured: list[float | None] | None = None) -> list[str]:
    header = ["RANK", "TILES", "GRID", "BLOCK", "PRED ms", "BOTTLENECK", "PEAK %", "PAD %"]
    if measured is not None:
        header.append("MEAS ms")
    rows = [header]
    for i, p in enumerate(progs):
        pred = p.prediction
        row = [str(i + 1), tiles_text(p) + (f" | split-k {p.reduce_threads}" if p.reduce_threads > 1 else ""),
               str(p.grid), str(p.block), f"{pred.time_s * 1e3:.4g}" if pred else "-",
               pred.bottleneck if pred else "-", f"{pred.fraction_of_peak * 100:.3g}" if pred else "-",
               f"{p.padding_waste * 100:.3g}"]
        if measured is not None:
            m = measured[i] if i < len(measured) else None
            row.append(f"{m * 1e3:.4g}" if m is not None else "-")
        rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    left = {1, 5}
    return ["  ".join(cell.ljust(w) if c in left else cell.rjust(w)
                      for c, (cell, w) in enumerate(zip(r, widths))).rstrip() for r in rows]


# -- build --------------------------------------------------------------------------------------------------------

def cmd_build(args: argparse.Namespace) -> int:
    if not args.db:
        return _cmd_build(args)
    from roller import cache, kernel_db

    if args.dry_run or not args.cache or not cache.enabled():
        why = "--dry-run builds nothing" if args.dry_run else "the cache is off (--no-cache or ROLLER_NO_CACHE)"
        raise InputError(f"--db copies what the build puts in the kernel cache, and {why}", field="--db",
                         source=args.db)
    db = Path(args.db)
    if db.exists():
        cache.open_db(db, field="--db").close()   # refused before a long build, not after
    with kernel_db.recording() as journal:
        rc = _cmd_build(args)
        done = kernel_db.export(journal, db)
    print(f"{db}: {done.kernels} kernels and {done.results} compile results of this build; {done.total_kernels} "
          "kernels in all", file=sys.stderr if args.format == "json" else sys.stdout)
    return rc


def _cmd_build(args: argparse.Namespace) -> int:
    from roller.cli.common import hw_from_args

    hw_from_args(args)   # a bad description is reported before the input (it is cached: read once)
    given = read_input(args)
    if isinstance(given, BuiltInput):
        raise InputError(f"roller build takes an op file or a model; this is a folder roller build wrote (a "
                         f"{given.kind}: roller run {args.file} runs it)", source=args.file)
    if isinstance(given, ModelInput):
        from roller.cli.model_cmd import cmd_build_model

        return cmd_build_model(args, given)
    if isinstance(given, SymbolicInput):
        if args.dry_run:
            raise InputError("--dry-run constructs an op at one size; this op has symbolic sizes (build it to see "
                             "its kernel set and dispatch table)", source=args.file)
        return _build_kernel_set(args, given)
    assert isinstance(given, OpInput)
    if args.dry_run and args.evaluate:
        raise InputError("--dry-run constructs only and --eval compiles and runs: give one of them")
    ops = select_ops(given, args.op_name)
    if args.dry_run:
        return _dry_run(args, ops)
    from roller.backends import require_device
    from roller.compiler.artifact import move_into_place
    from roller.compiler.kernel import build_kernel

    target = target_from_args(args)
    if args.evaluate:
        require_device(target.backend, target.hw, why="--eval (timing candidates)")
    out_dir = Path(args.output)
    tmp = output_staging(out_dir)
    reports = []
    try:
        for op in ops:
            kernel = build_kernel(op, target, top_k=args.top_k, evaluate=args.evaluate, use_cache=args.cache,
                                  repeat=args.repeat)
            reports.append(kernel.write(tmp / op.name))
            if _after_write is not None:
                _after_write(tmp / op.name)
        move_into_place(tmp, out_dir, [op.name for op in ops])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.format == "json":
        print(json.dumps(reports, indent=2))
    else:
        for r in reports:
            meas = r["candidates"][r["chosen"]].get("measured_ms")
            extra = f", measured {meas:.4g} ms (fastest of {len(r['candidates'])})" if meas is not None else ""
            print(f"{r['op']}: wrote {out_dir / r['op']}/ ({', '.join(r['files'])}); "
                  f"predicted {r['candidates'][r['chosen']]['predicted_ms']:.4g} ms{extra}; {r['line']}")
    return 0


def output_staging(out_dir: Path) -> Path:
    """A private folder beside ``-o DIR`` to build in; InputError when DIR is a file or its parent is not
    writable."""
    from roller.atomic import staging_dir

    if out_dir.exists() and not out_dir.is_dir():
        raise InputError("output exists and is not a folder", field="-o", source=str(out_dir))
    try:
        return staging_dir(out_dir)
    except OSError as err:
        raise InputError(f"cannot write there: {err.strerror or err}", field="-o", source=str(out_dir)) from None


def _dry_run(args: argparse.Namespace, ops: list) -> int:
    from roller.compiler.target import Target

    hwd = _hw_of(args)
    try:
        target: Target | None = Target.resolve(hwd, args.backend)
    except InputError:
        if args.backend:
            raise
        target = None   # a dry run only constructs: a description no backend serves still has programs
    docs: list[dict] = []
    for n, op in enumerate(ops):
        t = time.perf_counter()
        if target is not None:
            progs = target.programs(op, args.top_k)
        else:
            from roller.construction import construct

            progs = construct(op, hwd, top_k=args.top_k, matrix=())
        secs = time.perf_counter() - t
        if args.format == "json":
            docs.extend(p.to_json() for p in progs)
            continue
        if n:
            print()
        backend = target.backend.name if target is not None else hwd.backend
        print(f"{op.name} on {hwd.name} ({backend}): top {len(progs)} of {args.top_k} in {secs * 1e3:.1f} ms; "
              f"{op.statement()}")
        for line in table(progs):
            print(line)
    if args.format == "json":
        print(json.dumps(docs, indent=2))
    return 0


def _hw_of(args: argparse.Namespace) -> Any:
    from roller.cli.common import hw_from_args

    return hw_from_args(args)


def _build_kernel_set(args: argparse.Namespace, given: SymbolicInput) -> int:
    from roller.compiler.artifact import move_into_place
    from roller.compiler.kernel_set import compile_generic

    op = given.op
    if args.op_name:
        raise InputError("--op does not apply to an op with symbolic sizes (it is one op)", source=op.source)
    target = target_from_args(args)
    # --eval: the set is chosen by timing the model's shortlist at the sample sizes on this machine's device,
    # and dispatch.json's choices follow the measured times (roller.construction.generic).
    kernels = compile_generic(op, target, top_k=args.top_k, evaluate=args.evaluate, repeat=args.repeat,
                              ready=False)
    out_dir = Path(args.output)
    tmp = output_staging(out_dir)
    try:
        doc = kernels.write(tmp / op.name)
        move_into_place(tmp, out_dir, [op.name])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.format == "json":
        print(json.dumps(doc, indent=2))
    else:
        lo, hi = op.ranges[doc["symbol"]]
        print(f"{op.name}: wrote {out_dir / op.name}/ ({len(doc['kernels'])} kernels for {doc['symbol']} in [{lo}, "
              f"{hi}], from {doc['candidates']} candidates in {doc['construction_s']:.2f} s, chosen by "
              f"{doc['chosen_by']}; dispatch.json: {len(doc['dispatch'])} intervals)")
    return 0
