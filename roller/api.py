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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import numpy as np

from roller import backends as _backends
from roller import cache as _cache
from roller.errors import InputError
from roller.hw import HardwareDesc
from roller.hw import list_bundled
from roller.hw import load as load_hw
from roller.ir.opfile import OpLike, load_op
from roller.ir.tensor_expr import TensorExpr

HwLike = Union[str, os.PathLike, HardwareDesc]


def resolve_hw(hw: HwLike | None, overrides: Mapping[str, Any] | None = None) -> HardwareDesc:
    if hw is None:
        raise InputError("compile needs hw=NAME|FILE|HardwareDesc (bundled: "
                         + ", ".join(list_bundled()) + ")")
    if isinstance(hw, HardwareDesc):
        if overrides:
            raise InputError("overrides apply to a description loaded by name or path, not to a HardwareDesc")
        return hw
    return load_hw(hw, overrides=overrides)


def source_op(op: OpLike) -> TensorExpr:
    """The user's op (unprepared) from a dict, a path or a TensorExpr; exactly one op."""
    expr = load_op(op)
    return expr.source or expr


def program_from_json(doc: Mapping[str, Any], expr: TensorExpr, hw: HardwareDesc) -> "Any":
    """Rebuild an RProgram from ``RProgram.to_json()`` for the prepared expression it was constructed for."""
    from roller.construct.rtile import Prediction, RProgram, RTile

    if doc.get("op_hash") != expr.content_hash():
        raise ValueError("rProgram belongs to another op")
    p = doc.get("prediction")
    pred = None
    if p is not None:
        pred = Prediction(time_s=p["time_ms"] / 1e3, bottleneck=p["bottleneck"],
                          fraction_of_peak=p["fraction_of_peak"],
                          layer_times_s=tuple((k, v / 1e3) for k, v in p["layer_times_ms"].items()),
                          compute_time_s=p["compute_time_ms"] / 1e3, waves=p["waves"],
                          blocks_per_unit=p["blocks_per_unit"], registers_per_thread=p["registers_per_thread"])
    tiles = tuple(RTile(tuple(int(s) for s in t["shape"]),
                        tuple(sorted((str(k), int(v)) for k, v in t["storage_padding"].items())))
                  for t in doc["tiles"])
    if len(tiles) != len(hw.memory) - 1 or len(tiles[0].shape) != len(expr.axes):
        raise ValueError("rProgram does not fit the description")
    return RProgram(expr=expr, hw_name=doc["hw"], hw_hash=doc["hw_hash"], layers=tuple(doc["layers"]),
                    scopes=tuple(m.scope for m in hw.memory), tiles=tiles, grid=int(doc["grid"]),
                    block=int(doc["block"]), block_level=int(doc["block_level"]),
                    thread_level=int(doc["thread_level"]), reduce_threads=int(doc.get("reduce_threads", 1)),
                    epsilon=float(doc.get("epsilon", 0.0)), padding_waste=float(doc.get("padding_waste", 0.0)),
                    use_matrix=bool(doc.get("use_matrix", False)), prediction=pred)


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
        if out is not None:
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
            repeat: int = 10, progress: bool | None = None) -> Kernel:
    """Construct the top-K rPrograms of ``op`` on ``hw``, render the best one (by the model, or by measurement
    on this machine with ``evaluate=True``) with ``backend`` (default: the description's), and return it as a
    callable Kernel. ``op``: an op.json dict, a path, or a TensorExpr (one op)."""
    src = source_op(op)
    hwd = resolve_hw(hw, overrides)
    be = _backends.for_hw(hwd, backend)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InputError(f"top_k must be a positive integer, got {top_k!r}")
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
        parts = _cache.key_parts(src.content_hash(), src.name, hwd.content_hash(), be.name,
                                 _cache.toolchain_version(be), top_k, evaluate)
        key = _cache.make_key(parts)
        entry = _cache.lookup(key)
        if entry is not None:
            kernel = _from_entry(src, hwd, be, entry)
            if kernel is not None:
                return kernel
            _cache.last_event = "damaged: entry does not match the op"
            if entry.path is not None:
                _cache._remove(entry.path)
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
    from roller.construct import construct

    t = time.perf_counter()
    progs = construct(src, hwd, top_k=top_k)
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
    from roller.ir.fuse import prepare

    try:
        expr = prepare(src)
        progs = [program_from_json(d, expr, hwd) for d in entry.programs]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    art = Artifact(entry.kernel_name, dict(entry.files), entry.launch, main_file=entry.main_file)
    return Kernel(src, hwd, be, progs, entry.chosen, art, evaluation=entry.evaluation, cache_hit=True,
                  cache_path=entry.path)
