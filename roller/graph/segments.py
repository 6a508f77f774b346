"""Fusion of a large graph one segment at a time, so that its cost grows with the graph's size times a
segment's, not with the square of the graph's: both fusion passes rescan their graph after every rewrite
(and the solver's candidates copy it), which took minutes for a chain of a thousand operators and would take
days for a hundred thousand. Graphs of real models, up to ``WHOLE_UP_TO`` operators, are fused whole, as
before. A segment is a run of consecutive steps holding at most ``size`` operators; values made before it are
its inputs, values read after it (or the model's outputs) its outputs. What fusion loses is only a kernel
across a cut, one in ``size`` operators."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from roller.graph.fusion import FusionReport
from roller.graph.ir import Graph, Node, OpNode

#: a graph of at most this many operators is fused whole (BERT-base and GPT-2 small have about 500)
WHOLE_UP_TO = 1000
#: operators per segment of a larger graph (a segment's fusion costs about the square of its size)
SEGMENT_OPS = 200

Fuser = Callable[[Graph], tuple[Graph, FusionReport]]


def fuse_in_segments(graph: Graph, fuse: Fuser, size: int | None = None, whole: int | None = None
                     ) -> tuple[Graph, FusionReport]:
    """``fuse`` applied to ``graph`` whole when it has at most ``whole`` operators (``WHOLE_UP_TO``), else to
    each segment of ``size`` (``SEGMENT_OPS``); one graph and one report (the counts summed) either way."""
    size = SEGMENT_OPS if size is None else size
    if len(graph.op_nodes) <= (WHOLE_UP_TO if whole is None else whole):
        return fuse(graph)
    chunks: list[list[Node]] = [[]]
    ops = 0
    for n in graph.nodes:
        if isinstance(n, OpNode):
            if ops == size:
                chunks.append([])
                ops = 0
            ops += 1
        chunks[-1].append(n)
    # the last segment that reads each value (the model's outputs are read "after" every segment)
    last_read: dict[str, int] = {o: len(chunks) for o in graph.outputs}
    for i, chunk in enumerate(chunks):
        for n in chunk:
            for r in n.reads:
                last_read[r] = i
    values = dict(graph.values)
    nodes: list[Node] = []
    total: FusionReport | None = None
    for i, chunk in enumerate(chunks):
        made = {n.output for n in chunk}
        reads = list(dict.fromkeys(r for n in chunk for r in n.reads))
        inputs = [r for r in reads if r not in made and r not in graph.constants]
        outputs = [n.output for n in chunk if last_read.get(n.output, -1) > i]
        used = {*reads, *made}
        part = Graph(graph.name, inputs, outputs, {v: values[v] for v in used},
                     {c: a for c, a in graph.constants.items() if c in used}, list(chunk))
        fused, report = fuse(part)
        values.update(fused.values)
        nodes.extend(fused.nodes)
        total = report if total is None else _sum(total, report)
    assert total is not None
    live = {*graph.inputs, *graph.constants, *(n.output for n in nodes)}
    out = Graph(graph.name, list(graph.inputs), list(graph.outputs), {v: values[v] for v in values if v in live},
                dict(graph.constants), nodes)
    out.check()
    return out, total


def _sum(a: FusionReport, b: FusionReport) -> FusionReport:
    counts = {f.name: getattr(a, f.name) + getattr(b, f.name) for f in dataclasses.fields(FusionReport)
              if f.name != "method"}
    return FusionReport(**counts, method=a.method)
