"""Whole models: ``roller.compile_model(model, hw=...)`` -> a ``Model`` that runs with its data on the device.

>>> m = roller.compile_model("resnet18.onnx", hw="pocl-cpu")      # doctest: +SKIP
>>> outputs = m.run({"input": x})                                # a dict of numpy arrays, by output name
>>> y = m(x)                                                     # a single-input model, its (first) output

The model pipeline is a row of named stages, each a function of the graph before it (none changes its input):
import (``roller.frontends.onnx``) -> fuse (operators into kernels) -> block (on CPUs, images stored with their
channels in blocks where the model says it pays) -> pad (values made inside the padding their readers want) ->
pack (weights in the layouts construction chooses) -> build (one kernel per distinct operator, in parallel, from
the kernel cache when it is there) -> plan (buffers, launches and copies). ``m.stages`` keeps
each stage's graph; ``m.kernels`` lists the kernels one run launches, in order; ``m.plan`` is the memory plan
(``m.peak_bytes``); ``m.benchmark()`` times whole runs on the device.
"""
from __future__ import annotations

import dataclasses
import io
import os
import statistics
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from roller.backends import ordered_inputs, require_device
from roller.compiler.artifact import BuildFolder, BuiltKernel
from roller.compiler.check import compare_outputs, model_tolerances
from roller.compiler.kernel import Kernel, build_kernel, build_kernels
from roller.compiler.model_reference import ModelReference, graph_reference, onnxruntime_reference
from roller.compiler.target import StoredCosts, Target
from roller.dtypes import dtype as dtype_of
from roller.errors import InputError
from roller.graph import Graph, InputPad, OpNode, Plan, kernel_key, plan, unique_kernels
from roller.graph.fusion import FusionReport
from roller.graph.fusion import fuse as fuse_graph
from roller.graph.memory import KernelStep
from roller.graph.orchestrate import orchestrate
from roller.graph.passes import pack_constants
from roller.ir.reference import random_inputs
from roller.ir.tensor_expr import TensorExpr
from roller.progress import Progress, stage
from roller.runtime.executor import Executor
from roller.settings import settings

if TYPE_CHECKING:
    from roller.compiler.profile import Profile


@dataclass
class Stages:
    """Each stage's graph, for inspection: the graph as imported, fused, with values held padded, and with
    weights packed (the one built and planned)."""

    imported: Graph
    fused: Graph
    blocked: Graph
    padded: Graph
    packed: Graph
    fusion: FusionReport | None = None  # what the fusion stage did (None: one kernel per operator)
    # seconds of each stage of the build: fuse, block, pad, pack (lower), then build (construction and rendering,
    # kernels in parallel), compile (the device's compiler, all kernels at once) and plan (build_model); import
    # where compile_model imported it
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class Model(BuildFolder):
    """A compiled model: its graph, one kernel per distinct operator, and the plan that runs them."""

    graph: Graph
    target: Target
    by_key: dict[str, Kernel | BuiltKernel]  # kernel key -> kernel (built, or read back from a build folder)
    plan: Plan
    compile_s: float = 0.0
    cache_hits: int = 0
    source: Any = None  # the onnx.ModelProto it was imported from (onnxruntime checks it), if any
    stages: Stages | None = None  # each stage's graph (None for a model loaded from a build folder)
    source_file: str | None = None  # the ONNX file it was read from, if any
    _executor: Executor | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def fusion(self) -> FusionReport | None:
        """What the fusion stage did (None: compiled with fuse=False, or loaded from a build folder)."""
        return self.stages.fusion if self.stages is not None else None

    @property
    def name(self) -> str:
        return self.graph.name

    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    @property
    def kernels(self) -> list[Kernel | BuiltKernel]:
        """The kernels one run launches, in launch order (a kernel shared by several operators repeats)."""
        return [self.by_key[s.kernel] for s in self.plan.steps if isinstance(s, KernelStep)]

    @property
    def on_device(self) -> bool:
        """Whether a run does work on the device (a kernel or a copy), not only upload and download."""
        return bool(self.plan.steps)

    @property
    def peak_bytes(self) -> int:
        """Device memory of one model: weights, inputs, outputs and the pool of intermediates."""
        return self.plan.peak_bytes

    @property
    def executor(self) -> Executor:
        with self._lock:   # one executor (one set of device buffers) however many threads ask at once
            if self._executor is None:
                require_device(self.backend, self.hw, why="running a model")
                compile_runners(list(self.by_key.values()), self.target)
                runners = {key: k.runner for key, k in self.by_key.items()}
                self._executor = Executor(self.graph, self.plan, runners, self.backend.device())
            return self._executor

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Outputs by name, for inputs by name."""
        if not isinstance(inputs, Mapping):
            raise InputError(f"run() takes a dict of inputs by name ({', '.join(self.input_names)}); "
                             f"got {type(inputs).__name__}")
        return self.executor.run(inputs)

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """Inputs by position (the model's input order) or name; the output, or a tuple of outputs."""
        if len(args) > len(self.input_names):
            raise InputError(f"{self.name} takes {len(self.input_names)} inputs ({', '.join(self.input_names)}), "
                             f"got {len(args)}")
        feeds = dict(zip(self.input_names, args))
        for k, v in kwargs.items():
            if k in feeds:
                raise InputError(f"input {k!r} given twice")
            feeds[k] = v
        out = self.run(feeds)
        values = tuple(out[n] for n in self.output_names)
        return values[0] if len(values) == 1 else values

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Inputs to check and time with: standard normal floats (of the type a caller passes: float16 for a
        float16 input, so that a run times no conversion); integers in [0, RANDOM_INT_HIGH) (token ids of any
        vocabulary, positions, mask values) and bools."""
        rng = np.random.default_rng(seed)
        out = {}
        for n in self.input_names:
            v = self.graph.values[n]
            kind = dtype_of(v.dtype)
            if kind.kind == "bool":
                out[n] = rng.integers(0, 2, v.shape).astype(bool)
            elif kind.integral:
                out[n] = rng.integers(0, RANDOM_INT_HIGH, v.shape).astype(kind.host)
            else:
                out[n] = rng.standard_normal(v.shape).astype(kind.host)
        return out

    def benchmark(self, repeat: int = 10, warmup: int = 2, inputs: Mapping[str, Any] | None = None) -> float:
        """Median seconds of one run's device work (inputs uploaded beforehand, outputs not downloaded)."""
        if repeat < 1:
            raise InputError(f"repeat must be at least 1, got {repeat}")
        feeds = dict(inputs) if inputs is not None else self.random_inputs()
        return statistics.median(self.executor.time(feeds, repeat=repeat, warmup=warmup))

    def profile(self, inputs: Mapping[str, Any] | None = None, repeat: int = 10,
                onnxruntime: bool = True) -> Profile:
        """Where a run's time goes, step by step, beside onnxruntime's per-node profile of the ONNX model (where
        asked, installed, and the model has its ONNX source): ``roller.compiler.profile``;
        ``print(m.profile().render())``."""
        from roller.compiler.profile import Profile, onnxruntime_profile, step_times

        if repeat < 1:
            raise InputError(f"repeat must be at least 1, got {repeat}")
        feeds = dict(inputs) if inputs is not None else self.random_inputs()
        ex = self.executor
        run_s = statistics.median(ex.time(feeds, repeat=repeat))
        steps = step_times(self.graph, self.plan.steps, self.by_key, ex.time_each_step(repeat=repeat))
        ort_nodes, ort_run = onnxruntime_profile(self.source, ex.check_inputs(feeds), repeat) \
            if onnxruntime and self.source is not None else (None, None)
        return Profile(self.name, steps, run_s, ort_nodes, ort_run)

    def reference(self, inputs: Mapping[str, Any]) -> ModelReference:
        """What ``check`` compares with: onnxruntime on the original model when it is installed (with its
        unoptimised run as a quantized model's spread, ``model_reference``), else the graph evaluated operator by
        operator with roller.reference."""
        feeds = self.executor.check_inputs(inputs)
        why = ""
        if self.source is not None:
            got = onnxruntime_reference(self.source, feeds)
            if isinstance(got, ModelReference):
                return dataclasses.replace(got, outputs={n: got.outputs[n] for n in self.output_names})
            why = got
        if not self.graph.nodes:
            raise InputError(f"{self.name} was read back from a build folder and has no reference here: its ONNX "
                             f"file ({self.source_file or 'unknown'}) is missing or changed since the build, or "
                             f"onnxruntime is not installed{f' ({why})' if why else ''}")
        return graph_reference(self.graph, feeds, why)

    def check(self, inputs: Mapping[str, Any] | None = None,
              outputs: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
        """Compare a run's outputs with ``reference``; CheckError (exit 4) naming the output and the worst
        element when one differs by more than float32 error over a model allows (MODEL_RTOL of the element,
        MODEL_ATOL of the output's largest magnitude) or, for a quantized model, more than twice the spread
        between onnxruntime's optimised and unoptimised runs (``compare_outputs``)."""
        feeds = dict(inputs) if inputs is not None else self.random_inputs()
        got = dict(outputs) if outputs is not None else self.run(feeds)
        ref = self.reference(feeds)
        return compare_outputs(f"{self.name} on {self.hw.name}/{self.backend.name}", self.output_names, got,
                               ref.outputs, ref.by, model_tolerances(v.dtype for v in self.graph.values.values()),
                               ref.spread, ref.spread_by)

    # -- build folders (roller.compiler.artifact) ------------------------------------------------------------
    def save(self, folder: str | os.PathLike) -> dict[str, Any]:
        """The build folder written beside ``folder`` and swapped in whole (``staged_replace``): its files
        belong together (the plan names the kernels, the weights fill its buffers)."""
        from roller.compiler.artifact import staged_replace

        return staged_replace(Path(folder), self.write, "model.json")

    def write(self, folder: Path) -> dict[str, Any]:
        """The model's build folder at ``folder`` (which must not exist): a folder per kernel, ``plan.json``,
        ``weights.npz`` and ``model.json``; returns ``model.json``'s document."""
        from roller.compiler.artifact import file_sha256, write_json, write_kernel_files

        folder.mkdir(parents=True)
        kernels = list(self.by_key.values())
        for k in kernels:
            prog = k.program.to_json() if isinstance(k, Kernel) else k.program_json
            write_kernel_files(folder / k.name, k.artifact, prog)
        doc = self.plan.to_json()
        doc["kernels"] = {k.name: {"folder": k.name, "main_file": k.artifact.main_file, "line": _line(k),
                                   "predicted_ms": k.predicted_ms} for k in kernels}
        # What loading the folder back needs besides the plan: the shapes and types of what crosses to the host.
        doc["values"] = {n: {"shape": list(self.graph.values[n].shape), "dtype": self.graph.values[n].dtype}
                         for n in (*self.graph.inputs, *self.graph.outputs, *self.graph.constants)}
        write_json(folder / "plan.json", doc)
        buf = io.BytesIO()
        # members named by buffer id, not by value name: a name is the model's (``../../x``), an id is ours
        members = {f"b{self.plan.value_buffer[n]}": a for n, a in self.graph.constants.items()}
        np.savez(buf, **members)  # type: ignore[arg-type]  # numpy's stub types them as bool
        (folder / "weights.npz").write_bytes(buf.getvalue())
        by_key = self.by_key
        model_doc = {"model": self.name, "source": self.source_file, "hw": self.hw.name, "backend": self.backend.name,
                     "inputs": {n: list(self.graph.values[n].shape) for n in self.graph.inputs},
                     "outputs": {n: list(self.graph.values[n].shape) for n in self.graph.outputs},
                     "kernels_built": len(by_key),
                     "kernels_launched": sum(1 for s in doc["steps"] if s["kind"] == "kernel"),
                     "peak_bytes": self.plan.peak_bytes,
                     "predicted_ms": sum(by_key[s.kernel].predicted_ms or 0.0 for s in self.plan.steps
                                         if isinstance(s, KernelStep)),
                     "hw_hash": self.hw.content_hash(), "hw_source": self.hw.source,
                     "source_sha256": file_sha256(Path(self.source_file)) if self.source_file else None,
                     # where the check finds the model again from any folder ("source" is as the user gave it)
                     "source_file": str(Path(self.source_file).resolve()) if self.source_file else None}
        write_json(folder / "model.json", model_doc)
        return model_doc

    @classmethod
    def load(cls, folder: str | os.PathLike, hw: Any = None) -> Model:
        """The model a build folder holds (``write``), ready to run: its kernels are compiled from the folder's
        sources, nothing is imported, fused or built again; checked against its ONNX file where that is still
        there as it was built."""
        from roller.compiler.artifact import (
            BuiltKernel,
            damaged,
            file_sha256,
            read_artifact,
            read_json,
            target_of,
        )
        from roller.graph.ir import Value
        from roller.graph.memory import plan_from_json

        path = Path(folder)
        model_doc, plan_doc = read_json(path / "model.json"), read_json(path / "plan.json")
        if not isinstance(model_doc, dict) or not isinstance(model_doc.get("hw"), str):
            raise damaged(path / "model.json", "expected an object with 'hw' and 'backend'")
        if not isinstance(plan_doc, dict) or not isinstance(plan_doc.get("values"), dict) or \
                not isinstance(plan_doc.get("kernels"), dict):
            raise damaged(path / "plan.json", "expected 'kernels' and 'values' (a folder of an older roller "
                                              "build has no 'values': build it again)")
        target = target_of(path, {"name": model_doc["hw"], "hash": model_doc.get("hw_hash"),
                                  "source": model_doc.get("hw_source")}, str(model_doc.get("backend")), hw)
        try:
            p = plan_from_json(plan_doc)
            values = {str(n): Value(str(n), tuple(int(d) for d in v["shape"]), str(v["dtype"]))
                      for n, v in plan_doc["values"].items()}
            entries = {str(n): (str(e["folder"]), str(e["main_file"]), str(e.get("line", "")),
                                e.get("predicted_ms")) for n, e in plan_doc["kernels"].items()}
        except (KeyError, TypeError, ValueError) as err:
            raise damaged(path / "plan.json", f"{err.__class__.__name__}: {err}") from None
        missing = [n for n in (*p.inputs, *p.outputs) if n not in values] + \
            [s.kernel for s in p.steps if isinstance(s, KernelStep) and s.kernel not in entries]
        if missing:
            raise damaged(path / "plan.json", f"it names {missing[0]!r}, which it does not describe")
        try:
            with np.load(path / "weights.npz", allow_pickle=False) as data:
                constants = {_weight_name(p, k): np.asarray(data[k]) for k in data.files}
        except (OSError, ValueError) as err:
            raise InputError(f"cannot read the weights ({err.__class__.__name__})",
                             source=str(path / "weights.npz")) from None
        for n, arr in constants.items():
            if n not in values or tuple(arr.shape) != values[n].shape or n not in p.value_buffer:
                raise damaged(path / "weights.npz", f"weight {n!r} is not one the plan holds with its shape")
        by_key: dict[str, Kernel | BuiltKernel] = {}
        for name, (sub, main_file, line, ms) in entries.items():
            if "/" in sub or sub.startswith("."):
                raise damaged(path / "plan.json", f"a kernel folder named {sub!r}")
            prog = path / sub / "rprogram.json"
            by_key[name] = BuiltKernel(name, target, read_artifact(path / sub, main_file), line,
                                       float(ms) if isinstance(ms, (int, float)) else None,
                                       read_json(prog) if prog.is_file() else None)
        graph = Graph(str(model_doc.get("model", path.name)), list(p.inputs), list(p.outputs),
                      {n: v for n, v in values.items() if n in (*p.inputs, *p.outputs, *constants)}, constants)
        found = [f for f in (model_doc.get("source_file"), model_doc.get("source")) if isinstance(f, str)]
        source_file = next((f for f in found if Path(f).is_file()), found[0] if found else None)
        proto = None
        if source_file and model_doc.get("source_sha256") and \
                file_sha256(Path(source_file)) == model_doc["source_sha256"]:
            import onnx

            proto = onnx.load(source_file)
        return cls(graph, target, by_key, p, source=proto, source_file=source_file)

    def summary(self) -> dict[str, Any]:
        """Counts and sizes for reports: kernels launched and built, copies, views, memory by role."""
        counts = {"kernels_launched": len(self.kernels), "kernels_built": len(self.by_key),
                  "copies": sum(1 for s in self.plan.steps if not isinstance(s, KernelStep)),
                  "operators": len(self.graph.op_nodes), "values": len(self.graph.values)}
        return {"model": self.name, "hw": self.hw.name, "backend": self.backend.name, **counts,
                "peak_bytes": self.peak_bytes, "bytes_by_role": self.plan.bytes_by_role(),
                "compile_s": self.compile_s, "cache_hits": self.cache_hits,
                "fusion": None if self.fusion is None else dataclasses.asdict(self.fusion)}


FUSE_METHODS = ("solver", "greedy", "none")
#: random integer inputs lie in [0, this): a valid token id of any vocabulary, position and mask value
RANDOM_INT_HIGH = 2


def fuse_method(fuse: object) -> str:
    """The fusion method a ``fuse`` option names (True: "solver", False: "none"); InputError otherwise."""
    if fuse is True or fuse is False:
        return "solver" if fuse else "none"
    if isinstance(fuse, str) and fuse in FUSE_METHODS:
        return fuse
    raise InputError(f"fuse must be one of {', '.join(FUSE_METHODS)} (or True/False), got {fuse!r}",
                     field="fuse")


#: the most operators the fusion solver is given (about a minute here at worst); larger graphs are fused greedily
SOLVER_MAX_OPS = 2000


def fuse_stage(graph: Graph, target: Target, method: str, seconds: Callable[[TensorExpr], float] | None = None
               ) -> tuple[Graph, FusionReport | None]:
    """``graph`` fused by ``method`` (``FUSE_METHODS``), costing operators with ``seconds`` (default:
    construction's best program for the target as the micro-performance model predicts it); (graph, None) for
    "none"."""
    if method == "none":
        return graph, None
    stored = None
    if seconds is None:
        from roller import cache

        stored = StoredCosts(target, cache.result_key(method, *(n.expr.content_hash() for n in graph.op_nodes)))
    cost = seconds or stored or target.predicted_seconds
    try:
        return _fused(graph, target, method, cost)
    finally:
        if stored is not None:
            stored.save()


def _fused(graph: Graph, target: Target, method: str, cost: Callable[[TensorExpr], float]
           ) -> tuple[Graph, FusionReport]:
    from roller.graph.segments import fuse_in_segments

    rows = target.backend.row_kernels
    if method == "solver" and len(graph.op_nodes) > SOLVER_MAX_OPS:
        import warnings

        warnings.warn(f"{graph.name}: {len(graph.op_nodes)} operators, more than the {SOLVER_MAX_OPS} the fusion "
                      "solver takes in bounded time (it costs tens of milliseconds an operator); fused by the "
                      "greedy pass instead", stacklevel=2)
        method = "greedy"
    if method == "solver":
        return fuse_in_segments(graph, lambda g: orchestrate(g, cost, rows=rows))
    fused, report = fuse_in_segments(
        graph, lambda g: fuse_graph(g, lambda f, replaced: cost(f) <= sum(cost(e) for e in replaced), rows))
    report.predicted_s = sum(cost(n.expr) for n in fused.op_nodes)
    return fused, report


def block_stage(graph: Graph, target: Target) -> Graph:
    """A copy of ``graph`` whose window operators' channels are stored in blocks (``roller.graph.blocking``)
    where the micro-performance model says the operators it changes cost less so; ``graph`` itself where the
    description's kernels do not compute along channels (``channel_lanes`` 0) or the environment says not to
    (``ROLLER_BLOCK_CHANNELS=0``, an A/B switch)."""
    from roller.construction import channel_lanes
    from roller.graph.blocking import block_channels

    lanes = channel_lanes(target.hw)
    if not lanes or not settings.compile.block_channels:
        return graph
    out = graph.copy()
    seconds = target.predicted_seconds
    changed = block_channels(out, lanes, lambda changes: sum(seconds(new) for _, new in changes)
                             < sum(seconds(old) for old, _ in changes))
    return out if changed else graph


def pad_stage(graph: Graph, target: Target) -> Graph:
    """A copy of ``graph`` whose values that windows read are made inside the padding their readers want
    (``roller.graph.padding``), where the micro-performance model says the changed operators cost less than the
    copies they save."""
    from roller.construction import copy_seconds, read_pads
    from roller.graph.padding import hold_padded

    out = graph.copy()
    seconds = target.predicted_seconds
    hold_padded(out, lambda expr: read_pads(expr, target.hw),
                lambda changes, nbytes: sum(seconds(new) for _, new in changes)
                <= sum(seconds(old) for old, _ in changes) + copy_seconds(nbytes, target.hw))
    return out


def pack_stage(graph: Graph, target: Target, measured: Callable[[TensorExpr], float | None] | None = None
               ) -> Graph:
    """A copy of ``graph`` whose weights are stored in the layouts construction chooses for the operators that
    read them (``roller.construction.layout``): by the model, or with ``measured``, by their kernels' times (a
    ``LayoutTimer`` is first handed every layout it will be asked about, to build them together)."""
    from roller.construction.layout import choose_layout

    def chooser(timer: Callable[[TensorExpr], float | None] | None) -> Callable[..., Any]:
        return lambda expr, consts: choose_layout(expr, target.hw, consts, target.matrix_support, timer,
                                                  best=target.best)

    if isinstance(measured, LayoutTimer):
        asked: list[TensorExpr] = []
        pack_constants(graph.copy(), chooser(lambda e: asked.append(e)))
        measured.prefetch(asked)
    out = graph.copy()
    pack_constants(out, chooser(measured))
    return out


def lower(graph: Graph, target: Target, method: str, measured: Callable[[TensorExpr], float | None] | None = None
          ) -> Stages:
    """The device-free stages: fuse, block, pad, pack."""
    import time

    t0 = time.perf_counter()
    fused, report = fuse_stage(graph, target, method)
    t1 = time.perf_counter()
    blocked = block_stage(fused, target)
    t2 = time.perf_counter()
    padded = pad_stage(blocked, target)
    t3 = time.perf_counter()
    packed = pack_stage(padded, target, measured)
    return Stages(graph, fused, blocked, padded, packed, report,
                  {"fuse": t1 - t0, "block": t2 - t1, "pad": t3 - t2, "pack": time.perf_counter() - t3})


@dataclass
class LayoutTimer:
    """Seconds of the kernel a layout would get, built as it will be (a cache hit when it is the one kept) and
    timed with the cores' caches overwritten before each run where the device can: alone and hot, unblocked 3x3
    weights of ResNet-18 won, and ran 1.4-1.6x slower than the blocked ones inside the model. Each time is kept
    in the cache with the kernels: a warm build decides the layouts as the first did, and loads no kernel to
    decide them (timing them again took 36 of a warm ResNet-18's 37 s)."""
    target: Target
    top_k: int
    cache: bool
    kernels: dict[str, Kernel] = field(default_factory=dict)

    def _key(self, expr: TensorExpr) -> str:
        from roller import cache

        be = self.target.backend
        return cache.result_key("layout-time", expr.content_hash(), self.target.hw.content_hash(), be.name,
                                str(self.top_k), cache.code_hash(), cache.toolchain_version(be))

    def _stored(self, expr: TensorExpr) -> float | None:
        from roller import cache

        if not (self.cache and cache.enabled()):
            return None
        found = cache.load_result("layout-time", self._key(expr))
        return float(found) if isinstance(found, (int, float)) and found > 0 else None

    def prefetch(self, exprs: Sequence[TensorExpr]) -> None:
        """Build the kernels of ``exprs`` together (their candidates compiled in shared batches), those whose
        time is not stored."""
        unique = [e for e in {e.content_hash(): e for e in exprs}.values() if self._stored(e) is None]
        built = build_kernels(unique, self.target, top_k=self.top_k, evaluate=True, use_cache=self.cache,
                              progress=False)
        self.kernels.update((e.content_hash(), k) for e, k in zip(unique, built))

    def __call__(self, expr: TensorExpr) -> float | None:
        from roller import cache

        stored = self._stored(expr)
        if stored is not None:
            return stored
        k = self.kernels.get(expr.content_hash())
        if k is None:
            k = build_kernel(expr, self.target, top_k=self.top_k, evaluate=True, use_cache=self.cache,
                             progress=False)
        args = ordered_inputs(k.launch, random_inputs(expr, seed=0))
        seconds = float(k.runner.time(args, cold=True))
        if self.cache and cache.enabled():
            cache.store_result("layout-time", self._key(expr), seconds)
        return seconds


def build_stage(graph: Graph, target: Target, top_k: int = 10, evaluate: bool = False, cache: bool = True,
                jobs: int | None = None, progress: bool | None = None) -> tuple[dict[str, Kernel], int]:
    """(kernel key -> kernel, cache hits): one kernel per distinct operator, constructed and rendered ``jobs``
    at a time (or taken from the cache), with a progress bar on stderr when it is a terminal."""
    todo = unique_kernels(graph)
    if evaluate:   # timed candidates are compiled together, a batch per round, and timed one after another
        with stage(f"building {graph.name}: timing the candidates of {len(todo)} kernels", enabled=progress):
            built = build_kernels([n.expr for n in todo.values()], target, top_k=top_k, evaluate=True,
                                  use_cache=cache, progress=False)
        timed = dict(zip(todo, built))
        return timed, sum(1 for k in timed.values() if k.cache_hit)
    bar = Progress(len(todo), f"building {graph.name}: constructing {len(todo)} kernels", enabled=progress)

    def one(node: OpNode) -> Kernel:
        return build_kernel(node.expr, target, top_k=top_k, evaluate=evaluate, use_cache=cache, progress=False)

    out: dict[str, Kernel] = {}
    try:
        workers = max(1, min(len(todo) or 1, jobs or os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {key: pool.submit(one, node) for key, node in todo.items()}
            for key, fut in futures.items():
                out[key] = fut.result()
                bar.step(todo[key].expr.name)
    finally:
        bar.close()
    return out, sum(1 for k in out.values() if k.cache_hit)


def compile_runners(kernels: Sequence[Kernel | BuiltKernel], target: Target, jobs: int | None = None,
                    use_cache: bool = True, progress: bool | None = None) -> None:
    """Compile for this machine's device, in one batch (``Backend.compile_many``), the kernels not compiled yet
    (a kernel chosen by timing already is)."""
    todo = [k for k in kernels if k._runner is None]
    if not todo:
        return
    with stage(f"compiling {len(todo)} kernels for {target.backend.name}", enabled=progress):
        runners = target.backend.compile_many([k.artifact for k in todo], target.hw, jobs=jobs, use_cache=use_cache)
    for k, runner in zip(todo, runners):
        k._runner = runner


def plan_stage(graph: Graph, kernels: Mapping[str, Kernel]) -> Plan:
    """Buffers, launches and copies of one run, each graph input uploaded into its padded buffer where only
    windows read it."""
    p = plan(graph, {key: InputPad.from_launch(k.launch) for key, k in kernels.items()}, padded_inputs=True)
    p.kernels = {key: k.name for key, k in kernels.items()}
    return p


def build_model(graph: Graph, target: Target, *, method: str = "solver", top_k: int = 10, evaluate: bool = False,
                cache: bool = True, jobs: int | None = None, progress: bool | None = None,
                compile_here: bool | None = None, source: Any = None) -> Model:
    """The pipeline after import: fuse, block, pad, pack, build, plan."""
    import time

    t0 = time.perf_counter()
    with stage(f"building {graph.name}: fusing {len(graph.op_nodes)} operators", enabled=progress):
        stages = lower(graph, target, method, LayoutTimer(target, top_k, cache) if evaluate else None)
    t1 = time.perf_counter()
    kernels, hits = build_stage(stages.packed, target, top_k=top_k, evaluate=evaluate, cache=cache, jobs=jobs,
                                progress=progress)
    t2 = time.perf_counter()
    if compile_here is None:
        compile_here = target.backend.can_run_here()
    if compile_here:
        compile_runners(list(kernels.values()), target, jobs=jobs, use_cache=cache, progress=progress)
    t3 = time.perf_counter()
    p = plan_stage(stages.packed, kernels)
    stages.seconds.update(build=t2 - t1, compile=t3 - t2, plan=time.perf_counter() - t3)
    by_key: dict[str, Kernel | BuiltKernel] = dict(kernels)
    return Model(stages.packed, target, by_key, p, compile_s=time.perf_counter() - t0, cache_hits=hits,
                 source=source, stages=stages)


def with_shapes(proto: Any, shapes: Mapping[str, Sequence[int]]) -> Any:
    """A copy of ``proto`` whose inputs have the given static shapes (what onnxruntime is then checked on)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for inp in out.graph.input:
        if inp.name in shapes:
            dims = inp.type.tensor_type.shape.dim
            del dims[:]
            for d in shapes[inp.name]:
                dims.add().dim_value = int(d)
    return out


def _line(k: Kernel | BuiltKernel) -> str:
    return k.program.line() if isinstance(k, Kernel) else k.line


def node_kernels(graph: Graph, kernels: Mapping[str, Kernel]) -> list[tuple[OpNode, Kernel]]:
    """Each operator of the graph with the kernel that runs it."""
    return [(n, kernels[kernel_key(n)]) for n in graph.op_nodes]


def _weight_name(plan: Plan, member: str) -> str:
    """The value a ``weights.npz`` member holds: ``b<id>`` names the constant buffer ``id`` (its first value);
    a folder written before names its members by value."""
    if member.startswith("b") and member[1:].isdigit() and int(member[1:]) < len(plan.buffers):
        values = plan.buffers[int(member[1:])].values
        if values:
            return values[0]
    return member
