"""A model as a graph: values (tensors with shapes and dtypes), constants (weights), and steps that produce one
value each.

Three kinds of step, all keeping data where it is on the device:

* ``OpNode``: one Roller operator (a ``TensorExpr``); its inputs are the values named in ``inputs``, in the
  order of ``expr.inputs``, and it writes ``output``. Tensor names inside the expression are local to it
  (``X``, ``W``, ``Y``...), so identical operators anywhere in the model have identical expressions.
* ``ViewNode``: the same memory under another shape (reshape, flatten, squeeze, unsqueeze, identity,
  dropout at inference): no kernel, no copy; ``output`` aliases ``input``.
* ``CopyNode``: pieces of values copied into parts of one output (concat, split, slice with step 1): each piece
  is a box of a row-major source copied to a box of the output, which every device does as a strided copy
  without a kernel.

Constants are numpy arrays uploaded once per model. ``Graph.check()`` is the invariant every pass keeps.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np

from roller.dtypes import dtype as dtype_of
from roller.ir.tensor_expr import TensorExpr


@dataclass(frozen=True)
class Border:
    """What surrounds a value held inside a larger buffer: ``pads`` (before, after) per dimension of the
    buffer's shape hold ``fill``, so that windows read it without bounds tests (``roller.graph.padding``)."""

    pads: tuple[tuple[int, int], ...]
    fill: float

    def interior(self, shape: tuple[int, ...]) -> tuple[slice, ...]:
        return tuple(slice(b, n - a) for n, (b, a) in zip(shape, self.pads))


@dataclass(frozen=True)
class Value:
    name: str
    shape: tuple[int, ...]  # with its border, where it has one
    dtype: str = "float32"
    border: Border | None = None  # set: the step that makes it writes only the interior

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * dtype_of(self.dtype).itemsize


@dataclass(frozen=True)
class OpNode:
    name: str  # what the user's model calls it (for messages and reports)
    expr: TensorExpr
    inputs: tuple[str, ...]  # values, in expr.inputs order
    output: str
    origin: str = ""  # e.g. "Conv 'conv1'": the model node it came from

    @property
    def reads(self) -> tuple[str, ...]:
        return self.inputs


@dataclass(frozen=True)
class ViewNode:
    name: str
    input: str
    output: str
    origin: str = ""

    @property
    def reads(self) -> tuple[str, ...]:
        return (self.input,)


@dataclass(frozen=True)
class Piece:
    """Copy ``shape`` elements starting at ``src_start`` of ``source`` to ``dst_start`` of the output (both
    row-major, same rank)."""

    source: str
    src_start: tuple[int, ...]
    dst_start: tuple[int, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CopyNode:
    name: str
    pieces: tuple[Piece, ...]
    output: str
    origin: str = ""

    @property
    def reads(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.source for p in self.pieces))


Node = OpNode | ViewNode | CopyNode


@dataclass
class Graph:
    name: str
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    values: dict[str, Value] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    # (the steps it was made from, by identity; producer; consumers): fusion asks for both thousands of times
    # between changes, and a step list is compared far faster than the maps are rebuilt
    _index: tuple[tuple[int, ...], dict[str, Node], dict[str, list[Node]]] | None = field(
        default=None, repr=False, compare=False)
    # set by ``fixed``: the steps will not change, so the maps are not checked against them again (the fusion
    # solver reads thousands of graphs it never changes, and the check alone took 2.7 s of BERT-base's 9 s)
    _fixed: bool = field(default=False, init=False, repr=False, compare=False)

    def value(self, name: str) -> Value:
        return self.values[name]

    def copy(self) -> Graph:
        """A graph that a pass may change without changing this one: its own lists and maps of the same values,
        steps and arrays (passes replace entries; none changes a step, a value or an array)."""
        return replace(self, inputs=list(self.inputs), outputs=list(self.outputs), values=dict(self.values),
                       constants=dict(self.constants), nodes=list(self.nodes))

    def producer(self) -> dict[str, Node]:
        """The step that makes each value (inputs and constants have none). Shared until the steps change:
        read it, do not change it."""
        return self._maps()[1]

    def consumers(self) -> dict[str, list[Node]]:
        """The steps that read each value read by any (``.get(v, [])`` for the others). Shared as
        ``producer``."""
        return self._maps()[2]

    def fixed(self) -> Graph:
        """This graph, promised never to change its steps again: its maps are built once and trusted."""
        self._fixed = True
        return self

    @contextmanager
    def unchanged(self) -> Iterator[Graph]:
        """This graph, its maps trusted without checking the steps against them until the block ends: a scan
        that changes nothing asks for them thousands of times (comparing the step list each time was 0.8 s of
        BERT-base's 2.2 s warm fusion). Change no step inside the block."""
        if self._fixed:
            yield self
            return
        self._maps()
        self._fixed = True
        try:
            yield self
        finally:
            self._fixed = False

    def replaced_from(self, parent: Graph, old: Sequence[Node], new: Node) -> Graph:
        """This graph, which is ``parent`` with ``old`` replaced by ``new`` placed where the last of them was
        (``fusion._replace``), fixed, its maps derived from ``parent``'s: the fusion solver grows thousands of
        such graphs, and rebuilding each one's maps took a third of BERT-base's fusion. The maps are those a
        rebuild makes, readers in step order, a step once for each time it reads a value."""
        _, producer, readers = parent._maps()
        producer = dict(producer)
        for o in old:
            producer.pop(o.output, None)
        producer[new.output] = new
        readers = dict(readers)
        gone = {id(o) for o in old}
        ids = list(map(id, self.nodes))
        at = ids.index(id(new))
        for v in dict.fromkeys([r for o in old for r in o.reads] + list(new.reads)):
            kept = [n for n in readers.get(v, ()) if id(n) not in gone]
            times = new.reads.count(v)
            if times:
                i = 0
                while i < len(kept) and ids.index(id(kept[i])) < at:
                    i += 1
                kept[i:i] = [new] * times
            if kept:
                readers[v] = kept
            else:
                readers.pop(v, None)
        self._index = ((), producer, readers)
        self._fixed = True
        return self

    def _maps(self) -> tuple[tuple[int, ...], dict[str, Node], dict[str, list[Node]]]:
        if self._fixed and self._index is not None:
            return self._index
        key = tuple(map(id, self.nodes))
        if self._index is None or self._index[0] != key:
            readers: dict[str, list[Node]] = {}
            for n in self.nodes:
                for r in n.reads:
                    readers.setdefault(r, []).append(n)
            self._index = (key, {n.output: n for n in self.nodes}, readers)
        return self._index

    @property
    def op_nodes(self) -> list[OpNode]:
        return [n for n in self.nodes if isinstance(n, OpNode)]

    def check(self) -> None:
        """Every value has one origin (input, constant or step), steps come after what they read, shapes
        agree with what each step reads and writes. AssertionError on a broken graph (a bug, not input)."""
        known = set(self.inputs) | set(self.constants)
        for name in known:
            assert name in self.values, name
        for name, arr in self.constants.items():
            v = self.values[name]
            assert tuple(arr.shape) == v.shape, (name, arr.shape, v.shape)
        for n in self.nodes:
            for r in n.reads:
                assert r in known, f"{n.name} reads {r} before it is made"
            assert n.output not in known, f"{n.output} is made twice"
            made = self.values[n.output]
            if isinstance(n, OpNode):
                assert len(n.inputs) == len(n.expr.inputs)
                for t, vname in zip(n.expr.inputs, n.inputs):
                    assert tuple(t.storage_shape) == self.values[vname].shape, (n.name, t.name, vname)
                    assert t.dtype == self.values[vname].dtype, (n.name, t.name, vname)
                assert tuple(n.expr.output.storage_shape) == made.shape, (n.name, made.shape)
            elif isinstance(n, ViewNode):
                src = self.values[n.input]
                assert src.size == made.size and src.dtype == made.dtype, n.name
            else:
                for p in n.pieces:
                    src = self.values[p.source]
                    assert len(p.shape) == len(src.shape) == len(made.shape), n.name
                    for d in range(len(p.shape)):
                        assert 0 <= p.src_start[d] and p.src_start[d] + p.shape[d] <= src.shape[d], n.name
                        assert 0 <= p.dst_start[d] and p.dst_start[d] + p.shape[d] <= made.shape[d], n.name
            known.add(n.output)
        for o in self.outputs:
            assert o in known, f"output {o} is never made"
