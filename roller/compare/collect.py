"""Building every op for every device: construction, the model's prediction, and code generation through the
backend registry, one result record per op x device.

Work is split into (device, chunk of ops) tasks run on a process pool (construction is pure Python, so threads
would not overlap); each task returns plain dicts, which is all the report needs. A device whose description
names a backend that is not registered still gets construction and prediction; its code generation column
says "no backend".
"""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roller.compare.facts import program_facts

if TYPE_CHECKING:
    from roller.hw import HardwareDesc
    from roller.ir.tensor_expr import TensorExpr

#: codegen statuses; "no backend": the description's backend is not registered (yet)
CODEGEN_OK, CODEGEN_NONE, CODEGEN_ERROR, CODEGEN_SKIPPED = "ok", "no backend", "error", "skipped"

_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
SOURCES = "_sources"   # the rendered files an entry carries from its task to the writer


@dataclass(frozen=True)
class Job:
    """One (device, ops) task; with ``kernels_dir`` its entries carry their rendered sources back, which the
    collecting process writes there as ``<hw>/<op>/<files>``."""

    hw: HardwareDesc
    ops: tuple[TensorExpr, ...]
    top_k: int
    codegen: bool
    kernels_dir: str | None


def safe_component(name: str) -> str:
    """``name`` as one path component: kept when it is a plain identifier-like name, else made so."""
    if _SAFE_NAME.fullmatch(name) and name not in (".", ".."):
        return name
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", name).lstrip(".") or "_"


def backend_for(hw: HardwareDesc) -> tuple[Any, str]:
    """(backend or None, why none): the registry's backend serving the description's ``backend`` field."""
    from roller.backends import for_hw
    from roller.errors import InputError

    try:
        return for_hw(hw), ""
    except InputError as err:
        return None, err.bare
    except Exception as err:  # noqa: BLE001 - a backend package that fails to import must not end the report
        return None, f"backend registry failed: {err.__class__.__name__}: {err}"


def build_entry(op: TensorExpr, hw: HardwareDesc, top_k: int, backend: Any, codegen: bool,
                kernels_dir: Path | None) -> dict[str, Any]:
    """The result record of ``op`` on ``hw``: the model's top-1 rProgram and its code generation."""
    from roller.construction import construct

    t0 = time.perf_counter()
    # what the backend renders, as ``roller build`` asks for it (roller.compiler.target): its matrix
    # instructions, split-K pairs and vector programs
    progs = construct(op, hw, top_k=top_k, matrix=backend.matrix_support if backend is not None else (),
                      split_k=backend is not None and backend.split_k,
                      vectors=backend is not None and backend.vector_programs)
    construction_ms = (time.perf_counter() - t0) * 1e3
    prog = progs[0]
    doc = prog.to_json()
    doc.pop("op")  # the op is described once per op in the report, not per device
    pred = prog.prediction
    entry: dict[str, Any] = {
        "op": op.name, "kind": op.kind, "hw": hw.name,
        "tiles": doc["tiles"],
        "tiles_text": " | ".join(f"{t['from']}>{t['to']} {'x'.join(map(str, t['shape']))}" for t in doc["tiles"]),
        "axes": [a["name"] for a in doc["axes"]],
        "grid": prog.grid, "block": prog.block, "reduce_threads": prog.reduce_threads,
        "predicted_ms": pred.time_s * 1e3 if pred else None,
        "fraction_of_peak": pred.fraction_of_peak if pred else None,
        "bottleneck": pred.bottleneck if pred else None,
        "padding_waste": prog.padding_waste,
        "line": prog.line(),
        "candidates": len(progs),
        "construction_ms": construction_ms,
        "rprogram": doc,
        "facts": program_facts(prog, hw),
        "codegen": _codegen(prog, hw, op, backend, codegen, kernels_dir),
        "measured": None,
    }
    return entry


def _codegen(prog: Any, hw: HardwareDesc, op: TensorExpr, backend: Any, enabled: bool,
             kernels_dir: Path | None) -> dict[str, Any]:
    if not enabled:
        return {"status": CODEGEN_SKIPPED, "backend": backend.name if backend else None}
    if backend is None:
        return {"status": CODEGEN_NONE, "backend": None}
    t0 = time.perf_counter()
    try:
        art = backend.render(prog, hw)
    except Exception as err:  # noqa: BLE001 - one op a backend cannot render is a cell of the report
        msg = (str(err).strip().splitlines() or [err.__class__.__name__])[0][:300]
        return {"status": CODEGEN_ERROR, "backend": backend.name, "error": f"{err.__class__.__name__}: {msg}",
                "ms": (time.perf_counter() - t0) * 1e3}
    ms = (time.perf_counter() - t0) * 1e3
    out: dict[str, Any] = {"status": CODEGEN_OK, "backend": backend.name, "main_file": art.main_file,
                           "files": sorted(art.files), "lines": art.source.count("\n") if art.main_file else None,
                           "ms": ms, "path": None}
    if kernels_dir is not None:
        # The sources travel in the entry and the process that collects writes them (write_kernels): a task
        # may run on another machine, whose file system is not the report's.
        rel = Path(safe_component(hw.name)) / safe_component(op.name)
        out[SOURCES] = {safe_component(name): text for name, text in art.files.items()}
        out["path"] = (Path("kernels") / rel / safe_component(art.main_file or min(art.files))).as_posix()
    return out


def write_kernels(entry: dict[str, Any], kernels_dir: Path) -> None:
    """Write the kernel sources an entry carries under ``kernels_dir/<hw>/<op>/``, and drop them from it."""
    texts = entry["codegen"].pop(SOURCES, None)
    if texts is None:
        return
    folder = kernels_dir / safe_component(entry["hw"]) / safe_component(entry["op"])
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (folder / name).write_text(text, encoding="utf-8")


def run_job(job: Job) -> list[dict[str, Any]]:
    """Entries of one task, in the order of ``job.ops`` (runs in a worker process)."""
    backend, _ = backend_for(job.hw)
    kdir = Path(job.kernels_dir) if job.kernels_dir else None
    out = []
    for op in job.ops:
        try:
            out.append(build_entry(op, job.hw, job.top_k, backend, job.codegen, kdir))
        except Exception as err:  # noqa: BLE001 - re-raised below with the op and device named
            # Name the op and device: a pool's re-raised error alone would not say which build failed.
            raise _BuildFailure(op.name, job.hw.name, err, traceback.format_exc()) from None
    return out


class _BuildFailure(Exception):
    def __init__(self, op: str, hw: str, err: BaseException, tb: str) -> None:
        super().__init__(op, hw, err, tb)
        self.op, self.hw, self.err, self.tb = op, hw, err, tb


def collect(ops: list[TensorExpr], devices: list[HardwareDesc], top_k: int, codegen: bool,
            kernels_dir: Path | None, jobs: int, on_step: Callable[[int, str], None] | None = None,
            scheduler: str | None = None) -> list[dict[str, Any]]:
    """Entries for every op x device, ordered op by op (file order), devices in the order given.

    ``on_step(n, note)`` is called as ``n`` more entries are done. ``jobs`` > 1 uses that many processes;
    ``scheduler`` (a Dask scheduler's address) sends each op x device to that cluster's workers instead
    (``roller.compare.farm``)."""
    # On a cluster each task costs about 8 ms more (scheduling, the description and entries pickled both ways):
    # one op per task ran at 0.61x a serial build's rate on one worker, eight per task 0.90x (bench/farm.py).
    chunk = max(1, min(8 if scheduler else 32, -(-len(ops) // 4)))
    tasks = [Job(hw, tuple(ops[i:i + chunk]), top_k, codegen, str(kernels_dir) if kernels_dir else None)
             for hw in devices for i in range(0, len(ops), chunk)]
    results: dict[int, list[dict[str, Any]]] = {}

    def done(i: int, entries: list[dict[str, Any]]) -> None:
        results[i] = entries
        if on_step:
            on_step(len(tasks[i].ops), tasks[i].hw.name)

    try:
        if scheduler:
            from roller.compare.farm import run_on_cluster

            run_on_cluster(scheduler, run_job, tasks, done)
        elif jobs <= 1 or len(tasks) == 1:
            for i, task in enumerate(tasks):
                done(i, run_job(task))
        else:
            with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), initializer=die_with_parent,
                                     initargs=(os.getpid(),)) as pool:
                futures = {pool.submit(run_job, t): i for i, t in enumerate(tasks)}
                pending = set(futures)
                while pending:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for f in finished:
                        done(futures[f], f.result())
    except _BuildFailure as fail:
        from roller.errors import RollerError

        if isinstance(fail.err, RollerError):
            # Keep the error's class (and exit code); say where it happened.
            fail.err.args = (f"{fail.op} on {fail.hw}: {fail.err}",) + fail.err.args[1:]
            raise fail.err from None
        raise RuntimeError(f"building {fail.op} for {fail.hw} failed:\n{fail.tb}") from None
    order = {hw.name: i for i, hw in enumerate(devices)}
    op_index = {op.name: i for i, op in enumerate(ops)}
    entries = [e for i in sorted(results) for e in results[i]]
    if kernels_dir is not None:
        for e in entries:
            write_kernels(e, kernels_dir)
    entries.sort(key=lambda e: (op_index[e["op"]], order[e["hw"]]))
    return entries


def die_with_parent(parent: int) -> None:
    """Worker initializer: end this worker when the compare that started it ends, however it ends. A worker
    waits for tasks on a pipe whose writing end it holds itself, so after a SIGKILL or SIGTERM of its parent it
    would wait forever. Linux's parent-death signal ends it at once; a watch on the parent's pid covers the
    rest (other systems, and a parent gone before the signal was armed)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the watch alone
        pass
    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="roller-parent-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:  # re-parented: the compare is gone
            os._exit(1)


#: entry fields that are wall times: the only ones two builds of the same ops may differ in
TIMINGS = ("construction_ms", "ms")


def without_timings(entries: list[dict[str, Any]]) -> str:
    """``entries`` as JSON without their wall times: what a build anywhere else must reproduce exactly."""
    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in TIMINGS}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    return json.dumps(strip(entries), sort_keys=True)


def default_jobs() -> int:
    """Worker processes by default: the CPUs this process may use, at most 8."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(8, n))
