"""Values written where their readers' windows want them (issue 23's layout decision, at the model level).

On a CPU a window (a convolution's ``X[h+r-1, w+s-1]``) reads a padded copy of its input, so that no read
needs a bounds test; an executor then copies the value into the interior of a buffer that holds the pad value
around it, before every such kernel. On PoCL that copy ran at a single core's memory speed: in MobileNetV2 the
18 copies took 1.5 ms of a 9.7 ms run. Where the readers that pad a value all want the same padding, the
operator that makes the value writes it into that interior itself (``write_padded``: the same operator with
its output's index moved), every reader reads the padded value as it is (``read_padded``: the window without a
copy, a residual add its interior), and the plan gives it a buffer filled once (``roller.graph.memory``): no
copy is left. The caller's ``worth`` (the micro-performance model, in ``roller.compiler.model.pad_stage``)
decides per value, since a producer whose rows no longer fuse can run slower than the copy it saves.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from roller.graph.ir import Border, Graph, OpNode, Value
from roller.ir.expr import gathers
from roller.ir.fuse import read_padded, write_padded
from roller.ir.tensor_expr import TensorExpr

Pads = tuple[tuple[int, int], ...]
Change = tuple[TensorExpr, TensorExpr]  # an operator's expression before and after the rewrite


def hold_padded(graph: Graph, read_pads: Callable[[TensorExpr], Mapping[str, Pads]],
                worth: Callable[[list[Change], int], bool] = lambda changes, nbytes: True) -> int:
    """Rewrite ``graph`` in place so that each value that some readers read with one padding (``read_pads``:
    per input of an operator, the padding its kernels read it with) and the others as it is, is made inside
    that padding by its producer; the readers that wanted no padding read its interior. Done where
    ``worth(changes, bytes copied)`` says it pays (``changes``: the producer, then every reader that reads
    the value as it is, each before and after; what is saved is the copy of the value before each padded
    reader). Graph inputs, outputs and constants, values a view or copy reads, and values of row
    kernels stay as they are. Returns how many values changed."""
    changed = 0
    for name in list(graph.values):
        held = _held(graph, name, read_pads)
        if held is None:
            continue
        pads, fill = held
        v = graph.values[name]
        rewritten: dict[int, OpNode] = {}
        changes: list[Change] = []
        copies = 0
        for i, node in enumerate(graph.nodes):
            if not isinstance(node, OpNode):
                continue
            if node.output == name:
                rewritten[i] = replace(node, expr=write_padded(node.expr, pads), output=f"{name}.padded")
                changes.insert(0, (node.expr, rewritten[i].expr))
            elif name in node.inputs:
                slots = {t.name: pads for t, r in zip(node.expr.inputs, node.inputs) if r == name}
                rewritten[i] = replace(node, expr=read_padded(node.expr, slots),
                                       inputs=tuple(f"{name}.padded" if r == name else r for r in node.inputs))
                padded = sum(1 for t in slots if t in read_pads(node.expr))
                copies += padded
                if padded < len(slots):
                    changes.append((node.expr, rewritten[i].expr))
        if not worth(changes, copies * v.nbytes):
            continue
        graph.values[f"{name}.padded"] = Value(f"{name}.padded", tuple(n + b + a for n, (b, a) in
                                                                      zip(v.shape, pads)), v.dtype, Border(pads, fill))
        for i, node in rewritten.items():
            graph.nodes[i] = node
        del graph.values[name]
        changed += 1
    return changed


def _held(graph: Graph, name: str, read_pads: Callable[[TensorExpr], Mapping[str, Pads]]
          ) -> tuple[Pads, float] | None:
    """(padding, fill) that the readers of ``name`` that pad it want (all alike, at least one), or None where
    it stays as it is."""
    v = graph.values[name]
    if v.border is not None or name in graph.outputs or name in graph.inputs or name in graph.constants:
        return None
    made = [n for n in graph.nodes if n.output == name]
    if len(made) != 1 or not isinstance(made[0], OpNode) or made[0].expr.stages:
        return None
    readers = [n for n in graph.nodes if name in n.reads]
    if not readers or not all(isinstance(n, OpNode) for n in readers) or \
            any(gathers(n.expr.body) for n in readers):   # type: ignore[union-attr]  # OpNodes, tested above
        # (a read through a run-time index addresses the dimension as it is: no border may shift it)
        return None
    wanted: set[tuple[Pads, float]] = set()
    for n in readers:
        assert isinstance(n, OpNode)
        by_input = read_pads(n.expr)
        for t, r in zip(n.expr.inputs, n.inputs):
            if r == name and t.name in by_input:
                wanted.add((by_input[t.name], n.expr.pad_value))
    return wanted.pop() if len(wanted) == 1 else None
