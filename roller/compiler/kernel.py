"""One op's kernel: ``roller.compile(op, hw=...)`` -> a callable ``Kernel``.

>>> import numpy as np, roller
>>> k = roller.compile({"op": "matmul", "M": 64, "N": 32, "K": 16}, hw="v100", backend="opencl")
>>> a, b = np.ones((64, 16), np.float32), np.ones((16, 32), np.float32)
>>> float(k(a, b)[0, 0]), float(k(A=a, B=b)[0, 0])
(16.0, 16.0)

Results are cached on disk (``roller.cache``): a second ``compile`` of the same op for the same description,
backend, toolchain and roller version skips construction, rendering and evaluation.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from roller import cache as _cache
from roller.backends import Artifact, ordered_inputs, require_device
from roller.compiler.artifact import BuildFolder
from roller.compiler.target import Target
from roller.dtypes import dtype as dtype_of
from roller.errors import InputError
from roller.ir.opfile import OpLike, load_op
from roller.ir.tensor_expr import TensorExpr
from roller.program import RProgram


def source_op(op: OpLike) -> TensorExpr:
    """The user's op (unprepared) from a dict, a path or a TensorExpr; exactly one op."""
    expr = load_op(op)
    return expr.source or expr


@dataclass
class Kernel(BuildFolder):
    """A constructed, rendered kernel for one op on one description; call it with numpy arrays."""

    op: TensorExpr  # the source op (as written)
    target: Target
    programs: list[RProgram]  # the top-K RPrograms, best predicted first
    chosen: int  # index of the chosen program in ``programs``
    artifact: Artifact
    evaluation: dict[str, Any] | None = None  # eval.json content when chosen by measurement
    cache_hit: bool = False
    cache_path: Path | None = None
    construction_s: float = 0.0
    top_k: int = 10  # the candidates asked of construction
    _runner: Any = field(default=None, repr=False)

    # -- what was built ---------------------------------------------------------------------------------------
    @property
    def program(self) -> RProgram:
        return self.programs[self.chosen]

    @property
    def source(self) -> str:
        return self.artifact.source

    @property
    def files(self) -> dict[str, str]:
        return dict(self.artifact.files)

    @property
    def launch(self) -> dict[str, Any]:
        return self.artifact.launch

    @property
    def predicted_ms(self) -> float | None:
        p = self.program.prediction
        return p.time_s * 1e3 if p else None

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.op.inputs]

    @property
    def output_name(self) -> str:
        return self.op.output.name

    @property
    def output_shape(self) -> tuple[int, ...]:
        return tuple(self.op.output.storage_shape)

    @property
    def name(self) -> str:
        return self.op.name

    def __repr__(self) -> str:
        return (f"<roller.Kernel {self.op.name} on {self.hw.name}/{self.backend.name}: {self.program.line()}"
                f"{', cached' if self.cache_hit else ''}>")

    # -- running ----------------------------------------------------------------------------------------------
    @property
    def runner(self) -> Any:
        """The compiled kernel on this machine's device (compiled on first use)."""
        if self._runner is None:
            from roller.backends import require_device

            require_device(self.backend, self.hw, why="running a kernel")
            self._runner = self.backend.compile(self.artifact, self.hw, None)
        return self._runner

    def bind(self, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Inputs by position (``input_names`` order) and/or by name, as contiguous arrays of the op's dtypes."""
        from roller.ir.reference import bind_inputs, np_dtype

        bound = bind_inputs(self.op, tuple(args), dict(kwargs or {}))
        return {t.name: np.ascontiguousarray(bound[t.name], dtype=np_dtype(t.dtype)) for t in self.op.inputs}

    def __call__(self, *args: Any, out: np.ndarray | None = None, **kwargs: Any) -> np.ndarray:
        from roller.ir.reference import np_dtype

        bound = self.bind(args, kwargs)
        dtype = np_dtype(self.op.output.dtype)
        launch_shape = tuple(self.launch["arguments"][-1]["shape"])
        target = None
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise InputError(f"out= must be a numpy array, got {type(out).__name__}")
            if tuple(out.shape) != self.output_shape or out.dtype != dtype:
                raise InputError(f"out= must have shape {list(self.output_shape)} and dtype {np.dtype(dtype).name}, "
                                 f"got {list(out.shape)} {out.dtype}")
            if not (out.flags.c_contiguous and out.flags.writeable):
                raise InputError("out= must be a writeable C-contiguous array")
            target = out.reshape(launch_shape)
        result = self.runner(ordered_inputs(self.launch, bound), out=target)
        if out is not None and target is not None:
            if result is not target:
                target[...] = np.asarray(result).reshape(launch_shape)
            return out
        kind = dtype_of(self.op.output.dtype)
        values = np.asarray(result)
        if values.dtype == kind.storage and kind.storage != kind.host:   # a bool output comes back as bytes
            values = kind.from_storage(values)
        return values.reshape(self.output_shape)

    def benchmark(self, repeat: int = 10, warmup: int = 2, inputs: Mapping[str, np.ndarray] | None = None) -> float:
        """Median kernel time in seconds on this machine's device (random inputs, seed 0, unless given)."""
        from roller.ir.reference import random_inputs

        if repeat < 1:
            raise InputError(f"repeat must be at least 1, got {repeat}")
        bound = self.bind((), inputs) if inputs is not None else random_inputs(self.op, seed=0)
        return float(self.runner.time(ordered_inputs(self.launch, bound), repeat=repeat, warmup=warmup))

    def reference(self, *args: Any, **kwargs: Any) -> np.ndarray:
        """roller.reference on the same inputs (by position or name)."""
        from roller.ir.reference import reference

        return reference(self.op, self.bind(args, kwargs))

    # -- build folders (roller.compiler.artifact) ------------------------------------------------------------
    def report(self, files: Sequence[str] = ()) -> dict[str, Any]:
        """What ``report.json`` holds: the op, the description, how the kernel was chosen, every candidate."""
        from roller import __version__

        ev = self.evaluation
        measured = {c["rank"]: c["measured_ms"] for c in ev["candidates"]} if ev else {}
        candidates = []
        for i, p in enumerate(self.programs):
            c: dict[str, Any] = {"rank": i + 1, "line": p.line(),
                                 "predicted_ms": p.prediction.time_s * 1e3 if p.prediction else None,
                                 "bottleneck": p.prediction.bottleneck if p.prediction else None,
                                 "fraction_of_peak": p.prediction.fraction_of_peak if p.prediction else None,
                                 "padding_waste": p.padding_waste}
            if ev is not None:
                c["measured_ms"] = measured.get(i + 1)
            candidates.append(c)
        report: dict[str, Any] = {
            "op": self.op.name, "op_hash": self.op.content_hash(), "statement": self.op.statement(),
            "hw": {"name": self.hw.name, "hash": self.hw.content_hash(), "source": self.hw.source},
            "backend": self.backend.name, "roller_version": __version__, "top_k": self.top_k,
            "construction_s": self.construction_s, "chosen": self.chosen,
            "chosen_by": "measurement" if ev is not None else "model",
            "line": self.program.line(), "main_file": self.artifact.main_file, "files": list(files),
            "candidates": candidates,
        }
        if ev is not None:
            report["device"] = ev["device"]
            report["rank_correlation"] = ev["rank_correlation"]
        return report

    def write(self, folder: Path) -> dict[str, Any]:
        """The kernel's build folder, made at ``folder`` (which must not exist); returns ``report.json``."""
        from roller.compiler.artifact import write_json, write_kernel_files

        written = write_kernel_files(folder, self.artifact, self.program.to_json())
        if self.evaluation is not None:
            write_json(folder / "eval.json", self.evaluation)
            written.append("eval.json")
        written.append("report.json")
        report = self.report(written)
        write_json(folder / "report.json", report)
        return report

    @classmethod
    def load(cls, folder: str | os.PathLike, hw: Any = None) -> Kernel:
        """The kernel a build folder holds (``write``), for ``hw`` (default: the description it was built for,
        refused where that description has changed since): nothing is constructed or rendered again."""
        from roller.compiler.artifact import damaged, read_artifact, read_json, read_program, target_of

        path = Path(folder)
        report = read_json(path / "report.json")
        if not isinstance(report, dict) or not isinstance(report.get("hw"), dict) or \
                not isinstance(report.get("backend"), str):
            raise damaged(path / "report.json", "expected an object with 'hw' and 'backend'")
        target = target_of(path, report["hw"], report["backend"], hw)
        prog = read_program(path / "rprogram.json")
        art = read_artifact(path, str(report.get("main_file", "")), report.get("files"))
        evaluation = read_json(path / "eval.json") if (path / "eval.json").is_file() else None
        top_k = report.get("top_k")
        return cls(prog.expr.source or prog.expr, target, [prog], 0, art, evaluation=evaluation,
                   top_k=top_k if isinstance(top_k, int) and top_k > 0 else 1)


def build_kernel(src: TensorExpr, target: Target, top_k: int = 10, evaluate: bool = False,
                 use_cache: bool = True, repeat: int = 10, progress: bool | None = None) -> Kernel:
    """``src``'s kernel for ``target``: from the kernel cache, or constructed (``target.programs``), rendered
    and, with ``evaluate``, chosen by timing the top-K on this machine's device."""
    return build_kernels([src], target, top_k, evaluate, use_cache, repeat, progress)[0]


def build_kernels(srcs: Sequence[TensorExpr], target: Target, top_k: int = 10, evaluate: bool = False,
                  use_cache: bool = True, repeat: int = 10, progress: bool | None = None) -> list[Kernel]:
    """``build_kernel`` of each of ``srcs``; those not in the cache evaluated together where ``evaluate``
    (``roller.compiler.tune.evaluate_many``: one batch of compiles per round for all of them)."""
    hwd, be = target.hw, target.backend
    for src in srcs:
        if src.typed and not be.typed_bodies:
            raise InputError(f"{src.name}: the {be.name} backend does not render integer and bool element types "
                             f"yet (the op computes in {src.acc_dtype}); roller.reference evaluates it")
        odd = sorted({t.dtype for t in src.tensors} - set(be.dtypes))
        if odd:
            raise InputError(f"{src.name}: the {be.name} backend does not render {', '.join(odd)} tensors (it renders "
                             f"{', '.join(be.dtypes)})", field="dtype")
    if evaluate:
        require_device(be, hwd, why="evaluate=True (timing candidates)")
    use_cache = use_cache and _cache.enabled()
    out: list[Kernel | None] = [None] * len(srcs)
    keys: list[tuple[str, dict[str, Any]] | None] = [None] * len(srcs)
    for i, src in enumerate(srcs):
        if use_cache:
            parts = _cache.key_parts(src.content_hash(), src.name, hwd.content_hash(), be, top_k, evaluate)
            key = _cache.make_key(parts)
            keys[i] = (key, parts)
            entry = _cache.lookup(key)
            if entry is not None:
                out[i] = _from_entry(src, target, entry, top_k)
                if out[i] is None:
                    _cache.last_event = "damaged: entry does not match the op"
                    if entry.path is not None:
                        _cache.remove(entry.path)
    todo = [i for i, k in enumerate(out) if k is None]
    for i, kernel in zip(todo, _construct_kernels([srcs[i] for i in todo], target, top_k, evaluate, repeat,
                                                  progress)):
        out[i] = kernel
        keyed = keys[i]
        if keyed is not None:
            key, parts = keyed
            art = kernel.artifact
            entry = _cache.Entry(files=dict(art.files), main_file=art.main_file, kernel_name=art.kernel_name,
                                 launch=art.launch, programs=[p.to_json() for p in kernel.programs],
                                 chosen=kernel.chosen, evaluation=kernel.evaluation, parts=parts)
            kernel.cache_path = _cache.store(key, entry)
    return [k for k in out if k is not None]


def _construct_kernels(srcs: Sequence[TensorExpr], target: Target, top_k: int, evaluate: bool, repeat: int,
                       progress: bool | None) -> list[Kernel]:
    built: list[tuple[list[RProgram], float]] = []
    for src in srcs:
        t = time.perf_counter()
        progs = target.programs(src, top_k)
        built.append((list(progs), time.perf_counter() - t))
    if not evaluate:
        return [Kernel(src, target, progs, 0, target.backend.render(progs[0], target.hw), construction_s=secs,
                       top_k=top_k) for src, (progs, secs) in zip(srcs, built)]
    from roller.compiler.tune import evaluate_many

    found = evaluate_many([(src, progs) for src, (progs, _) in zip(srcs, built)], target.hw, target.backend,
                          repeat=repeat, progress=progress)
    out = []
    for src, (progs, secs), ev in zip(srcs, built, found):
        if isinstance(ev, Exception):
            raise ev
        chosen = ev.chosen
        assert chosen.artifact is not None   # the chosen candidate is one that was rendered, compiled and timed
        out.append(Kernel(src, target, progs, ev.best, chosen.artifact, evaluation=ev.to_json(),
                          construction_s=secs, top_k=top_k, _runner=chosen.runner))
    return out


def _from_entry(src: TensorExpr, target: Target, entry: _cache.Entry, top_k: int) -> Kernel | None:
    try:
        progs = [RProgram.from_json(d, src) for d in entry.programs]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if any(len(p.tiles) != len(target.hw.memory) - 1 for p in progs):
        return None
    art = Artifact(entry.kernel_name, dict(entry.files), entry.launch, main_file=entry.main_file)
    return Kernel(src, target, progs, entry.chosen, art, evaluation=entry.evaluation, cache_hit=True,
                  cache_path=entry.path, top_k=top_k)
