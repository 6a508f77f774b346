"""Whole models: ``roller.compile_model(model, hw=...)`` -> a ``Model`` that runs with its data on the device.

>>> m = roller.compile_model("resnet18.onnx", hw="pocl-cpu")      # doctest: +SKIP
>>> outputs = m.run({"input": x})                                # a dict of numpy arrays, by output name
>>> y = m(x)                                                     # a single-input model, its (first) output

Every distinct operator of the model is built once (identical operators share a kernel), in parallel, from the
kernel cache when it is there; ``m.kernels`` lists the kernels one run launches, in order; ``m.plan`` is the
memory plan (``m.peak_bytes``); ``m.benchmark()`` times whole runs on the device.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roller import backends as _backends
from roller.api import HwLike, Kernel, build_kernel, resolve_hw
from roller.dynamic_model import DynamicModel, dynamic_model, open_dims
from roller.errors import InputError
from roller.evaluate import Progress, ordered_inputs, require_device
from roller.graph import Graph, InputPad, OpNode, Plan, kernel_key, plan, unique_kernels
from roller.graph.executor import Executor
from roller.graph.fusion import FusionReport
from roller.graph.fusion import fuse as fuse_graph
from roller.graph.memory import KernelStep
from roller.graph.orchestrate import orchestrate
from roller.graph.passes import pack_constants
from roller.hw import HardwareDesc
from roller.ir.tensor_expr import TensorExpr
from roller.numpy_reference import random_inputs

#: a model's output may differ from the reference by this much of the element's magnitude, plus MODEL_ATOL of
#: the output's largest magnitude: float32 rounding summed over tens of layers (ResNet-50's logits and BERT's
#: layer output differ from onnxruntime by 1e-6 to 1e-5 of their scale), far below an indexing bug's error
MODEL_RTOL = 1e-3
MODEL_ATOL = 1e-4


@dataclass
class Model:
    """A compiled model: its graph, one kernel per distinct operator, and the plan that runs them."""

    graph: Graph
    hw: HardwareDesc
    backend: Any  # roller.backends.Backend
    by_key: dict[str, Kernel]  # kernel key -> kernel
    plan: Plan
    compile_s: float = 0.0
    cache_hits: int = 0
    source: Any = None  # the onnx.ModelProto it was imported from (onnxruntime checks it), if any
    fusion: FusionReport | None = None  # what the fusion pass did (None: compiled with fuse=False)
    _executor: Executor | None = field(default=None, repr=False)

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
    def kernels(self) -> list[Kernel]:
        """The kernels one run launches, in launch order (a kernel shared by several operators repeats)."""
        return [self.by_key[s.kernel] for s in self.plan.steps if isinstance(s, KernelStep)]

    @property
    def peak_bytes(self) -> int:
        """Device memory of one model: weights, inputs, outputs and the pool of intermediates."""
        return self.plan.peak_bytes

    @property
    def executor(self) -> Executor:
        if self._executor is None:
            require_device(self.backend, self.hw, why="running a model")
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
        rng = np.random.default_rng(seed)
        return {n: rng.standard_normal(self.graph.values[n].shape).astype(np.float32) for n in self.input_names}

    def benchmark(self, repeat: int = 10, warmup: int = 2, inputs: Mapping[str, Any] | None = None) -> float:
        """Median seconds of one run's device work (inputs uploaded beforehand, outputs not downloaded)."""
        if repeat < 1:
            raise InputError(f"repeat must be at least 1, got {repeat}")
        feeds = dict(inputs) if inputs is not None else self.random_inputs()
        return statistics.median(self.executor.time(feeds, repeat=repeat, warmup=warmup))

    def reference(self, inputs: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], str]:
        """(outputs, what computed them): onnxruntime on the original model when it is installed, else the
        graph evaluated operator by operator with roller.reference."""
        feeds = self.executor.check_inputs(inputs)
        if self.source is not None:
            try:
                import onnxruntime as ort
            except ImportError:
                ort = None
            if ort is not None:
                options = ort.SessionOptions()
                options.log_severity_level = 3   # its warnings (unused initializers...) are not the user's concern
                sess = ort.InferenceSession(self.source.SerializeToString(), options,
                                            providers=["CPUExecutionProvider"])
                names = [o.name for o in sess.get_outputs()]
                got = dict(zip(names, sess.run(None, feeds)))
                return {n: np.asarray(got[n]) for n in self.output_names}, f"onnxruntime {ort.__version__}"
        from roller.graph.reference import evaluate

        return evaluate(self.graph, feeds), "roller.reference, operator by operator"

    def check(self, inputs: Mapping[str, Any] | None = None,
              outputs: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
        """Compare a run's outputs with ``reference``; CheckError (exit 4) naming the output and the worst
        element when one differs by more than float32 error over a model allows (MODEL_RTOL of the element,
        MODEL_ATOL of the output's largest magnitude)."""
        feeds = dict(inputs) if inputs is not None else self.random_inputs()
        got = dict(outputs) if outputs is not None else self.run(feeds)
        ref, by = self.reference(feeds)
        return compare_outputs(f"{self.name} on {self.hw.name}/{self.backend.name}", self.output_names, got, ref, by)

    def summary(self) -> dict[str, Any]:
        """Counts and sizes for reports: kernels launched and built, copies, views, memory by role."""
        counts = {"kernels_launched": len(self.kernels), "kernels_built": len(self.by_key),
                  "copies": sum(1 for s in self.plan.steps if not isinstance(s, KernelStep)),
                  "operators": len(self.graph.op_nodes), "values": len(self.graph.values)}
        return {"model": self.name, "hw": self.hw.name, "backend": self.backend.name, **counts,
                "peak_bytes": self.peak_bytes, "bytes_by_role": self.plan.bytes_by_role(),
                "compile_s": self.compile_s, "cache_hits": self.cache_hits,
                "fusion": None if self.fusion is None else dataclasses.asdict(self.fusion)}


def compare_outputs(what: str, names: Sequence[str], got: Mapping[str, Any], ref: Mapping[str, Any],
                    by: str) -> dict[str, Any]:
    """Each output against its reference within MODEL_RTOL of the element plus MODEL_ATOL of the output's largest
    magnitude; CheckError naming the output and the worst element otherwise."""
    from roller.errors import CheckError

    worst: dict[str, float] = {}
    for name in names:
        y, r = np.asarray(got[name], np.float64), np.asarray(ref[name], np.float64).reshape(np.shape(got[name]))
        scale = float(np.max(np.abs(r))) if r.size else 0.0
        bound = MODEL_RTOL * np.abs(r) + MODEL_ATOL * scale + 1e-30
        diff = np.where((y == r) | (np.isnan(y) & np.isnan(r)), 0.0, np.abs(y - r))
        diff = np.where(np.isnan(diff), np.inf, diff)
        bad = diff > bound
        if bad.any():
            i = np.unravel_index(int(np.argmax(diff / bound)), diff.shape)
            raise CheckError(f"{what}: output {name!r} differs from {by} in {int(bad.sum())} of {r.size} elements; "
                             f"worst at {list(map(int, i))}: got {y[i]:.9g}, expected {r[i]:.9g} (difference "
                             f"{diff[i]:.3g}, bound {bound[i]:.3g})")
        worst[name] = float(diff.max()) if diff.size else 0.0
    return {"ok": True, "reference": by, "max_abs_error": worst}


def compile_model(model: Any, hw: HwLike | None = None, backend: str | None = None, top_k: int = 10, *,
                  shapes: Mapping[str, Sequence[int]] | None = None, evaluate: bool = False, cache: bool = True,
                  jobs: int | None = None, progress: bool | None = None, fuse: bool | str = True,
                  ranges: Mapping[str, tuple[int, int]] | None = None, generic: bool = True) -> Model | DynamicModel:
    """Import ``model`` (an ONNX file, bytes, ModelProto, or a ``roller.graph.Graph``), fuse its operators into
    kernels (``fuse``: "solver", the default, or True: the partition of least predicted time; "greedy": the
    rule-based pass; "none" or False: one kernel per operator), build a kernel for each distinct operator on
    ``hw`` with ``backend`` (default: the description's), and plan its memory.

    A model whose inputs leave sizes open (``dim_param``) that ``shapes`` does not fix gives a
    ``roller.dynamic_model.DynamicModel``: built once for every size where one kernel per operator serves
    them all (``generic``), else each set of sizes at its first run; ``ranges`` bounds each open size by name
    (default 1 to 4096)."""
    from roller.frontends.onnx import import_model

    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InputError(f"top_k must be a positive integer, got {top_k!r}")
    method = fuse_method(fuse)
    hwd = resolve_hw(hw)
    be = _backends.for_hw(hwd, backend)
    t0 = time.perf_counter()
    source = None
    if isinstance(model, Graph):
        graph = model
    else:
        from roller.frontends.onnx import load_model

        source, _ = load_model(model)
        dims = open_dims(source, shapes)
        if dims:
            options = {"top_k": top_k, "evaluate": evaluate, "cache": cache, "jobs": jobs, "progress": progress,
                       "fuse": method}
            return dynamic_model(source, hwd, be, dims, ranges, options, generic=generic)
        graph = import_model(source, shapes)
        source = _with_shapes(source, shapes) if shapes else source
    graph, fusion = fuse_model_graph(graph, hwd, be, method)
    kernels, hits = build_kernels(graph, hwd, be, top_k=top_k, evaluate=evaluate, cache=cache, jobs=jobs,
                                  progress=progress)
    p = plan(graph, {key: InputPad.from_launch(k.launch) for key, k in kernels.items()}, padded_inputs=True)
    p.kernels = {key: k.name for key, k in kernels.items()}
    return Model(graph, hwd, be, kernels, p, compile_s=time.perf_counter() - t0, cache_hits=hits, source=source,
                 fusion=fusion)


FUSE_METHODS = ("solver", "greedy", "none")


def fuse_method(fuse: object) -> str:
    """The fusion method a ``fuse`` option names (True: "solver", False: "none"); InputError otherwise."""
    if fuse is True or fuse is False:
        return "solver" if fuse else "none"
    if isinstance(fuse, str) and fuse in FUSE_METHODS:
        return fuse
    raise InputError(f"fuse must be one of {', '.join(FUSE_METHODS)} (or True/False), got {fuse!r}",
                     field="fuse")


def fuse_model_graph(graph: Graph, hw: HardwareDesc, backend: Any, method: str,
                     seconds: Callable[[TensorExpr], float] | None = None) -> tuple[Graph, FusionReport | None]:
    """``graph`` fused by ``method`` (``FUSE_METHODS``), costing operators with ``seconds`` (default:
    construction's best program for ``hw`` as the micro-performance model predicts it); (graph, None) for
    "none"."""
    if method == "none":
        return graph, None
    seconds = seconds or predicted_seconds(hw, backend.matrix_support)
    rows = backend.row_kernels
    if method == "solver":
        return orchestrate(graph, seconds, rows=rows)
    fused, report = fuse_graph(graph, lambda f, replaced: seconds(f) <= sum(seconds(e) for e in replaced), rows)
    report.predicted_s = sum(seconds(n.expr) for n in fused.op_nodes)
    return fused, report


def predicted_seconds(hw: HardwareDesc, matrix: Any) -> Callable[[TensorExpr], float]:
    """An operator's time as construction's best program for it on ``hw`` is predicted to take (memoised by
    content: a model's repeated layers are constructed once)."""
    from roller.construction import construct

    memo: dict[str, float] = {}

    def seconds(expr: TensorExpr) -> float:
        key = expr.content_hash()
        if key not in memo:
            pred = construct(expr, hw, top_k=1, matrix=matrix)[0].prediction
            memo[key] = pred.time_s if pred is not None else float("inf")
        return memo[key]

    return seconds


def _with_shapes(proto: Any, shapes: Mapping[str, Sequence[int]]) -> Any:
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


def build_kernels(graph: Graph, hw: HardwareDesc, backend: Any, top_k: int = 10, evaluate: bool = False,
                  cache: bool = True, jobs: int | None = None, progress: bool | None = None,
                  compile_here: bool | None = None) -> tuple[dict[str, Kernel], int]:
    """(kernel key -> kernel, cache hits): one kernel per distinct operator, built ``jobs`` at a time (the
    device compilers release the interpreter while they work), compiled for this machine's device when the
    backend can run here (``compile_here``), with a progress bar on stderr when it is a terminal. First the
    graph's values that windows read are held padded where they are made (``roller.graph.padding``) and its
    weights are packed, in place, into the layouts construction chooses for their operators."""
    from roller.construction import copy_seconds, read_pads
    from roller.construction.layout import choose_layout
    from roller.graph.padding import hold_padded

    seconds = predicted_seconds(hw, backend.matrix_support)
    hold_padded(graph, lambda expr: read_pads(expr, hw),
                lambda changes, nbytes: sum(seconds(new) for _, new in changes)
                <= sum(seconds(old) for old, _ in changes) + copy_seconds(nbytes, hw))

    def measured(expr: TensorExpr) -> float | None:
        # The kernel the layout would get, built as it will be (a cache hit when it is the one kept), timed with
        # the cores' caches overwritten before each run where the device can: alone and hot, unblocked 3x3
        # weights of ResNet-18 won, and ran 1.4-1.6x slower than the blocked ones inside the model.
        k = build_kernel(expr, hw, backend, top_k=top_k, evaluate=True, use_cache=cache, progress=False)
        args = ordered_inputs(k.launch, random_inputs(expr, seed=0))
        return float(k.runner.time(args, cold=True))

    pack_constants(graph, lambda expr, consts: choose_layout(expr, hw, consts, backend.matrix_support,
                                                             measured if evaluate else None))
    todo = unique_kernels(graph)
    if compile_here is None:
        compile_here = backend.can_run_here()
    bar = Progress(len(todo), f"building {graph.name} ({len(todo)} kernels)", enabled=progress)

    def one(node: OpNode) -> Kernel:
        k = build_kernel(node.expr, hw, backend, top_k=top_k, evaluate=evaluate, use_cache=cache,
                         progress=False)
        if compile_here:
            _ = k.runner
        return k

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


def node_kernels(graph: Graph, kernels: Mapping[str, Kernel]) -> list[tuple[OpNode, Kernel]]:
    """Each operator of the graph with the kernel that runs it."""
    return [(n, kernels[kernel_key(n)]) for n in graph.op_nodes]
