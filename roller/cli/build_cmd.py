"""``roller build``: construct the top-K rPrograms of each op, render the best one, write it out.

``--dry-run`` constructs only and prints the top-K table (``--format json``: a JSON list of
``RProgram.to_json()``, every op's candidates best predicted first, ops in file order). Otherwise each op gets
``DIR/<op>/`` with the backend's files (``kernel.<ext>`` ...), ``launch.json``, ``rprogram.json`` (the chosen
candidate), ``report.json`` and, with ``--eval``, ``eval.json`` (predicted vs measured per candidate). Every op
is built into a temporary folder next to DIR first and renamed into place only when all succeeded.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from roller.atomic import exchange, staging_dir
from roller.errors import InputError

# Test hook: called with the temporary op folder after its files are written, before anything is moved.
_after_write: Callable[[Path], None] | None = None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_common(p: argparse.ArgumentParser) -> None:
    """Options shared by build and run: --hw/--set, OP.json, --op, --backend, --top-k."""
    from roller.cli.hw_cmd import add_hw_arguments

    p.add_argument("file", metavar="OP.json|MODEL.onnx",
                   help="op file (one op or {\"ops\": [...]}) or an ONNX model (built and run whole)")
    add_hw_arguments(p)
    p.add_argument("--op", dest="op_name", metavar="NAME", default=None,
                   help="only the op with this name (default: every op of the file)")
    p.add_argument("--backend", default=None, metavar="NAME",
                   help="backend to render with (default: the description's; e.g. opencl runs any description's "
                        "kernels on the local OpenCL device)")
    p.add_argument("--top-k", dest="top_k", type=positive_int, default=10, metavar="K",
                   help="candidates to construct (default: 10)")
    p.add_argument("--shape", action="append", default=None, metavar="INPUT=D0,D1,...",
                   help="a model input's static shape (repeatable), where the model leaves it open")
    p.add_argument("--fuse", choices=("solver", "greedy", "none"), default="solver",
                   help="a model's operator fusion: the partition of least predicted time (solver, the "
                        "default), the rule-based pass (greedy), or one kernel per operator (none)")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "build", help="construct, render and write kernels (DIR/<op>/kernel.*, launch.json, rprogram.json, "
                      "report.json)",
        description="Construct the top-K rPrograms of each op for a hardware description, render the best one "
                    "(by the model, or measured with --eval) and write it to DIR/<op>/.")
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
    p.set_defaults(func=cmd_build)


# -- shared with run --------------------------------------------------------------------------------------------

def select_ops(path: str, name: str | None) -> list:
    from roller.ir import load_ops

    ops = load_ops(path)
    if name is None:
        return ops
    chosen = [o for o in ops if o.name == name]
    if not chosen:
        import difflib

        names = [o.name for o in ops]
        hint = difflib.get_close_matches(name, names, n=1)
        raise InputError(f"no op named {name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                         + f"; ops: {', '.join(names)}", source=path, field="--op")
    return chosen


def setup(args: argparse.Namespace, need_backend: bool = True) -> tuple[Any, Any, list]:
    """(description, backend, ops) from the common options; InputError on any problem. Without
    ``need_backend`` (a dry run only constructs) the backend is None when none serves the description."""
    from roller.backends import for_hw
    from roller.cli.hw_cmd import hw_from_args

    hwd = hw_from_args(args)
    try:
        be = for_hw(hwd, args.backend)
    except InputError:
        if need_backend or args.backend:
            raise
        be = None
    ops = select_ops(args.file, args.op_name)
    return hwd, be, ops


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
    from roller.cli.model_cmd import cmd_build_model, is_model
    from roller.construction import construct as construct_programs
    from roller.ir.symbolic import load_symbolic

    if is_model(args.file):
        return cmd_build_model(args)
    symbolic = load_symbolic(args.file)
    if symbolic is not None and not args.dry_run:
        from roller.cli.generic_build import build_generic

        return build_generic(args, symbolic)
    if symbolic is not None:
        raise InputError("--dry-run constructs an op at one size; this op has symbolic sizes (build it to see "
                         "its kernel set and dispatch table)", source=args.file)
    if args.dry_run and args.evaluate:
        raise InputError("--dry-run constructs only and --eval compiles and runs: give one of them")
    hwd, be, ops = setup(args, need_backend=not args.dry_run)
    # Matrix-instruction programs only where the backend that renders them has them.
    construct = functools.partial(construct_programs, matrix=be.matrix_support if be is not None else ())
    if args.evaluate:
        from roller.evaluate import require_device

        require_device(be, hwd, why="--eval (timing candidates)")
    if args.dry_run:
        return _dry_run(args, hwd, be, ops, construct)
    out_dir = Path(args.output)
    tmp = output_staging(out_dir)
    reports = []
    try:
        for op in ops:
            reports.append(_build_one(args, hwd, be, op, tmp / op.name, construct))
        _move_into_place(tmp, out_dir, [op.name for op in ops])
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
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError("output exists and is not a folder", field="-o", source=str(out_dir))
    try:
        return staging_dir(out_dir)
    except OSError as err:
        raise InputError(f"cannot write there: {err.strerror or err}", field="-o", source=str(out_dir)) from None


def _dry_run(args: argparse.Namespace, hwd: Any, be: Any, ops: list, construct: Any) -> int:
    docs: list[dict] = []
    for n, op in enumerate(ops):
        t = time.perf_counter()
        progs = construct(op, hwd, top_k=args.top_k)
        secs = time.perf_counter() - t
        if args.format == "json":
            docs.extend(p.to_json() for p in progs)
            continue
        if n:
            print()
        print(f"{op.name} on {hwd.name} ({be.name if be else hwd.backend}): top {len(progs)} of {args.top_k} in {secs * 1e3:.1f} ms; "
              f"{op.statement()}")
        for line in table(progs):
            print(line)
    if args.format == "json":
        print(json.dumps(docs, indent=2))
    return 0


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def _build_one(args: argparse.Namespace, hwd: Any, be: Any, op: Any, folder: Path, construct: Any) -> dict:
    from roller import __version__

    t = time.perf_counter()
    progs = construct(op, hwd, top_k=args.top_k)
    construction_s = time.perf_counter() - t
    evaluation = None
    if args.evaluate:
        from roller.evaluate import evaluate

        ev = evaluate(op, progs, hwd, be, repeat=args.repeat, workdir=None,
                      label=f"evaluating {op.name} ({len(progs)} candidates)")
        chosen, art, evaluation = ev.best, ev.chosen.artifact, ev.to_json()
        assert art is not None   # the chosen candidate is one that was rendered, compiled and timed
    else:
        chosen = 0
        art = be.render(progs[0], hwd)
    folder.mkdir(parents=True)
    written = []
    for name, text in art.files.items():
        if os.sep in name or name.startswith(".") or name in ("launch.json", "rprogram.json", "report.json",
                                                                   "eval.json"):
            raise InputError(f"backend {be.name} produced a file named {name!r}")  # pragma: no cover
        _write(folder / name, text)
        written.append(name)
    _write(folder / "launch.json", json.dumps(art.launch, indent=2) + "\n")
    _write(folder / "rprogram.json", json.dumps(progs[chosen].to_json(), indent=2) + "\n")
    written += ["launch.json", "rprogram.json"]
    measured = {c["rank"]: c["measured_ms"] for c in evaluation["candidates"]} if evaluation else {}
    candidates = []
    for i, p in enumerate(progs):
        c: dict[str, Any] = {"rank": i + 1, "line": p.line(),
                             "predicted_ms": p.prediction.time_s * 1e3 if p.prediction else None,
                             "bottleneck": p.prediction.bottleneck if p.prediction else None,
                             "fraction_of_peak": p.prediction.fraction_of_peak if p.prediction else None,
                             "padding_waste": p.padding_waste}
        if evaluation is not None:
            c["measured_ms"] = measured.get(i + 1)
        candidates.append(c)
    if evaluation is not None:
        _write(folder / "eval.json", json.dumps(evaluation, indent=2) + "\n")
        written.append("eval.json")
    written.append("report.json")
    report = {
        "op": op.name, "op_hash": op.content_hash(), "statement": op.statement(),
        "hw": {"name": hwd.name, "hash": hwd.content_hash(), "source": hwd.source},
        "backend": be.name, "roller_version": __version__, "top_k": args.top_k,
        "construction_s": construction_s, "chosen": chosen,
        "chosen_by": "measurement" if evaluation is not None else "model",
        "line": progs[chosen].line(), "main_file": art.main_file, "files": written,
        "candidates": candidates,
    }
    if evaluation is not None:
        report["device"] = evaluation["device"]
        report["rank_correlation"] = evaluation["rank_correlation"]
    _write(folder / "report.json", json.dumps(report, indent=2) + "\n")
    if _after_write is not None:
        _after_write(folder)
    return report


def _move_into_place(tmp: Path, out_dir: Path, names: list[str]) -> None:
    """Rename each finished ``tmp/<op>`` to ``out_dir/<op>``, replacing an earlier build of that op: in one
    step where the system can swap two folders, so that a kill between steps never leaves the op missing; else
    moving the old one aside first (a later run moves it back if the kill came between the two renames)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        final = out_dir / name
        if final.exists() or final.is_symlink():
            if exchange(tmp / name, final):
                continue
            old = tmp / f".old-{name}"
            os.rename(final, old)
        os.rename(tmp / name, final)
