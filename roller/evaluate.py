"""Top-K on the device: compile the candidates in parallel, time each, check the fastest, keep it.

``evaluate(op, programs, hw, backend)`` renders every candidate, compiles them on a thread pool (the OpenCL
compiler runs in C with the GIL released), times them one after another on the local device
(``Runner.time``: median of ``repeat`` runs after ``warmup``), checks the fastest against
``roller.reference`` and returns an ``Evaluation`` whose ``to_json()`` is what ``eval.json`` holds: predicted
and measured time per candidate. A progress bar goes to stderr only when stderr is a terminal.

Also the shared output check (``check_output``: CheckError with the max abs/rel error) and throughput
(``throughput``: GFLOP/s for ops with a reduction, GB/s for the others).
"""
from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from roller.errors import CheckError, CompileError, RollerError, ToolchainError

if TYPE_CHECKING:
    from roller.backends import Artifact, Backend, Runner
    from roller.hw import HardwareDesc
    from roller.ir.tensor_expr import TensorExpr
    from roller.numpy_reference import Bound
    from roller.program import RProgram

#: (rtol, atol) per output dtype for fixed-tolerance comparisons (``check_output`` without a bound, ``compare``);
#: kernels are checked with ``check_against``, whose bound follows the reduction's length and magnitudes
TOLERANCES = {"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (1e-2, 1e-2)}


# -- checks and rates --------------------------------------------------------------------------------------------

def tolerances(dtype: str) -> tuple[float, float]:
    return TOLERANCES.get(dtype, TOLERANCES["float32"])


def compare(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> tuple[bool, float, float, tuple]:
    """(ok, max abs error, max rel error, index of the worst element) of ``out`` against ``ref``."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        if out.size != ref.size:
            return False, math.inf, math.inf, ()
        out = out.reshape(ref.shape)
    same = (out == ref) | (np.isnan(out) & np.isnan(ref))  # equal infinities and NaN where expected
    diff = np.where(same, 0.0, np.abs(out - ref))
    diff = np.where(np.isnan(diff), np.inf, diff)
    bad = diff > atol + rtol * np.abs(np.where(np.isfinite(ref), ref, 0.0))
    if diff.size == 0:
        return True, 0.0, 0.0, ()
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    max_abs = float(diff[worst])
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(same, 0.0, diff / np.abs(ref))
    rel = np.where(np.isnan(rel), np.inf, rel)
    max_rel = float(rel.max())
    return not bool(bad.any()), max_abs, max_rel, tuple(int(i) for i in worst)


def check_output(what: str, out: np.ndarray, ref: np.ndarray, dtype: str = "float32",
                 rtol: float | None = None, atol: float | None = None, *, bound: Bound | None = None
                 ) -> tuple[float, float]:
    """Raise CheckError (exit 4) when ``out`` disagrees with ``ref``; returns (max abs, max rel) error.

    With ``bound`` (``roller.numpy_reference.bound``: what ``check_against`` passes) each element is held to its
    own a-priori error bound, which grows with the reduction's length and the magnitudes summed; without, to the
    fixed ``rtol``/``atol`` (default: ``tolerances(dtype)``)."""
    if tuple(np.shape(out)) != tuple(np.shape(ref)) and np.size(out) != np.size(ref):
        raise CheckError(f"{what}: output has shape {list(np.shape(out))}, roller.reference gives "
                         f"{list(np.shape(ref))}")
    if bound is None:
        dr, da = tolerances(dtype)
        rtol = dr if rtol is None else rtol
        atol = da if atol is None else atol
        with np.errstate(all="ignore"):
            ok, max_abs, max_rel, worst = compare(out, ref, rtol, atol)
        if not ok:
            n_bad = _count_bad(out, ref, rtol, atol)
            got = float(np.asarray(out, dtype=np.float64).reshape(np.shape(ref))[worst])
            want = float(np.asarray(ref, dtype=np.float64)[worst])
            raise CheckError(f"{what}: output differs from roller.reference in {n_bad} of {np.size(ref)} elements: "
                             f"max abs error {max_abs:.3g}, max rel error {max_rel:.3g} (at {list(worst)}: got "
                             f"{got:.9g}, expected {want:.9g}; rtol {rtol:g}, atol {atol:g})")
        return max_abs, max_rel
    return _check_bound(what, out, bound, dtype)


def check_against(what: str, op: TensorExpr, inputs: Mapping[str, np.ndarray], out: np.ndarray
                  ) -> tuple[float, float]:
    """The check of ``roller run --check``, ``evaluate=True`` and the tests: ``out`` (a kernel's output for
    ``inputs``) against roller.reference, each element within its error bound; CheckError otherwise."""
    from roller.numpy_reference import bound as error_bound

    src = op.source or op
    b = error_bound(src, inputs)
    return check_output(what, out, b.ref, src.output.dtype, bound=b)


def _check_bound(what: str, out: np.ndarray, b: Bound, dtype: str) -> tuple[float, float]:
    from roller.numpy_reference import np_dtype

    ref = b.ref
    o = np.asarray(out, dtype=np.float64).reshape(ref.shape)
    with np.errstate(all="ignore"):
        # Where the float64 reference exceeds the output dtype, or the terms' magnitudes the float32
        # accumulator, a correct kernel may overflow (to inf, or to NaN through inf - inf) where the reference
        # does not: an infinity or a NaN is then no error.
        top = float(np.finfo(np_dtype(dtype)).max)
        overflow = ((np.abs(ref) > top) | (b.magnitude > float(np.finfo(np.float32).max))) & ~np.isfinite(o)
        finite = np.isfinite(ref)
        same = (o == ref) | (np.isnan(o) & np.isnan(ref))
        diff = np.abs(o - ref)
        good = same | overflow | (finite & (diff <= b.bound))
        bad = ~good
        if bad.any():
            ratio = np.where(bad, np.where(np.isnan(diff), np.inf, diff) / np.maximum(b.bound, 1e-300), -1.0)
            at = np.unravel_index(int(np.argmax(ratio)), ref.shape)
            got, want, d, lim = float(o[at]), float(ref[at]), float(diff[at]), float(b.bound[at])
            if not finite[at] or np.isnan(got):
                why = "where the reference has " + (f"{want}" if not finite[at] else "a number")
            else:
                terms = (f"sum of {b.points} terms, sum |term| = {float(b.magnitude[at]):.4g}"
                         if b.reduce_op == "sum" and b.points > 1 else
                         f"{b.reduce_op} over {b.points} terms" if b.reduce_op else "no reduction")
                why = f"|difference| {d:.3g} > bound {lim:.3g} ({terms})"
            where = f"at {[int(i) for i in at]}" if at else "at the scalar output"
            raise CheckError(f"{what}: output differs from roller.reference beyond the error bound in "
                             f"{int(np.count_nonzero(bad))} of {ref.size} elements; worst {where}: got {got:.9g}, "
                             f"expected {want:.9g}, {why}")
        close = finite & ~same & ~overflow
        max_abs = float(diff[close].max()) if close.any() else 0.0
        rel = diff / np.abs(ref)
        max_rel = float(rel[close].max()) if close.any() else 0.0
    return max_abs, max_rel


def _count_bad(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> int:
    o = np.asarray(out, dtype=np.float64).reshape(np.shape(ref))
    r = np.asarray(ref, dtype=np.float64)
    same = (o == r) | (np.isnan(o) & np.isnan(r))
    with np.errstate(invalid="ignore"):
        close = np.abs(o - r) <= atol + rtol * np.abs(np.where(np.isfinite(r), r, 0.0))
    return int(np.count_nonzero(~(same | close)))


def throughput(expr: TensorExpr, seconds: float) -> tuple[float, str]:
    """(value, unit): GFLOP/s for ops with a reduction, GB/s of compulsory traffic for the others."""
    src = expr.source or expr
    if seconds <= 0:
        return math.inf, "GFLOP/s" if src.is_reduction else "GB/s"
    if src.is_reduction:
        return src.flops / seconds / 1e9, "GFLOP/s"
    return src.bytes / seconds / 1e9, "GB/s"


def ordered_inputs(launch: Mapping[str, Any], bound: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Inputs in the kernel's argument order (launch.json), from arrays by tensor name."""
    return [bound[a["name"]] for a in launch["arguments"] if a.get("role") == "input"]


def require_device(backend: Backend, hw: HardwareDesc | None = None, why: str = "") -> None:
    """ToolchainError (exit 5) unless ``backend`` can run kernels on this machine."""
    if backend.can_run_here():
        return
    from roller.backends import runs_here_instead

    reason = backend.why_not_here() or f"no {backend.name} device on this machine"
    instead = [name for name in runs_here_instead() if name != backend.name]
    hint = ""
    if instead:
        hint = (f" (the {instead[0]} backend runs every description's kernels on this machine's device: add "
                f"--backend {instead[0]})")
    target = f" for {hw.name}" if hw is not None else ""
    raise ToolchainError(f"{why or 'running kernels'} needs the {backend.name} backend{target} on this "
                         f"machine: {reason}{hint}")


# -- progress ----------------------------------------------------------------------------------------------------

class Progress:
    """``label [#####.....] 5/10`` on a terminal; silent otherwise."""

    def __init__(self, total: int, label: str, stream: IO[str] | None = None, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.total = max(1, total)
        self.done = 0
        self.label = label
        self._draw("")

    def step(self, note: str = "") -> None:
        self.done = min(self.total, self.done + 1)
        self._draw(note)

    def _draw(self, note: str) -> None:
        if not self.enabled:
            return
        width = 24
        filled = int(width * self.done / self.total)
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {note[:40]:<40}")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * (len(self.label) + 72) + "\r")
            self.stream.flush()


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


def evaluate(op: TensorExpr, programs: Sequence[RProgram], hw: HardwareDesc, backend: Backend,
             inputs: Mapping[str, np.ndarray] | None = None, repeat: int = 10, warmup: int = 2,
             jobs: int | None = None, progress: bool | None = None, check: bool = True,
             workdir: Path | None = None, label: str | None = None) -> Evaluation:
    """Compile ``programs`` in parallel, time each on this machine's device, check and return the fastest."""
    from roller.cache import toolchain_version
    from roller.numpy_reference import random_inputs

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

        def build(c: Candidate) -> None:
            if c.artifact is None:
                return
            t = time.perf_counter()
            try:
                c.runner = backend.compile(c.artifact, hw, workdir)
            except CompileError as err:
                c.error = f"compile: {_short(err)}"
                c._compile_error = err  # type: ignore[attr-defined]
            except ToolchainError:
                raise
            except Exception as err:  # noqa: BLE001 - one bad candidate must not end the evaluation
                c.error = f"compile: {err.__class__.__name__}: {_short(err)}"
            c.compile_s = time.perf_counter() - t

        workers = max(1, min(len(cands), jobs or os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(build, c) for c in cands]
            for f in futures:
                f.result()
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
