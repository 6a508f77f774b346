"""Graph passes: dead-step removal, and which operators share one kernel."""
from __future__ import annotations

from dataclasses import replace

from roller.graph.ir import CopyNode, Graph, OpNode, ViewNode


def remove_dead(graph: Graph) -> Graph:
    """Steps and constants nothing reaches the outputs through, and values nobody makes or reads, removed."""
    producer = graph.producer()
    live: set[str] = set()
    stack = list(graph.outputs)
    while stack:
        v = stack.pop()
        if v in live:
            continue
        live.add(v)
        node = producer.get(v)
        if node is not None:
            stack.extend(node.reads)
    nodes = [n for n in graph.nodes if n.output in live]
    keep = live | set(graph.inputs)
    return replace(graph, nodes=nodes, constants={k: a for k, a in graph.constants.items() if k in live},
                   values={k: v for k, v in graph.values.items() if k in keep})


def kernel_key(node: OpNode) -> str:
    """Operators with the same key compute the same function of their inputs (same expression, shapes, dtypes
    and pad value; names of tensors and of the op aside): one kernel serves them all."""
    return node.expr.content_hash()


def unique_kernels(graph: Graph) -> dict[str, OpNode]:
    """The first operator of each kernel key, in graph order."""
    out: dict[str, OpNode] = {}
    for n in graph.op_nodes:
        out.setdefault(kernel_key(n), n)
    return out


def alias_root(graph: Graph) -> dict[str, str]:
    """Value -> the value whose memory it is (itself, or what a chain of views starts from)."""
    root = {v: v for v in graph.values}
    for n in graph.nodes:
        if isinstance(n, ViewNode):
            root[n.output] = root[n.input]
    return root


def step_count(graph: Graph) -> dict[str, int]:
    """Kernels and copies per kind of step (views cost nothing)."""
    return {"kernels": sum(isinstance(n, OpNode) for n in graph.nodes),
            "copies": sum(isinstance(n, CopyNode) for n in graph.nodes),
            "views": sum(isinstance(n, ViewNode) for n in graph.nodes)}
