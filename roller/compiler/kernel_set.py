"""``roller.compile`` of an op with a symbolic size: one build, called at any size in the symbol's range.

>>> import numpy as np, roller
>>> k = roller.compile({"op": "matmul", "M": "m", "N": 64, "K": 32, "symbols": {"m": [1, 256]}}, hw="pocl-cpu")
>>> k(np.ones((7, 32), np.float32), np.ones((32, 64), np.float32)).shape
(7, 64)

Where one kernel cannot serve every size (``roller.construction.generic.generic_axis`` says why), the kernel is
built for each size on its first call instead (cached by shape, like any op): ``mode`` tells which.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from roller.compiler.artifact import BuildFolder
from roller.compiler.target import Target
from roller.construction.generic import KernelSet, construct_generic
from roller.errors import InputError
from roller.hw import HardwareDesc
from roller.ir.symbolic import SymbolicOp
from roller.ir.tensor_expr import TensorExpr
from roller.program import RProgram


@dataclass
class GenericKernel(BuildFolder):
    """A symbolic op built once for every size of its symbol (``mode == "generic"``), or per size
    (``mode == "per-size"``, ``why`` says why); call it with numpy arrays of any size in range."""

    op: SymbolicOp
    target: Target
    kernels: KernelSet | None
    why: str = ""
    artifacts: list[Any] = field(default_factory=list)  # one per kept program (generic mode)
    construction_s: float = 0.0
    top_k: int = 10
    # candidates that timing could not render, compile or run, and why (None: not chosen by timing)
    not_timed: list[str] | None = None
    _runners: dict[int, Any] = field(default_factory=dict, repr=False)
    _per_size: dict[tuple[int, ...], Any] = field(default_factory=dict, repr=False)

    @property
    def mode(self) -> str:
        return "generic" if self.kernels is not None else "per-size"

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def compiled(self) -> int:
        """Kernels compiled so far on this machine's device."""
        return len(self._runners) + len(self._per_size)

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self._greatest.inputs]

    @property
    def _greatest(self) -> TensorExpr:
        return self.op.instantiate({s: r[1] for s, r in self.op.ranges.items()})

    def __repr__(self) -> str:
        what = f"{len(self.artifacts)} kernels" if self.kernels is not None else f"per size ({self.why})"
        ranges = ", ".join(f"{s} in [{lo}, {hi}]" for s, (lo, hi) in self.op.ranges.items())
        return f"<roller.GenericKernel {self.name} on {self.hw.name}/{self.backend.name}: {ranges}, {what}>"

    # -- choosing ---------------------------------------------------------------------------------------------
    def bind(self, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> tuple[dict[str, int],
                                                                                               dict[str, np.ndarray]]:
        """(symbol values, inputs by name) of a call: arrays by position (``input_names`` order) or name."""
        names = self.input_names
        if len(args) > len(names):
            raise InputError(f"{self.name} takes {len(names)} inputs ({', '.join(names)}), got {len(args)}")
        arrays: dict[str, Any] = dict(zip(names, args))
        for k, v in (kwargs or {}).items():
            if k not in names:
                raise InputError(f"{self.name} has no input {k!r} (inputs: {', '.join(names)})")
            if k in arrays:
                raise InputError(f"{self.name}: input {k!r} given twice")
            arrays[k] = v
        missing = [n for n in names if n not in arrays]
        if missing:
            raise InputError(f"{self.name}: missing input {missing[0]!r}")
        bound = {k: np.asarray(v) for k, v in arrays.items()}
        values = self.op.bind({k: tuple(v.shape) for k, v in bound.items()})
        return values, bound

    def choice(self, **values: int) -> dict[str, Any]:
        """What a call at these symbol values runs: the kept program, its predicted time and launch."""
        if self.kernels is None:
            return {"mode": self.mode, "why": self.why}
        v = self._value(values)
        i = self.kernels.choose(v)
        return {"mode": self.mode, "kernel": i, "line": self.kernels.programs[i].line(),
                "blocks": self.kernels.blocks(i, v), "rows": self.kernels.rows(i, v),
                "predicted_ms": self.kernels.predict(i, v) * 1e3}

    def _value(self, values: Mapping[str, int]) -> int:
        assert self.kernels is not None
        self.op.check_values({**{s: r[1] for s, r in self.op.ranges.items()}, **values})
        return int(values.get(self.kernels.axis.symbol, self.kernels.greatest))

    # -- running ----------------------------------------------------------------------------------------------
    def runner(self, index: int) -> Any:
        """Kept program ``index`` compiled on this machine's device (on first use)."""
        if index not in self._runners:
            from roller.backends import require_device

            require_device(self.backend, self.hw, why="running a kernel")
            self._runners[index] = self.backend.compile(self.artifacts[index], self.hw, None)
        return self._runners[index]

    def warm(self) -> None:
        """Compile every kept kernel and launch each once, so that no call, at any size, waits for a compiler
        (PoCL finishes compiling a kernel at its first launch, for the work-group size it is launched with)."""
        from roller.ir.reference import np_dtype

        assert self.kernels is not None
        missing = [i for i in range(len(self.artifacts)) if i not in self._runners]
        if missing:   # in one batch: the backend compiles many kernels faster than one by one
            self._runners.update(zip(missing, self.backend.compile_many([self.artifacts[i] for i in missing],
                                                                        self.hw)))
        sym = self.kernels.axis.symbol
        least = {**{s: r[1] for s, r in self.op.ranges.items()}, sym: self.op.ranges[sym][0]}
        expr = self.op.instantiate(least)
        zeros: dict[str, np.ndarray] = {t.name: np.zeros(t.storage_shape, np_dtype(t.dtype)) for t in expr.inputs}
        for i in range(len(self.artifacts)):
            runner, inputs, _ = self.prepare(least, zeros, index=i)
            runner(inputs)

    def check(self) -> None:
        """Run each kept kernel at the least sample size it is chosen for (else the least size) on random inputs
        and check it against roller.reference (CheckError if it is off)."""
        from roller.compiler.check import check_against
        from roller.ir.reference import random_inputs

        assert self.kernels is not None
        ks = self.kernels
        base = {s: r[1] for s, r in self.op.ranges.items()}
        for i, prog in enumerate(ks.programs):
            v = next((v for v in ks.samples if ks.choose(v) == i), self.op.ranges[ks.axis.symbol][0])
            values = {**base, ks.axis.symbol: v}
            expr = self.op.instantiate(values)
            bound = random_inputs(expr, seed=1)
            check_against(f"{self.name} at {ks.axis.symbol}={v}, kernel {i} ({prog.line()})", expr, bound,
                          self._run(values, bound, i))

    def specialised(self, values: Mapping[str, int]) -> Any:
        """The ordinary kernel built for exactly these values (per-size mode; cached on disk like any op)."""
        from roller.compiler.kernel import build_kernel

        key = self.op.check_values(values)
        if key not in self._per_size:
            self._per_size[key] = build_kernel(self.op.instantiate(values), self.target, top_k=self.top_k)
        return self._per_size[key]

    def prepare(self, values: Mapping[str, int], bound: Mapping[str, np.ndarray], index: int | None = None
                ) -> tuple[Any, list[np.ndarray], tuple[int, ...]]:
        """(runner, inputs in launch order, output shape as launched) of a call, on the kept program the model
        picks (or ``index``): the inputs that grow with the symbol are given the rows the launched blocks read,
        zeros past the call's own (kernels that take the size as an argument: every tensor in its layout at the
        greatest size)."""
        from roller.backends import ordered_inputs
        from roller.ir.reference import np_dtype
        from roller.program import pad_input

        assert self.kernels is not None
        ks = self.kernels
        v = self._value(values)
        i = ks.choose(v) if index is None else index
        rows = ks.rows(i, v)
        expr = self.op.instantiate(values)
        if ks.scalar_args:
            return self._prepare_runtime(i, v, expr, bound)
        launch = self.artifacts[i].launch
        pads = {a["name"]: a["pad"] for a in launch["arguments"] if a.get("pad") is not None}
        arrays: dict[str, np.ndarray] = {}
        for t in expr.inputs:
            a: np.ndarray = np.ascontiguousarray(bound[t.name], dtype=np_dtype(t.dtype))
            if t.name in ks.axis.tensors:
                a = _grown(a, *self._growth(t.name), rows)
            if t.name in pads:
                # The launcher pads an input of the shape it was built for; at another size the padded copy
                # is made here (its pads do not involve the symbol's dimension: generic_axis checked).
                pad = pads[t.name]
                a = pad_input(a, tuple(zip(pad["before"], pad["after"])), float(pad["value"]))
            arrays[t.name] = a
        dim, per = self._growth(expr.output.name)
        out_shape = _grown_shape(tuple(expr.output.storage_shape), dim, per, rows)
        inputs = ordered_inputs(launch, arrays)
        runner = self.runner(i).with_launch(ks.blocks(i, v), [*(a.shape for a in inputs), out_shape])
        return runner, inputs, out_shape

    def _prepare_runtime(self, i: int, v: int, expr: TensorExpr, bound: Mapping[str, np.ndarray]
                         ) -> tuple[Any, list[np.ndarray], tuple[int, ...]]:
        from roller.backends import ordered_inputs
        from roller.ir.reference import np_dtype

        assert self.kernels is not None
        ks = self.kernels
        greatest = ks.source(ks.greatest)
        arrays = {t.name: _embedded(np.ascontiguousarray(bound[t.name], dtype=np_dtype(t.dtype)),
                                    tuple(greatest.tensor(t.name).storage_shape)) for t in expr.inputs}
        inputs = ordered_inputs(self.artifacts[i].launch, arrays)
        out_shape = tuple(greatest.output.storage_shape)
        runner = self.runner(i).with_launch(ks.blocks(i, v), [*(a.shape for a in inputs), out_shape],
                                            ks.scalars(v))
        return runner, inputs, out_shape

    def _growth(self, tensor: str) -> tuple[int, int]:
        """(dimension, factor) in which ``tensor`` as written grows with the generic symbol."""
        assert self.kernels is not None
        sym = self.kernels.axis.symbol
        return next((d, f) for d, (s, f) in self.op.growth()[tensor].items() if s == sym)

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        values, bound = self.bind(args, kwargs)
        if self.kernels is None:
            return np.asarray(self.specialised(values)(**bound))
        return self._run(values, bound)

    def _run(self, values: Mapping[str, int], bound: Mapping[str, np.ndarray], index: int | None = None
             ) -> np.ndarray:
        assert self.kernels is not None
        runner, inputs, _ = self.prepare(values, bound, index)
        out = np.asarray(runner(inputs))
        expr = self.op.instantiate(values)
        shape = tuple(expr.output.storage_shape)
        if self.kernels.scalar_args:
            return np.ascontiguousarray(out[tuple(slice(0, d) for d in shape)])
        return out.reshape(-1)[:int(np.prod(shape))].reshape(shape)

    def benchmark(self, values: Mapping[str, int], repeat: int = 10, warmup: int = 2) -> float:
        """Median kernel time in seconds at these symbol values on this machine's device (random inputs)."""
        from roller.ir.reference import random_inputs

        expr = self.op.instantiate(values)
        bound = random_inputs(expr, seed=0)
        if self.kernels is None:
            return float(self.specialised(values).benchmark(repeat=repeat, warmup=warmup))
        runner, inputs, _ = self.prepare(values, bound)
        return float(runner.time(inputs, repeat=repeat, warmup=warmup))

    def reference(self, *args: Any, **kwargs: Any) -> np.ndarray:
        """roller.reference on the same inputs, at the size they have."""
        from roller.ir.reference import reference

        values, bound = self.bind(args, kwargs)
        return reference(self.op.instantiate(values), bound)


    # -- build folders (roller.compiler.artifact) ------------------------------------------------------------
    def dispatch(self) -> dict[str, Any]:
        """What ``dispatch.json`` holds: the op with its symbols, which kernel each size takes and how a
        launcher runs it at a size (blocks and the rows each growing tensor's buffer holds; or, for kernels that
        take the size as an argument, the grid per axis and the layout every tensor keeps)."""
        from roller import __version__
        from roller.construction.symbol_args import RuntimeAxes, reduced

        ks = self.kernels
        if ks is None:
            raise InputError(f"{self.name}: one kernel cannot serve every size here ({self.why}); build it at a "
                             "size (write the number in place of the symbol)", source=self.op.source)
        op = self.op
        if isinstance(ks.axis, RuntimeAxes):
            launch = {
                "launch": "each kernel takes v as its int argument after the buffers; blocks(v) = the product "
                          "over 'axes' of ceil(extent / block), where an axis marked runtime has extent v; every "
                          "tensor is held in its layout at the greatest size (each 'growing' dimension is "
                          "'greatest' long, its first v entries the data: zeros past them in inputs, the output's "
                          "discarded)",
                "growing": {t: {"dims": list(dims)} for t, dims in ks.axis.written}, "greatest": ks.greatest}
        else:
            launch = {
                # Tensors as written: the dimension that grows and how many of its rows one unit of the symbol is.
                "growing": {t: {"dim": d, "per_value": f} for t, dims in op.growth().items()
                            for d, (s, f) in dims.items() if s == ks.axis.symbol and t in ks.axis.tensors},
                "launch": "blocks(v) = ceil(v * per_value / block_rows) * other_blocks; a growing tensor's buffer "
                          "holds rows(v) = min(ceil(ceil(v * per_value / block_rows) * block_rows / per_value), "
                          "greatest) rows of the symbol (zeros past v in inputs; the output's rows past v are "
                          "discarded)",
                "per_value": ks.axis.per_value, "greatest": ks.greatest}
        doc: dict[str, Any] = {
            "op": op.name, "symbols": {s: list(r) for s, r in op.ranges.items()}, "symbol": ks.axis.symbol,
            "hw": {"name": self.hw.name, "hash": self.hw.content_hash()}, "backend": self.backend.name,
            "roller_version": __version__, "construction_s": self.construction_s, "candidates": ks.candidates,
            "chosen_by": "measured" if ks.measured is not None else "model", **launch,
            "kernels": [], "dispatch": ks.intervals(), "samples": ks.table(),
        }
        if self.not_timed is not None:
            doc["not_timed"] = list(self.not_timed)  # candidates that did not render, compile or run, and why
        for i, prog in enumerate(ks.programs):
            entry: dict[str, Any] = {"folder": f"k{i}", "main_file": self.artifacts[i].main_file,
                                     "line": prog.line()}
            if isinstance(ks.axis, RuntimeAxes):
                walked = reduced(prog.expr)
                entry["axes"] = [{"name": a.name, "extent": a.extent, "block": b,
                                  "runtime": a.name in ks.axis.axes}
                                 for a, b in zip(prog.expr.axes, prog.block_tile.shape) if a.name not in walked]
            else:
                lead = -(-prog.expr.axes[0].extent // prog.block_tile.shape[0])
                entry.update(block_rows=prog.block_tile.shape[0], other_blocks=prog.grid // lead)
            doc["kernels"].append(entry)
        # The op as written, with its symbols, and the description's file: what load needs besides the kernels.
        doc["op_doc"] = op.doc
        doc["hw"]["source"] = self.hw.source
        return doc

    def write(self, folder: Path) -> dict[str, Any]:
        """The kernel set's build folder at ``folder`` (which must not exist): ``k0/``, ``k1/``... and
        ``dispatch.json``; returns the dispatch document."""
        from roller.compiler.artifact import write_json, write_kernel_files

        doc = self.dispatch()
        assert self.kernels is not None
        for i, prog in enumerate(self.kernels.programs):
            write_kernel_files(folder / f"k{i}", self.artifacts[i], prog.to_json())
        write_json(folder / "dispatch.json", doc)
        return doc

    @classmethod
    def load(cls, folder: str | os.PathLike, hw: Any = None) -> GenericKernel:
        """The kernel set a build folder holds (``write``), choosing each size's kernel by the folder's dispatch
        table: nothing is constructed, timed or rendered again."""
        from roller.compiler.artifact import damaged, read_artifact, read_json, read_program, target_of
        from roller.construction.generic import KernelSet, set_axis
        from roller.ir.symbolic import parse_symbolic

        path = Path(folder)
        doc = read_json(path / "dispatch.json")
        if not isinstance(doc, dict) or not isinstance(doc.get("op_doc"), dict) or \
                not isinstance(doc.get("hw"), dict) or not isinstance(doc.get("kernels"), list):
            raise damaged(path / "dispatch.json", "expected an object with 'op_doc', 'hw' and 'kernels' (a "
                                                  "folder of an older roller build has no 'op_doc': build it again)")
        target = target_of(path, doc["hw"], str(doc.get("backend")), hw)
        op = parse_symbolic(doc["op_doc"], str(path / "dispatch.json"))
        if op is None:
            raise damaged(path / "dispatch.json", "'op_doc' names no symbolic size")
        axis, _ = set_axis(op, target.hw)
        if isinstance(axis, str):
            raise damaged(path / "dispatch.json", f"its op has no kernel set on {target.hw.name} ({axis})")
        try:
            intervals = tuple((int(d["from"]), int(d["to"]), int(d["kernel"])) for d in doc["dispatch"])
            samples = tuple(int(r["size"]) for r in doc["samples"])
            entries = [(str(k["folder"]), str(k["main_file"])) for k in doc["kernels"]]
        except (KeyError, TypeError, ValueError) as err:
            raise damaged(path / "dispatch.json", f"{err.__class__.__name__}: {err}") from None
        lo, hi = op.ranges[axis.symbol]
        covered = [v for a, b, _ in intervals for v in (a, b)]
        if not intervals or covered[0] != lo or covered[-1] != hi or \
                any(b + 1 != c for b, c in zip(covered[1::2], covered[2::2])) or \
                any(not 0 <= k < len(entries) for _, _, k in intervals):
            raise damaged(path / "dispatch.json", f"'dispatch' does not cover {axis.symbol} in [{lo}, {hi}] with "
                                                  "its kernels")
        greatest = op.instantiate({s: r[1] for s, r in op.ranges.items()})
        programs, artifacts = [], []
        for sub, main_file in entries:
            if "/" in sub or sub.startswith("."):
                raise damaged(path / "dispatch.json", f"a kernel folder named {sub!r}")
            prog = read_program(path / sub / "rprogram.json", greatest)
            programs.append(prog)
            artifacts.append(read_artifact(path / sub, main_file))
        ks = KernelSet(op, target.hw, axis, programs, samples, [], int(doc.get("candidates", len(programs))),
                       dispatch=intervals)
        return cls(op, target, ks, artifacts=artifacts)


def _grown_shape(shape: tuple[int, ...], dim: int, per: int, rows: int) -> tuple[int, ...]:
    """``shape`` (a growing tensor's as written) with ``rows`` of the symbol in dimension ``dim``."""
    return shape[:dim] + (rows * per,) + shape[dim + 1:]


def _grown(a: np.ndarray, dim: int, per: int, rows: int) -> np.ndarray:
    """``a`` with zero rows appended in dimension ``dim`` up to ``rows`` of the symbol: only unit dimensions
    precede it (generic_axis), so the rows are a prefix of the grown array's memory."""
    shape = _grown_shape(tuple(a.shape), dim, per, rows)
    if shape == a.shape:
        return a
    out = np.zeros(shape, dtype=a.dtype)
    out.reshape(-1)[:a.size] = a.reshape(-1)
    return out


def _embedded(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` at the start of every dimension of a zero array of ``shape`` (the layout at the greatest size)."""
    if tuple(a.shape) == shape:
        return a
    out = np.zeros(shape, dtype=a.dtype)
    out[tuple(slice(0, d) for d in a.shape)] = a
    return out


def kernel_set(op: SymbolicOp, target: Target, timer: DeviceTimer | None = None) -> KernelSet | str:
    """``op``'s shape-generic kernel set for the target, or why it has none (the backend cannot launch a prefix
    of a grid, or the symbol does not lead the op); with ``timer``, chosen by timing candidates on this
    machine."""
    if not target.backend.sub_grid:
        return f"the {target.backend.name} backend launches every kernel on the grid it was built for"
    return construct_generic(op, target.hw, matrix=target.matrix_support, timer=timer)


class DeviceTimer:
    """Times a kernel set's candidates at sample sizes on this machine's device (``construct_generic``'s timer)
    and keeps what it compiled, so that the kept kernels are not compiled twice."""

    def __init__(self, op: SymbolicOp, target: Target, repeat: int = 10, warmup: int = 2,
                 progress: bool | None = None) -> None:
        from roller.backends import require_device

        require_device(target.backend, target.hw, why="evaluate=True (timing candidates)")
        self.op, self.target = op, target
        self.hw, self.backend = target.hw, target.backend
        self.repeat, self.warmup, self.progress = repeat, warmup, progress
        self.compiled: dict[tuple, tuple[Any, Any]] = {}  # DeviceTimer.key(program) -> (artifact, runner)
        self.failed: list[str] = []  # candidates that did not render, compile or run, and why (dispatch.json)

    @staticmethod
    def key(prog: RProgram) -> tuple:
        """What a compiled kernel is of: the op (two operators may share tile shapes) and the program."""
        return prog.expr.content_hash(), prog.key()

    def __call__(self, trial: KernelSet, asked: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
        from roller.compiler.tune import _short, compile_each
        from roller.errors import RollerError
        from roller.ir.reference import random_inputs
        from roller.progress import Progress

        arts: dict[int, Any] = {}
        for k in sorted({k for k, _ in asked}):
            try:
                arts[k] = self.backend.render(trial.programs[k], self.hw)
            except RollerError as err:  # a candidate this backend cannot render is not timed
                self.failed.append(f"{trial.programs[k].line()}: render: {_short(err)}")
        bar = Progress(len(arts) + len(asked), f"timing {self.op.name}'s kernel set", enabled=self.progress)

        probe = GenericKernel(self.op, self.target, trial, artifacts=[arts.get(k) for k in
                                                                                 range(len(trial.programs))])
        try:
            # What an earlier trial compiled is not compiled again; the rest in one batch.
            todo = [k for k in sorted(arts) if self.key(trial.programs[k]) not in self.compiled]
            for k, result in zip(todo, compile_each(self.backend, [arts[k] for k in todo], self.hw)):
                if isinstance(result, Exception):
                    self.failed.append(f"{trial.programs[k].line()}: compile: {_short(result)}")
                else:
                    self.compiled[self.key(trial.programs[k])] = (arts[k], result)
            for k in sorted(arts):
                if self.key(trial.programs[k]) in self.compiled:
                    probe._runners[k] = self.compiled[self.key(trial.programs[k])][1]
                bar.step("compiled")
            out: dict[tuple[int, int], float] = {}
            sym = trial.axis.symbol
            base = {s: r[1] for s, r in self.op.ranges.items()}
            for v in sorted({v for _, v in asked}):
                values = {**base, sym: v}
                bound = random_inputs(self.op.instantiate(values), seed=0)
                for k in (k for k, w in asked if w == v):
                    if k in probe._runners:
                        runner, inputs, _ = probe.prepare(values, bound, index=k)
                        try:
                            out[(k, v)] = float(runner.time(inputs, repeat=self.repeat, warmup=self.warmup))
                        except RollerError:
                            raise
                        except Exception as err:  # noqa: BLE001 - a launch the device refuses: not timed there
                            self.failed.append(f"{trial.programs[k].line()} at {v}: run: {err.__class__.__name__}: "
                                               f"{_short(err)}")
                    bar.step(f"timed at {v}")
        finally:
            bar.close()
        return out


def built_kernels(programs: Sequence[RProgram], be: Any, hwd: HardwareDesc, compiled: Mapping[tuple, tuple[Any, Any]]
                  ) -> tuple[list[Any], dict[int, Any]]:
    """Each program's artifact, and its runner by index where timing compiled it (``DeviceTimer.compiled``):
    what the timer built is neither rendered nor compiled again."""
    keys = [DeviceTimer.key(p) for p in programs]
    arts = [compiled[k][0] if k in compiled else be.render(p, hwd) for k, p in zip(keys, programs)]
    return arts, {i: compiled[k][1] for i, k in enumerate(keys) if k in compiled}


def compile_generic(op: SymbolicOp, target: Target, top_k: int = 10, evaluate: bool = False,
                    repeat: int = 10, progress: bool | None = None, ready: bool = True) -> GenericKernel:
    """Build ``op``'s shape-generic kernel set and render each kept program, or settle for per-size kernels.
    With ``evaluate``, the set is chosen by timing candidates on this machine (``DeviceTimer``) and each kept
    kernel is checked against roller.reference at a size it serves. With ``ready`` (not for a build that only
    writes the kernels out), each kept kernel is compiled and launched once where the device is here."""
    t = time.perf_counter()
    timer = DeviceTimer(op, target, repeat=repeat, progress=progress) if evaluate else None
    ks = kernel_set(op, target, timer)
    be = target.backend
    if isinstance(ks, str):
        return GenericKernel(op, target, None, why=ks, construction_s=time.perf_counter() - t, top_k=top_k)
    arts, runners = built_kernels(ks.programs, be, target.hw, timer.compiled if timer is not None else {})
    kernel = GenericKernel(op, target, ks, artifacts=arts, construction_s=time.perf_counter() - t, top_k=top_k)
    kernel._runners.update(runners)
    if timer is not None:
        kernel.not_timed = list(timer.failed)
    if ready and be.can_run_here():
        kernel.warm()
    if ready and timer is not None:
        kernel.check()
    return kernel
