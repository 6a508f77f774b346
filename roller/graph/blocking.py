"""Activations stored with their channels in blocks (NCHW16c), where the micro-performance model says it pays
(issue 43: activation layouts as a construction decision, as weight layouts already are).

A window operator that keeps its channels apart (a depthwise convolution, a pooling) computes its register
tile along the image's last axis, which in MobileNetV2 is 7 to 14 points: a 16-lane vector half empty and
its reads split across lines. Stored as ``X[n, c/16, h, w, c%16]``, the same operator computes whole vectors of
16 channels. The values it reads and writes are then stored so, and so must every operator that reads or
writes those values: the producer (a 1x1 convolution) writes its output blocked, the consumer (the next 1x1
convolution) reduces over the blocked channels. Each such operator is the same function with one axis split
(``roller.ir.block.split_axis``); no conversion step is added. A group of values whose operators cannot all
be split (a view, a copy, a graph input or output, an axis used other than as a plain index) stays as it is.
Weights read along the split axis are stored blocked too, once, at build time.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from roller.graph.ir import Graph, OpNode, Value, ViewNode
from roller.ir.block import block_array, blockable, blocked_dim, blocked_shape, split_axis
from roller.ir.tensor_expr import TensorExpr

Change = tuple[TensorExpr, TensorExpr]  # an operator's expression before and after the split


def block_channels(graph: Graph, lanes: int, worth: Callable[[list[Change]], bool]) -> int:
    """Rewrite ``graph`` in place: for each window operator whose channels pass through (a plain axis of both
    its windowed input and its output that ``lanes`` divides), the values it reads and writes, and those that
    splitting their operators reaches, stored in blocks of ``lanes`` channels, where ``worth(changes)`` says
    so. Each group is tried first as far as it reaches (every other image that its operators read or write
    along channels that divide, so that neighbours agree and nothing converts), then as the window's own
    input and output only. Returns how many groups changed."""
    changed = 0
    for node in list(graph.nodes):
        if not isinstance(node, OpNode) or not any(n is node for n in graph.nodes):
            continue   # split by an earlier group
        seed = _seed(graph, node, lanes)
        if seed is None:
            continue
        tried: list[dict[str, int]] = []
        for extend in (True, False):
            group = _group(graph, seed, lanes, extend)
            if group is None or group[0] in tried:
                continue   # (nothing reached beyond the window's own images: asked once)
            dims, splits = group
            tried.append(dims)
            weights: dict[str, tuple[str, int]] = {}
            rewritten = {i: _split(graph, graph.nodes[i], axes, dims, lanes, weights)   # type: ignore[arg-type]
                         for i, axes in splits.items()}
            if worth([(graph.nodes[i].expr, n.expr) for i, n in rewritten.items()]):   # type: ignore[union-attr]
                _apply(graph, rewritten, dims, lanes, weights)
                changed += 1
                break
    return changed


def blocked_name(value: str, lanes: int) -> str:
    return f"{value}.c{lanes}"


def _seed(graph: Graph, node: OpNode, lanes: int) -> dict[str, int] | None:
    """{value: dimension} of a window operator's windowed input and its output along the channel axis they
    share, or None."""
    expr = node.expr
    if expr.output.dtype != "float32":
        return None
    out_plain = {i.plain_axis(): d for d, i in enumerate(expr.out_index) if i.plain_axis() is not None}
    for t, value in zip(expr.inputs, node.inputs):
        idx = expr.accesses(t.name)
        if value in graph.constants or t.dtype != "float32" or not any(
                len(i.terms) > 1 for index in idx for i in index):
            continue   # only a window's input: some index sums two axes (h + r)
        for a in expr.spatial_axes:
            if a.name not in out_plain or a.extent % lanes or a.name == expr.out_index[-1].plain_axis():
                continue
            d_in = blocked_dim(expr, t.name, a.name)
            d_out = blocked_dim(expr, expr.output.name, a.name)
            if d_in is not None and d_out is not None and blockable(expr, a.name, lanes):
                return {value: d_in, node.output: d_out}
    return None


@dataclass
class _Closure:
    """A group being grown: {value: blocked dimension} and {step position: axes split, in order}."""

    graph: Graph
    lanes: int
    dims: dict[str, int] = field(default_factory=dict)
    splits: dict[int, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.position = {id(n): i for i, n in enumerate(self.graph.nodes)}
        self.producer, self.readers = self.graph.producer(), self.graph.consumers()

    def grow(self, value: str, dim: int, extend: bool) -> bool:
        """Add ``value`` blocked at ``dim`` with everything it forces (the outputs its steps' split axes index);
        with ``extend``, then each value those steps read or write along a channel axis, each where its own
        closure holds. False, and nothing added, where a forced value cannot be blocked."""
        dims, splits = dict(self.dims), {i: list(a) for i, a in self.splits.items()}
        optional: list[tuple[str, int]] = []
        if not self._force(value, dim, optional):
            self.dims, self.splits = dims, splits
            return False
        if extend:
            for v, d in optional:
                if v not in self.dims:
                    self.grow(v, d, extend)
        return True

    def _force(self, value: str, dim: int, optional: list[tuple[str, int]]) -> bool:
        graph, lanes = self.graph, self.lanes
        queue = [(value, dim)]
        while queue:
            value, dim = queue.pop()
            if value in self.dims:
                if self.dims[value] != dim:
                    return False
                continue
            v = graph.values[value]
            if value in graph.inputs or value in graph.outputs or value in graph.constants or \
                    v.border is not None or v.dtype != "float32" or dim >= len(v.shape) or v.shape[dim] % lanes:
                return False
            self.dims[value] = dim
            steps = ([self.producer[value]] if value in self.producer else []) + list(self.readers.get(value, []))
            for step in steps:
                if isinstance(step, ViewNode):
                    other = step.output if value == step.input else step.input
                    mapped = _view_dim(v.shape, graph.values[other].shape, dim)
                    if mapped is None:
                        return False
                    queue.append((other, mapped))
                    continue
                if not isinstance(step, OpNode):
                    return False
                expr = step.expr
                slots = [t.name for t, r in zip(expr.inputs, step.inputs) if r == value] + \
                    ([expr.output.name] if step.output == value else [])
                axis = expr.accesses(slots[0])[0][dim].plain_axis()
                if axis is None or not blockable(expr, axis, lanes) or \
                        any(blocked_dim(expr, s, axis) != dim for s in slots):
                    return False
                axes = self.splits.setdefault(self.position[id(step)], [])
                if axis in axes:
                    continue
                axes.append(axis)
                for t, r in [*zip(expr.inputs, step.inputs), (expr.output, step.output)]:
                    if r in graph.constants or not any(axis in i.coefs for idx in expr.accesses(t.name) for i in idx):
                        continue
                    d = blocked_dim(expr, t.name, axis)
                    if r == step.output:
                        if d is None:
                            return False   # an output indexed by the split axis other than plainly
                        queue.append((r, d))
                    elif d is not None:
                        optional.append((r, d))
                out = expr.out_index
                if len(out) == 4 and step.output not in self.dims and out[1].plain_axis() is not None:
                    optional.append((step.output, 1))   # an image's channels (NCHW)
        return True


def _view_dim(shape: tuple[int, ...], other: tuple[int, ...], dim: int) -> int | None:
    """The dimension of ``other`` that ``dim`` of ``shape`` is, where the two shapes differ only in dimensions of
    size 1 (a view that squeezes or unsqueezes: blocked on both sides it is still the same memory); None for
    any other reshape."""
    kept = [d for d, n in enumerate(shape) if n != 1]
    other_kept = [d for d, n in enumerate(other) if n != 1]
    if [shape[d] for d in kept] != [other[d] for d in other_kept] or dim not in kept:
        return None
    return other_kept[kept.index(dim)]


def _group(graph: Graph, seed: dict[str, int], lanes: int, extend: bool
           ) -> tuple[dict[str, int], dict[int, list[str]]] | None:
    """({value: blocked dimension}, {step position: axes split}) grown from ``seed`` (``_Closure.grow``), or
    None where the seed itself cannot be blocked."""
    closure = _Closure(graph, lanes)
    for value, dim in seed.items():
        if not closure.grow(value, dim, extend):
            return None
    return closure.dims, closure.splits


def _split(graph: Graph, node: OpNode, axes: list[str], dims: dict[str, int], lanes: int,
           weights: dict[str, tuple[str, int]]) -> OpNode:
    """``node`` with ``axes`` split in turn: the group's values and the weights it reads along each axis
    blocked (each blocked weight added to ``weights``: its name -> the array it blocks, a constant or an
    earlier entry, and the dimension)."""
    expr, inputs = node.expr, list(node.inputs)
    # reductions first: a weight blocked along both keeps the output's lanes innermost, where the vectors run
    for axis in sorted(axes, key=lambda a: not expr.axis(a).reduce):
        blocked = []
        for k, (t, r) in enumerate(zip(expr.inputs, inputs)):
            d = blocked_dim(expr, t.name, axis)
            if d is None:
                continue
            current = inputs[k]
            if r in dims and dims[r] == d and current == r:
                inputs[k] = blocked_name(r, lanes)
            elif current in graph.constants or current in weights:
                inputs[k] = f"{current}.c{lanes}d{d}"
                weights[inputs[k]] = (current, d)
            else:
                continue
            blocked.append(t.name)
        if node.output in dims and blocked_dim(expr, expr.output.name, axis) == dims[node.output]:
            blocked.append(expr.output.name)
        expr = split_axis(expr, axis, lanes, blocked)
    out = blocked_name(node.output, lanes) if node.output in dims else node.output
    return replace(node, expr=expr, inputs=tuple(inputs), output=out)


def _apply(graph: Graph, rewritten: dict[int, OpNode], dims: dict[str, int], lanes: int,
           weights: dict[str, tuple[str, int]]) -> None:
    for value, d in dims.items():
        v, name = graph.values.pop(value), blocked_name(value, lanes)
        graph.values[name] = Value(name, blocked_shape(v.shape, d, lanes), v.dtype)
    for name, (source, d) in weights.items():   # in the order made: a source is a constant or made before
        if name not in graph.constants:
            graph.constants[name] = block_array(graph.constants[source], d, lanes)
            graph.values[name] = Value(name, tuple(graph.constants[name].shape), graph.values[source].dtype)
    for i, node in rewritten.items():
        graph.nodes[i] = node
    for i, step in enumerate(graph.nodes):
        if isinstance(step, ViewNode) and step.input in dims:
            graph.nodes[i] = replace(step, input=blocked_name(step.input, lanes),
                                     output=blocked_name(step.output, lanes))
    read = {r for n in graph.nodes for r in n.reads} | set(graph.outputs)
    for name in [c for c in graph.constants if c not in read]:   # weights only the split steps read
        del graph.constants[name]
        del graph.values[name]
