"""Top-K on the device: compile the candidates in batches, time each, check the fastest, keep it.

``evaluate(op, programs, hw, backend)`` renders the model's first candidates, compiles them in one batch
(``Backend.compile_many``: one OpenCL program for all, where ten programs paid PoCL's 0.55 s fixed cost ten
times), times them one after another on the local device (``Runner.time``: median of ``repeat`` runs after
``warmup``), goes on one candidate at a time while the last one timed was the fastest (compiling is what an
evaluation costs: about 0.5 s a kernel on PoCL, against milliseconds to time it), checks the fastest against
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


#: with early stopping, the model's first FIRST_ROUND candidates are compiled (one batch) and timed; then one
#: more at a time for as long as the last one timed was the fastest so far. Simulated on the 61 evaluations of an
#: evaluate=True ResNet-18 build (top-10 all timed, pocl-cpu): 208 of 582 kernels compiled, the kept kernel
#: 1.6% slower than the fastest of ten (geomean; 1.49x at worst); a first round of 2: 175 and 3.5%.
FIRST_ROUND = 3


def _compile_round(backend: Backend, cands: Sequence[Candidate], hw: HardwareDesc, jobs: int | None,
                   workdir: Path | None, bar: Progress) -> None:
    """Render and compile ``cands`` in one batch, each its runner or its error."""
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


def _time_round(cands: Sequence[Candidate], bound: Mapping[str, np.ndarray], repeat: int, warmup: int,
                bar: Progress) -> None:
    for c in cands:
        if c.runner is not None and c.artifact is not None:
            try:
                c.measured_s = float(c.runner.time(ordered_inputs(c.artifact.launch, bound), repeat=repeat,
                                                   warmup=warmup))
            except RollerError:
                raise
            except Exception as err:  # noqa: BLE001 - e.g. a launch the device refuses
                c.error = f"run: {err.__class__.__name__}: {_short(err)}"
        bar.step(f"timed #{c.rank}")


def _last_was_fastest(cands: Sequence[Candidate], upto: int) -> bool:
    """Whether the last candidate of the first ``upto`` that ran is the fastest of them: the measurement
    disagrees with the model's ranking there, so the next candidate may be faster still."""
    ran = [c.measured_s for c in cands[:upto] if c.measured_s is not None]
    last = cands[upto - 1].measured_s
    return last is not None and last <= min(ran)


def evaluate(op: TensorExpr, programs: Sequence[RProgram], hw: HardwareDesc, backend: Backend,
             inputs: Mapping[str, np.ndarray] | None = None, repeat: int = 10, warmup: int = 2,
             jobs: int | None = None, progress: bool | None = None, check: bool = True,
             workdir: Path | None = None, label: str | None = None, early_stop: bool = True) -> Evaluation:
    """Compile ``programs`` in batches, time them on this machine's device, check and return the fastest. With
    ``early_stop``, in the model's order, stopping where the measurement agrees with the ranking
    (``FIRST_ROUND``); the candidates never reached keep no time (``"not timed"``)."""
    found = evaluate_many([(op, programs)], hw, backend, [inputs], repeat, warmup, jobs, progress, check, workdir,
                          label, early_stop)[0]
    if isinstance(found, Exception):
        raise found
    return found


def evaluate_many(ops: Sequence[tuple[TensorExpr, Sequence[RProgram]]], hw: HardwareDesc, backend: Backend,
                  inputs: Sequence[Mapping[str, np.ndarray] | None] | None = None, repeat: int = 10,
                  warmup: int = 2, jobs: int | None = None, progress: bool | None = None, check: bool = True,
                  workdir: Path | None = None, label: str | None = None, early_stop: bool = True
                  ) -> list[Evaluation | RollerError]:
    """``evaluate`` for several operators at once, each its Evaluation or the error that ended it: each round's
    candidates of every operator are compiled in one batch (split over the cores where there are enough), then
    timed one operator after another. A model's operators evaluated one by one paid PoCL's fixed cost per
    round and compiled on one core."""
    from roller.cache import toolchain_version
    from roller.ir.reference import random_inputs

    if not ops:
        return []
    for op, programs in ops:
        if not programs:
            raise RollerError(f"{op.name}: nothing to evaluate")
    require_device(backend, hw, why="--eval (timing candidates)")
    t_start = time.perf_counter()
    srcs = [op.source or op for op, _ in ops]
    given = list(inputs) if inputs is not None else [None] * len(ops)
    bound = [dict(i) if i is not None else random_inputs(src, seed=0) for i, src in zip(given, srcs)]
    cands = [[Candidate(i + 1, p) for i, p in enumerate(programs)] for _, programs in ops]
    total = sum(len(c) for c in cands)
    bar = Progress(2 * total, label or (f"evaluating {srcs[0].name}" if len(ops) == 1 else
                                        f"evaluating {len(ops)} operators"), enabled=progress)
    done = [min(len(c), FIRST_ROUND) if early_stop else len(c) for c in cands]
    try:
        _compile_round(backend, [c for cs, n in zip(cands, done) for c in cs[:n]], hw, jobs, workdir, bar)
        for cs, n, b in zip(cands, done, bound):
            _time_round(cs[:n], b, repeat, warmup, bar)
        while True:
            # a candidate that failed is no agreement either: go on until one runs slower than the fastest so far
            more = [i for i, (cs, n) in enumerate(zip(cands, done))
                    if n < len(cs) and (cs[n - 1].measured_s is None or _last_was_fastest(cs, n))]
            if not more:
                break
            _compile_round(backend, [cands[i][done[i]] for i in more], hw, jobs, workdir, bar)
            for i in more:
                _time_round(cands[i][done[i]:done[i] + 1], bound[i], repeat, warmup, bar)
                done[i] += 1
        for cs, n in zip(cands, done):
            for c in cs[n:]:
                c.error = "not timed: the measurement agreed with the model's ranking before it"
    finally:
        bar.close()
    seconds = (time.perf_counter() - t_start) / len(ops)   # evaluated together: each its share
    return [_result(op, src, cs, b, hw, backend, repeat, warmup, check, seconds, toolchain_version(backend))
            for (op, _), src, cs, b in zip(ops, srcs, cands, bound)]


def _result(op: TensorExpr, src: TensorExpr, cands: list[Candidate], bound: Mapping[str, np.ndarray],
            hw: HardwareDesc, backend: Backend, repeat: int, warmup: int, check: bool, seconds: float,
            device: str) -> Evaluation | RollerError:
    """The Evaluation of one operator's timed candidates, its fastest checked against the reference; or why
    there is none."""
    timed = [i for i, c in enumerate(cands) if c.measured_s is not None]
    if not timed:
        first = next((getattr(c, "_compile_error", None) for c in cands if getattr(c, "_compile_error", None)), None)
        if first is not None:
            return first
        return RollerError(f"{src.name}: no candidate ran on {backend.name}: "
                           + "; ".join(f"#{c.rank} {c.error}" for c in cands if c.error))
    best = min(timed, key=lambda i: (cands[i].measured_s, i))
    result = Evaluation(op, hw, backend.name, device, repeat, warmup, cands, best)
    if check:
        chosen = cands[best]
        out = chosen.runner(ordered_inputs(chosen.artifact.launch, bound))  # type: ignore[misc,union-attr]
        try:
            max_abs, max_rel = check_against(
                f"{src.name} on {hw.name}/{backend.name}, fastest candidate #{chosen.rank} "
                f"({chosen.program.line()})", src, bound, out)
        except RollerError as err:
            return err
        result.check = {"ok": True, "max_abs_error": max_abs, "max_rel_error": max_rel}
    result.seconds = seconds
    return result
