"""Top-K on the device: compile the candidates in one batch, time each, check the fastest, keep it.

``evaluate(op, programs, hw, backend)`` renders every candidate, compiles them in one batch
(``Backend.compile_many``: one OpenCL program for all, where ten programs paid PoCL's 0.55 s fixed cost ten
times), times them one after another on the local device
(``Runner.time``: median of ``repeat`` runs after ``warmup``), checks the fastest against
``roller.reference`` and returns an ``Evaluation`` whose ``to_json()`` is what ``eval.json`` holds: predicted
and measured time per candidate. A progress bar goes to stderr only when stderr is a terminal.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from roller.backends import ordered_inputs, require_device
from roller.compiler.check import check_against
from roller.errors import CompileError, RollerError, ToolchainError
from roller.progress import Progress

if TYPE_CHECKING:
    from roller.backends import Artifact, Backend
    from roller.hw import HardwareDesc
    from roller.ir.tensor_expr import TensorExpr
    from roller.program import RProgram
    from roller.runtime.device import Runner

# -- evaluation --------------------------------------------------------------------------------------------------

@dataclass
class Candidate:
    rank: int  # 1-based, the model's order
    program: RProgram
    artifact: Artifact | None = None
    runner: Runner | None = None
    compile_s: float | None = None
    measured_s: float | None = None
    error: str | None = None

    @property
    def predicted_s(self) -> float | None:
        return self.program.prediction.time_s if self.program.prediction else None

    def to_json(self) -> dict[str, Any]:
        p = self.program.prediction
        return {"rank": self.rank, "line": self.program.line(),
                "predicted_ms": p.time_s * 1e3 if p else None,
                "measured_ms": self.measured_s * 1e3 if self.measured_s is not None else None,
                "bottleneck": p.bottleneck if p else None,
                "fraction_of_peak": p.fraction_of_peak if p else None,
                "compile_s": self.compile_s, "error": self.error}


@dataclass
class Evaluation:
    op: TensorExpr
    hw: HardwareDesc
    backend: str
    device: str
    repeat: int
    warmup: int
    candidates: list[Candidate]
    best: int  # index into candidates
    check: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def chosen(self) -> Candidate:
        return self.candidates[self.best]

    def rank_correlation(self) -> float | None:
        """Spearman correlation of predicted and measured times over the candidates that ran."""
        pairs = [(c.predicted_s, c.measured_s) for c in self.candidates
                 if c.predicted_s is not None and c.measured_s is not None]
        if len(pairs) < 3:
            return None
        return spearman([p for p, _ in pairs], [m for _, m in pairs])

    def to_json(self) -> dict[str, Any]:
        src = self.op.source or self.op
        first = self.candidates[0].measured_s
        best = self.chosen.measured_s
        return {
            "op": src.name, "op_hash": src.content_hash(), "hw": self.hw.name,
            "hw_hash": self.hw.content_hash(), "backend": self.backend, "device": self.device,
            "repeat": self.repeat, "warmup": self.warmup, "chosen": self.best,
            "chosen_rank": self.chosen.rank, "chosen_line": self.chosen.program.line(),
            "model_choice_slowdown": (first / best) if first and best else None,
            "rank_correlation": self.rank_correlation(), "check": self.check, "seconds": self.seconds,
            "candidates": [c.to_json() for c in self.candidates],
        }


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (ties share their mean rank); None when either side has no spread."""
    rx, ry = _ranks(xs), _ranks(ys)
    n = len(rx)
    if n < 2:
        return None
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else None


def _ranks(xs: Sequence[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def _short(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [err.__class__.__name__])[0][:300]


def compile_each(backend: Backend, arts: Sequence[Artifact], hw: HardwareDesc, jobs: int | None = None,
                 workdir: Path | None = None) -> list[Runner | Exception]:
    """Each artifact compiled, or the error it gave in its place: in one batch (``Backend.compile_many``), and
    where the batch fails (or the sources go to ``workdir``), one by one, so that each failure is its own
    candidate's and one bad candidate does not end a timing. A missing toolchain is raised."""
    if workdir is None:
        try:
            return list(backend.compile_many(arts, hw, jobs=jobs))
        except ToolchainError:
            raise
        except Exception:  # noqa: BLE001, S110 - told apart below, kernel by kernel
            pass

    def one(art: Artifact) -> Runner | Exception:
        try:
            return backend.compile(art, hw, workdir)
        except ToolchainError:
            raise
        except Exception as err:  # noqa: BLE001 - the candidate's failure, reported with it
            return err

    with ThreadPoolExecutor(max_workers=max(1, min(len(arts) or 1, jobs or os.cpu_count() or 1))) as pool:
        return list(pool.map(one, arts))


def evaluate(op: TensorExpr, programs: Sequence[RProgram], hw: HardwareDesc, backend: Backend,
             inputs: Mapping[str, np.ndarray] | None = None, repeat: int = 10, warmup: int = 2,
             jobs: int | None = None, progress: bool | None = None, check: bool = True,
             workdir: Path | None = None, label: str | None = None) -> Evaluation:
    """Compile ``programs`` in parallel, time each on this machine's device, check and return the fastest."""
    from roller.cache import toolchain_version
    from roller.ir.reference import random_inputs

    if not programs:
        raise RollerError(f"{op.name}: nothing to evaluate")
    require_device(backend, hw, why="--eval (timing candidates)")
    src = op.source or op
    t_start = time.perf_counter()
    bound = dict(inputs) if inputs is not None else random_inputs(src, seed=0)
    cands = [Candidate(i + 1, p) for i, p in enumerate(programs)]
    bar = Progress(2 * len(cands), label or f"evaluating {src.name}", enabled=progress)
    try:
        for c in cands:
            try:
                c.artifact = backend.render(c.program, hw)
            except RollerError as err:
                c.error = f"render: {_short(err)}"

        built = [c for c in cands if c.artifact is not None]
        t = time.perf_counter()
        results = compile_each(backend, [c.artifact for c in built if c.artifact is not None], hw, jobs, workdir)
        share = (time.perf_counter() - t) / max(1, len(built))   # compiled together: each its share
        for c, compiled in zip(built, results):
            c.compile_s = share
            if isinstance(compiled, CompileError):
                c.error = f"compile: {_short(compiled)}"
                c._compile_error = compiled  # type: ignore[attr-defined]
            elif isinstance(compiled, Exception):
                c.error = f"compile: {compiled.__class__.__name__}: {_short(compiled)}"
            else:
                c.runner = compiled
            bar.step("compiled")
        args = None
        for c in cands:
            if c.runner is not None:
                if args is None:
                    args = ordered_inputs(c.artifact.launch, bound)  # type: ignore[union-attr]
                try:
                    c.measured_s = float(c.runner.time(args, repeat=repeat, warmup=warmup))
                except RollerError:
                    raise
                except Exception as err:  # noqa: BLE001 - e.g. a launch the device refuses
                    c.error = f"run: {err.__class__.__name__}: {_short(err)}"
            bar.step(f"timed #{c.rank}")
    finally:
        bar.close()
    timed = [i for i, c in enumerate(cands) if c.measured_s is not None]
    if not timed:
        first = next((getattr(c, "_compile_error", None) for c in cands if getattr(c, "_compile_error", None)), None)
        if first is not None:
            raise first
        raise RollerError(f"{src.name}: no candidate ran on {backend.name}: "
                          + "; ".join(f"#{c.rank} {c.error}" for c in cands if c.error))
    best = min(timed, key=lambda i: (cands[i].measured_s, i))
    result = Evaluation(op, hw, backend.name, toolchain_version(backend), repeat, warmup, cands, best)
    if check:
        chosen = cands[best]
        out = chosen.runner(ordered_inputs(chosen.artifact.launch, bound))  # type: ignore[misc,union-attr]
        max_abs, max_rel = check_against(
            f"{src.name} on {hw.name}/{backend.name}, fastest candidate #{chosen.rank} ({chosen.program.line()})",
            src, bound, out)
        result.check = {"ok": True, "max_abs_error": max_abs, "max_rel_error": max_rel}
    result.seconds = time.perf_counter() - t_start
    return result
