"""Python API: ``roller.compile(op, hw=...)`` -> a callable ``Kernel``.

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
from typing import TYPE_CHECKING, Any

import numpy as np

from roller import backends as _backends
from roller import cache as _cache
from roller.errors import InputError
from roller.hw import HardwareDesc, list_bundled, list_local
from roller.hw import load as load_hw
from roller.ir.opfile import OpLike, load_op
from roller.ir.tensor_expr import TensorExpr
from roller.program import RProgram

if TYPE_CHECKING:
    from roller.shape_generic import GenericKernel

HwLike = str | os.PathLike | HardwareDesc


def resolve_hw(hw: HwLike | None, overrides: Mapping[str, Any] | None = None) -> HardwareDesc:
    if hw is None:
        local = f"; measured here: {', '.join(list_local())}" if list_local() else ""
        raise InputError("compile needs hw=NAME|FILE|HardwareDesc (bundled: "
                         + ", ".join(list_bundled()) + local + ")")
    if isinstance(hw, HardwareDesc):
        if overrides:
            raise InputError("overrides apply to a description loaded by name or path, not to a HardwareDesc")
        return hw
    return load_hw(hw, overrides=overrides)


def source_op(op: OpLike) -> TensorExpr:
    """The user's op (unprepared) from a dict, a path or a TensorExpr; exactly one op."""
    expr = load_op(op)
    return expr.source or expr


def construct(op: OpLike, hw: HwLike, top_k: int = 10, backend: str | None = None) -> list[RProgram]:
    """The ``top_k`` rPrograms of ``op`` on ``hw``, best predicted first, for the backend that will render
    them (default: the description's): matrix-instruction programs only where that backend renders them."""
    from roller.construction import construct as construct_programs

    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InputError(f"top_k must be a positive integer, got {top_k!r}")
    hwd = resolve_hw(hw)
    be = _backends.for_hw(hwd, backend)
    return construct_programs(source_op(op), hwd, top_k=top_k, matrix=be.matrix_support)


@dataclass
class Kernel:
    """A constructed, rendered kernel for one op on one description; call it with numpy arrays."""

    op: TensorExpr  # the source op (as written)
    hw: HardwareDesc
    backend: Any  # roller.backends.Backend
    programs: list  # the top-K RPrograms, best predicted first
    chosen: int  # index of the chosen program in ``programs``
    artifact: Any  # roller.backends.Artifact
    evaluation: dict[str, Any] | None = None  # eval.json content when chosen by measurement
    cache_hit: bool = False
    cache_path: Path | None = None
    construction_s: float = 0.0
    _runner: Any = field(default=None, repr=False)

    # -- what was built ---------------------------------------------------------------------------------------
    @property
    def program(self) -> Any:
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
            from roller.evaluate import require_device

            require_device(self.backend, self.hw, why="running a kernel")
            self._runner = self.backend.compile(self.artifact, self.hw, None)
        return self._runner

    def bind(self, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Inputs by position (``input_names`` order) and/or by name, as contiguous arrays of the op's dtypes."""
        from roller.numpy_reference import bind_inputs, np_dtype

        bound = bind_inputs(self.op, tuple(args), dict(kwargs or {}))
        return {t.name: np.ascontiguousarray(bound[t.name], dtype=np_dtype(t.dtype)) for t in self.op.inputs}

    def __call__(self, *args: Any, out: np.ndarray | None = None, **kwargs: Any) -> np.ndarray:
        from roller.evaluate import ordered_inputs
        from roller.numpy_reference import np_dtype

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
        return np.asarray(result).reshape(self.output_shape)

    def benchmark(self, repeat: int = 10, warmup: int = 2, inputs: Mapping[str, np.ndarray] | None = None) -> float:
        """Median kernel time in seconds on this machine's device (random inputs, seed 0, unless given)."""
        from roller.evaluate import ordered_inputs
        from roller.numpy_reference import random_inputs

        if repeat < 1:
            raise InputError(f"repeat must be at least 1, got {repeat}")
        bound = self.bind((), inputs) if inputs is not None else random_inputs(self.op, seed=0)
        return float(self.runner.time(ordered_inputs(self.launch, bound), repeat=repeat, warmup=warmup))

    def reference(self, *args: Any, **kwargs: Any) -> np.ndarray:
        """roller.reference on the same inputs (by position or name)."""
        from roller.numpy_reference import reference

        return reference(self.op, self.bind(args, kwargs))


def compile(op: OpLike, hw: HwLike | None = None, backend: str | None = None, top_k: int = 10,
            evaluate: bool = False, *, overrides: Mapping[str, Any] | None = None, cache: bool = True,
            repeat: int = 10, progress: bool | None = None) -> Kernel | GenericKernel:
    """Construct the top-K rPrograms of ``op`` on ``hw``, render the best one (by the model, or by measurement
    on this machine with ``evaluate=True``) with ``backend`` (default: the description's), and return it as a
    callable Kernel. ``op``: an op.json dict, a path, or a TensorExpr (one op). An op with a symbolic size
    (``"M": "m"``) gives a ``roller.shape_generic.GenericKernel``, callable at every size in the symbol's
    range (with ``evaluate=True``, its kernels are chosen by timing the model's shortlist at sample sizes)."""
    from roller.ir.symbolic import load_symbolic

    symbolic = load_symbolic(op) if isinstance(op, (dict, str, os.PathLike)) else None
    src = source_op(op) if symbolic is None else None
    hwd = resolve_hw(hw, overrides)
    be = _backends.for_hw(hwd, backend)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InputError(f"top_k must be a positive integer, got {top_k!r}")
    if symbolic is not None:
        from roller.shape_generic import compile_generic

        return compile_generic(symbolic, hwd, be, top_k=top_k, evaluate=evaluate, repeat=repeat, progress=progress)
    assert src is not None
    return build_kernel(src, hwd, be, top_k=top_k, evaluate=evaluate, use_cache=cache, repeat=repeat,
                        progress=progress)


def build_kernel(src: TensorExpr, hwd: HardwareDesc, be: Any, top_k: int = 10, evaluate: bool = False,
                 use_cache: bool = True, repeat: int = 10, progress: bool | None = None) -> Kernel:
    """compile() after argument checking; shared with ``roller run``."""
    from roller.evaluate import require_device

    if evaluate:
        require_device(be, hwd, why="evaluate=True (timing candidates)")
    use_cache = use_cache and _cache.enabled()
    key = parts = None
    if use_cache:
        parts = _cache.key_parts(src.content_hash(), src.name, hwd.content_hash(), be, top_k, evaluate)
        key = _cache.make_key(parts)
        entry = _cache.lookup(key)
        if entry is not None:
            kernel = _from_entry(src, hwd, be, entry)
            if kernel is not None:
                return kernel
            _cache.last_event = "damaged: entry does not match the op"
            if entry.path is not None:
                _cache.remove(entry.path)
    kernel = _construct_kernel(src, hwd, be, top_k, evaluate, repeat, progress)
    if use_cache and key is not None:
        art = kernel.artifact
        entry = _cache.Entry(files=dict(art.files), main_file=art.main_file, kernel_name=art.kernel_name,
                             launch=art.launch, programs=[p.to_json() for p in kernel.programs],
                             chosen=kernel.chosen, evaluation=kernel.evaluation, parts=parts or {})
        kernel.cache_path = _cache.store(key, entry)
    return kernel


def _construct_kernel(src: TensorExpr, hwd: HardwareDesc, be: Any, top_k: int, evaluate: bool, repeat: int,
                      progress: bool | None) -> Kernel:
    from roller.construction import construct as construct_programs

    t = time.perf_counter()
    progs = construct_programs(src, hwd, top_k=top_k, matrix=be.matrix_support)
    construction_s = time.perf_counter() - t
    if evaluate:
        from roller.evaluate import evaluate as run_eval

        ev = run_eval(src, progs, hwd, be, repeat=repeat, progress=progress)
        chosen = ev.chosen
        return Kernel(src, hwd, be, list(progs), ev.best, chosen.artifact, evaluation=ev.to_json(),
                      construction_s=construction_s, _runner=chosen.runner)
    art = be.render(progs[0], hwd)
    return Kernel(src, hwd, be, list(progs), 0, art, construction_s=construction_s)


def _from_entry(src: TensorExpr, hwd: HardwareDesc, be: Any, entry: _cache.Entry) -> Kernel | None:
    from roller.backends import Artifact

    try:
        progs = [RProgram.from_json(d, src) for d in entry.programs]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if any(len(p.tiles) != len(hwd.memory) - 1 for p in progs):
        return None
    art = Artifact(entry.kernel_name, dict(entry.files), entry.launch, main_file=entry.main_file)
    return Kernel(src, hwd, be, progs, entry.chosen, art, evaluation=entry.evaluation, cache_hit=True,
                  cache_path=entry.path)
