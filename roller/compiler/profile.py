"""Where a model's time goes (issue 43): each step of a run timed on the buffers of a real run, beside what it
computes (the ONNX nodes fused into it), its rate, the micro-performance model's prediction and its share of
the total; the run's own time against the steps' sum (more: launch and synchronisation between different
steps, and caches the steps leave each other cold); and, where onnxruntime is installed and the model came
from an ONNX file, onnxruntime's own per-node profile of the same model for the same inputs.

A step is timed as a run sees it: ``repeat`` samples after a warm-up, each of 10 launches of the step back to
back waited for once, the median per launch kept (``Executor.time_each_step``; a launch waited for alone pays
the device's wake-up, 50-65 us on PoCL, more than a small step's work). A step re-run reads and writes the
buffers a run left (steps are pure functions of their inputs, so the times are those of the run; the values
left behind are not, and the next ``run`` uploads and computes afresh)."""
from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from roller.dtypes import dtype as dtype_of
from roller.graph.ir import CopyNode, Graph, OpNode
from roller.graph.memory import CopyStep, KernelStep


@dataclass(frozen=True)
class StepTime:
    kind: str            # "kernel" or "copy"
    name: str            # the kernel's name, or the copied value
    origin: str          # the model's nodes it computes ("Conv 'conv1' + Relu 'relu1'")
    seconds: float       # median of its launches alone
    predicted_s: float | None   # the micro-performance model's time (kernels)
    flops: int           # arithmetic of one launch (kernels; 0 for copies)
    bytes: int           # bytes it reads and writes once each


@dataclass(frozen=True)
class NodeTime:
    name: str
    op_type: str
    seconds: float       # mean per run


@dataclass(frozen=True)
class Profile:
    model: str
    steps: list[StepTime]
    run_s: float                    # median of whole runs of the steps (inputs uploaded once)
    onnxruntime: list[NodeTime] | None = None
    onnxruntime_run_s: float | None = None

    @property
    def steps_s(self) -> float:
        return sum(s.seconds for s in self.steps)

    def render(self, top: int | None = None) -> str:
        """The profile as text: the steps by time (all, or the ``top`` slowest), the overhead between them, and
        onnxruntime's nodes the same way."""
        total = self.steps_s or 1.0
        gap = self.run_s - self.steps_s
        # each step is timed repeating itself, its inputs warm in the caches: a run, where the previous step
        # wrote them, takes more; less where the steps' own medians happened to be slow
        why = "launch and synchronisation between different steps, and colder caches" if gap >= 0 else \
            "the steps' samples were slower than the run's"
        head = (f"{self.model}: one run {self.run_s * 1e3:.3f} ms; its {len(self.steps)} steps, each timed in "
                f"chains of its own launches, {self.steps_s * 1e3:.3f} ms; the run takes {abs(gap) * 1e3:.3f} ms "
                f"{'more' if gap >= 0 else 'less'} ({why})")
        columns = f"{'#':>3}  {'ms':>8}  {'share':>6}  {'predicted':>9}  {'rate':>13}  {'kind':6}  {'kernel':24}  computes"
        lines = [head, columns]
        shown, rest = _slowest([s.seconds for s in self.steps], top)
        for i in shown:
            s = self.steps[i]
            pred = f"{s.predicted_s * 1e3:.3f}" if s.predicted_s is not None else "-"
            lines.append(f"{i:>3}  {s.seconds * 1e3:8.3f}  {s.seconds / total:6.1%}  {pred:>9}  {_rate(s):>13}  "
                         f"{s.kind:6}  {s.name[:24]:24}  {s.origin}")
        if rest:
            lines.append(f"     {rest[1] * 1e3:8.3f}  {rest[1] / total:6.1%}  ({rest[0]} more steps)")
        if self.onnxruntime is not None:
            ort_total = sum(n.seconds for n in self.onnxruntime) or 1.0
            run = f"one run {self.onnxruntime_run_s * 1e3:.3f} ms; " if self.onnxruntime_run_s is not None else ""
            title = f"onnxruntime, same inputs: {run}its {len(self.onnxruntime)} nodes {ort_total * 1e3:.3f} ms"
            lines += ["", title, f"{'ms':>12}  {'share':>6}  {'op':18}  node"]
            shown, rest = _slowest([n.seconds for n in self.onnxruntime], top)
            for i in shown:
                n = self.onnxruntime[i]
                lines.append(f"{n.seconds * 1e3:12.3f}  {n.seconds / ort_total:6.1%}  {n.op_type[:18]:18}  {n.name}")
            if rest:
                lines.append(f"{rest[1] * 1e3:12.3f}  {rest[1] / ort_total:6.1%}  ({rest[0]} more nodes)")
        return "\n".join(lines)


def _slowest(seconds: list[float], top: int | None) -> tuple[list[int], tuple[int, float] | None]:
    """(the positions of the ``top`` largest ``seconds``, slowest first; (how many others, their sum) or None
    when none is left out)."""
    order = sorted(range(len(seconds)), key=lambda i: -seconds[i])
    if top is None or len(order) <= top:
        return order, None
    return order[:top], (len(order) - top, sum(seconds[i] for i in order[top:]))


def _rate(s: StepTime) -> str:
    if s.seconds <= 0 or not (s.flops or s.bytes):
        return "-"
    if s.flops and s.flops >= s.bytes:   # arithmetic at least one per byte moved: a compute rate says more
        return f"{s.flops / s.seconds / 1e9:.1f} GFLOP/s"
    return f"{s.bytes / s.seconds / 1e9:.1f} GB/s"


class _Built(Protocol):
    """What a step's kernel tells the profile (``Kernel`` and ``BuiltKernel`` alike)."""

    @property
    def name(self) -> str: ...

    @property
    def predicted_ms(self) -> float | None: ...


def step_times(graph: Graph, steps: Sequence[KernelStep | CopyStep], kernels: Mapping[str, _Built],
               seconds: Sequence[float]) -> list[StepTime]:
    """Each of a plan's ``steps`` with its measured ``seconds``, named by the graph's node it runs."""
    # steps follow the graph's nodes in order, and several nodes may share a name (an ONNX node translated into
    # a view and an operator, or into two operators): each step takes the first unused node of its name and kind
    unused = list(graph.nodes)
    out = []
    for step, s in zip(steps, seconds):
        kind = OpNode if isinstance(step, KernelStep) else CopyNode
        at = next((i for i, n in enumerate(unused) if n.name == step.node and isinstance(n, kind)), None)
        node = unused.pop(at) if at is not None else None
        # a node translated into several operators names its origin once for each
        origin = " + ".join(dict.fromkeys(node.origin.split(" + "))) if node is not None and node.origin \
            else step.node
        if isinstance(step, KernelStep):
            k = kernels[step.kernel]
            expr = node.expr if isinstance(node, OpNode) else None
            predicted = k.predicted_ms / 1e3 if k.predicted_ms is not None else None
            out.append(StepTime("kernel", k.name, origin, s, predicted, expr.flops if expr else 0,
                                expr.bytes if expr else 0))
        else:
            moved = sum(math.prod(p.shape) * dtype_of(graph.values[p.source].dtype).itemsize
                        for p in node.pieces) if isinstance(node, CopyNode) else 0
            out.append(StepTime("copy", step.node, origin, s, None, 0, 2 * moved))
    return out


def onnxruntime_profile(source: Any, arrays: Mapping[str, Any], repeat: int
                        ) -> tuple[list[NodeTime] | None, float | None]:
    """onnxruntime's per-node times for the ONNX model ``source`` on ``arrays`` (mean per run over ``repeat``
    runs after one warm-up, 2 intra-op threads, every graph optimisation: its nodes are its own fused ones) and
    its median run; (None, None) without onnxruntime."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None, None

    with tempfile.TemporaryDirectory(prefix="roller-ort-profile-") as tmp:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 2
        opts.log_severity_level = 3
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tmp, "ort")
        sess = ort.InferenceSession(source.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        feeds = dict(arrays)
        sess.run(None, feeds)
        runs = []
        for _ in range(repeat):
            t = time.perf_counter()
            sess.run(None, feeds)
            runs.append(time.perf_counter() - t)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    totals: dict[str, list[float]] = {}
    kinds: dict[str, str] = {}
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        totals.setdefault(name, []).append(float(e.get("dur", 0)) * 1e-6)
        kinds[name] = str(e.get("args", {}).get("op_name", "?"))
    # the warm-up run's events come first: each node's last ``repeat`` are the timed runs
    nodes = [NodeTime(n, kinds[n], sum(ts[-repeat:]) / min(repeat, len(ts))) for n, ts in totals.items()]
    return nodes, statistics.median(runs)
