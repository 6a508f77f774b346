"""Graph passes: dead-step removal, weights packed into the layouts construction chooses, and which operators
share one kernel."""
from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from roller.graph.ir import CopyNode, Graph, OpNode, Value, ViewNode
from roller.ir.layout import PackedLayout
from roller.ir.tensor_expr import TensorExpr


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


class Packing(Protocol):
    """What ``pack_constants`` asks of construction: the packed form of an operator whose inputs named in
    the tuple are constants, or None (``roller.construction.layout.choose_layout``)."""
    def __call__(self, expr: TensorExpr, constants: tuple[str, ...]) -> PackedLayout | None: ...


def pack_constants(graph: Graph, choose: Packing) -> int:
    """Store weights in the layouts construction chooses for the operators that read them, once, at build
    time: each chosen operator is rewritten to read its own transposed copy of the constant (the original
    is dropped when nothing else reads it). Updates ``graph`` in place; returns how many operators changed."""
    consumers = {v: list(ns) for v, ns in graph.consumers().items()}   # changed below: our own copy
    memo: dict[tuple[str, tuple[str, ...], tuple[str, ...]], PackedLayout | None] = {}
    changed = 0
    for pos, node in enumerate(graph.nodes):
        if not isinstance(node, OpNode):
            continue
        consts = tuple(t.name for t, v in zip(node.expr.inputs, node.inputs) if v in graph.constants)
        if not consts:
            continue
        key = (node.expr.content_hash(), tuple(t.name for t in node.expr.tensors), consts)
        if key not in memo:
            memo[key] = choose(node.expr, consts)
        packed = memo[key]
        if packed is None:
            continue
        i = [t.name for t in node.expr.inputs].index(packed.tensor)
        old = node.inputs[i]
        new = f"{old}.packed{packed.tag}.{node.output}"
        graph.constants[new] = packed.apply(graph.constants[old])
        graph.values[new] = Value(new, tuple(graph.constants[new].shape), graph.values[old].dtype)
        inputs = node.inputs[:i] + (new,) + node.inputs[i + 1:]
        graph.nodes[pos] = replace(node, expr=replace(packed.expr, name=node.expr.name),
                                   inputs=inputs)
        consumers[old].remove(node)
        if not consumers[old] and old not in graph.outputs:
            del graph.constants[old], graph.values[old]
        changed += 1
    return changed
