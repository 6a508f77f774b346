"""A model with one open size run by shape-generic kernels: built once, no compilation at a new size.

The model is imported and fused at two sizes of its symbol (the greatest, and half of it; the second fusion
replays the first one's costs). Where both graphs have the same steps and every size that differs between them
is a multiple of the symbol, the graph at any size is the greatest one's with those sizes scaled
(``GraphFamily.at``; checked to reproduce the second import exactly), and each operator a ``ScaledOp``.
Operators with a shape-generic kernel set (``roller.construction.generic``: the symbol leads the tensors they
index, or their kernels take it as an argument) are built once; the others are built for each size at its
first run. A run at size ``v`` plans the graph at a capacity that holds every kernel's covered rows, launches
each operator's kernel (the one the model picks for ``v``, on the blocks covering ``v``; or the one built for
``v``), and copies in and out the inputs' and outputs' first ``v`` rows. A larger size later re-plans at a
larger capacity (device memory grows by powers of two; nothing is compiled for the kernel sets).

A value the symbol does not lead (attention's scores: the key length is their inner dimension) is held in
its layout at the greatest size, where every operator that touches it has a kernel set that takes the size as
an argument (``roller.construction.symbol_args``); otherwise those operators are built for each size and hold it
as it is at that size.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roller.compiler.target import Target, TargetBound
from roller.construction.generic import KernelSet, construct_generic
from roller.dtypes import dtype as dtype_of
from roller.errors import InputError
from roller.graph import Graph, InputPad, OpNode, plan
from roller.graph.ir import CopyNode, Piece, ViewNode
from roller.graph.passes import kernel_key
from roller.ir.symbolic import SymbolicOp
from roller.ir.tensor_expr import TensorDecl, TensorExpr
from roller.runtime.device import Device, Runner
from roller.runtime.executor import Executor


def _factor(a: int, b: int, hi: int, other: int) -> int | None:
    """f where ``a`` is ``hi * f`` and ``b`` is ``other * f`` (a size that is a multiple of the symbol)."""
    return a // hi if a % hi == 0 and b % other == 0 and a // hi == b // other and a // hi > 0 else None


def _scaled(sizes: tuple[int, ...], grow: Mapping[int, int], v: int) -> tuple[int, ...]:
    return tuple(v * grow[i] if i in grow else d for i, d in enumerate(sizes))


def _growth(a: tuple[int, ...], b: tuple[int, ...], hi: int, other: int, what: str) -> dict[int, int]:
    if len(a) != len(b):
        raise _Mismatch(f"{what} changes rank with the size")
    out = {}
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            f = _factor(x, y, hi, other)
            if f is None:
                raise _Mismatch(f"{what} dimension {i} is {x} at one size and {y} at another: not a multiple of it")
            out[i] = f
    return out


def _rows(array: np.ndarray, grow: Mapping[int, int], v: int) -> np.ndarray:
    """A constant at size ``v``: its first rows along the dimensions that grow. A constant that grows so (the
    position embeddings of the first ``s`` positions, a causal mask's first rows) is the greatest size's
    prefix at every size, which the family checks at the second size."""
    if not grow:
        return array
    return array[tuple(slice(0, v * grow[i]) if i in grow else slice(None) for i in range(array.ndim))]


class _Mismatch(Exception):
    pass


@dataclass
class ScaledOp(SymbolicOp):
    """A graph operator at any size of the symbol: the operator at the greatest size with its growing axes'
    extents and tensor dimensions scaled (its axis order and layouts, which construction and the weight packing
    chose, stay as they are; an op.json round trip would not keep them)."""

    top: TensorExpr | None = None
    axes_grow: dict[int, int] = field(default_factory=dict)  # axis index -> factor
    tensor_grow: dict[str, dict[int, int]] = field(default_factory=dict)  # tensor -> {dimension: factor}

    def instantiate(self, values: Mapping[str, int]) -> TensorExpr:
        key = self.check_values(values)
        if key not in self._cache:
            assert self.top is not None
            v = key[0]

            def grow(t: TensorDecl) -> TensorDecl:
                g = self.tensor_grow.get(t.name)
                return dataclasses.replace(t, shape=_scaled(t.shape, g, v)) if g else t

            e = self.top
            axes = tuple(dataclasses.replace(a, extent=v * self.axes_grow[i]) if i in self.axes_grow else a
                         for i, a in enumerate(e.axes))
            self._cache[key] = dataclasses.replace(e, axes=axes, inputs=tuple(grow(t) for t in e.inputs),
                                                   output=grow(e.output))
        return self._cache[key]

    def growth(self) -> dict[str, dict[int, tuple[str, int]]]:
        sym = self.symbols[0]
        return {t: {d: (sym, f) for d, f in g.items()} for t, g in self.tensor_grow.items()}


def _scaled_op(a: OpNode, b: OpNode, sym: str, lo: int, hi: int, other: int) -> ScaledOp | None:
    """The operator of two nodes (the same operator at two sizes) at any size; None where it does not change."""
    ea, eb = a.expr, b.expr
    if len(ea.axes) != len(eb.axes) or [t.name for t in ea.tensors] != [t.name for t in eb.tensors]:
        raise _Mismatch(f"operator {a.name} is not the same operator at both sizes")
    axes_grow = _growth(tuple(x.extent for x in ea.axes), tuple(x.extent for x in eb.axes), hi, other,
                        f"operator {a.name}'s axes")
    tensor_grow = {}
    for t, u in zip(ea.tensors, eb.tensors):
        if t.view is not None or t.orig_shape is not None:
            if t != u:
                raise _Mismatch(f"operator {a.name} reads {t.name} through a view that changes with the size")
            continue
        g = _growth(t.shape, u.shape, hi, other, f"operator {a.name}'s {t.name}")
        if g:
            tensor_grow[t.name] = g
    if not axes_grow and not tensor_grow:
        if ea.content_hash() != eb.content_hash():
            raise _Mismatch(f"operator {a.name} changes with the size other than in its sizes")
        return None
    op = ScaledOp({"name": ea.name}, {sym: (lo, hi)}, None, top=ea, axes_grow=axes_grow, tensor_grow=tensor_grow)
    if op.instantiate({sym: other}).content_hash() != eb.content_hash() or op.instantiate({sym: other}) != eb:
        raise _Mismatch(f"operator {a.name} changes with the size other than in its sizes")
    return op


@dataclass
class GraphFamily:
    """A fused graph at the symbol's greatest size, and what changes with the size."""

    top: Graph
    symbol: str
    greatest: int
    values: dict[str, dict[int, int]]  # value -> {dimension: factor} of the dimensions that grow
    # keyed by the value a step writes (node names repeat: one ONNX node can become several steps)
    ops: dict[str, ScaledOp | None]  # -> the step's operator at any size (None: the same at every size)
    pieces: dict[tuple[str, int], tuple[dict[int, int], dict[int, int], dict[int, int]]]  # (output, piece) ->
    # growth of src_start, dst_start, shape
    _graphs: dict[int, Graph] = field(default_factory=dict, repr=False)

    def at(self, v: int) -> Graph:
        """The graph at size ``v``."""
        if v not in self._graphs:
            g = self.top
            values = {n: dataclasses.replace(val, shape=_scaled(val.shape, self.values.get(n, {}), v))
                      for n, val in g.values.items()}
            nodes: list[Any] = []
            for node in g.nodes:
                if isinstance(node, OpNode):
                    op = self.ops[node.output]
                    nodes.append(node if op is None else dataclasses.replace(node, expr=op.instantiate(
                        {self.symbol: v})))
                elif isinstance(node, CopyNode):
                    pieces = []
                    for i, p in enumerate(node.pieces):
                        gs, gd, gz = self.pieces[(node.output, i)]
                        pieces.append(Piece(p.source, _scaled(p.src_start, gs, v), _scaled(p.dst_start, gd, v),
                                            _scaled(p.shape, gz, v)))
                    nodes.append(dataclasses.replace(node, pieces=tuple(pieces)))
                else:
                    nodes.append(node)
            constants = {n: _rows(arr, self.values.get(n, {}), v) for n, arr in g.constants.items()}
            self._graphs[v] = Graph(g.name, list(g.inputs), list(g.outputs), values, constants, nodes)
        return self._graphs[v]


def graph_family(top: Graph, other_graph: Graph, sym: str, lo: int, hi: int, other: int) -> GraphFamily | str:
    """The family of two fused imports of one model (at ``hi`` and ``other``), or why they are not one."""
    try:
        # Steps are matched by the value they write: fusion may order independent steps otherwise at another
        # size, which changes nothing (the greatest size's order is the one run).
        others = {n.output: n for n in other_graph.nodes}
        if (top.inputs, top.outputs) != (other_graph.inputs, other_graph.outputs) or \
                set(top.values) != set(other_graph.values) or len(others) != len(top.nodes) or \
                any(type(others.get(n.output)) is not type(n) or others[n.output].name != n.name for n in top.nodes):
            raise _Mismatch("the graph's steps differ between sizes (fusion or import decided otherwise)")
        values = {}
        for name, val in top.values.items():
            grow = _growth(val.shape, other_graph.values[name].shape, hi, other, f"value {name}")
            if grow:
                values[name] = grow
        for name, arr in top.constants.items():
            if name not in other_graph.constants or not np.array_equal(
                    _rows(arr, values.get(name, {}), other), other_graph.constants[name]):
                raise _Mismatch(f"constant {name} changes with the size")
        ops: dict[str, ScaledOp | None] = {}
        pieces: dict[tuple[str, int], tuple[dict[int, int], dict[int, int], dict[int, int]]] = {}
        for a, b in ((n, others[n.output]) for n in top.nodes):
            if isinstance(a, OpNode) and isinstance(b, OpNode):
                if (a.inputs, a.output) != (b.inputs, b.output):
                    raise _Mismatch(f"operator {a.name} reads or writes other values at another size")
                ops[a.output] = _scaled_op(a, b, sym, lo, hi, other)
            elif isinstance(a, CopyNode) and isinstance(b, CopyNode):
                if len(a.pieces) != len(b.pieces):
                    raise _Mismatch(f"copy {a.name} has other pieces at another size")
                for i, (p, q) in enumerate(zip(a.pieces, b.pieces)):
                    if p.source != q.source:
                        raise _Mismatch(f"copy {a.name} has other pieces at another size")
                    pieces[(a.output, i)] = (_growth(p.src_start, q.src_start, hi, other, f"copy {a.name}"),
                                           _growth(p.dst_start, q.dst_start, hi, other, f"copy {a.name}"),
                                           _growth(p.shape, q.shape, hi, other, f"copy {a.name}"))
            elif isinstance(a, ViewNode) and isinstance(b, ViewNode) and (a.input, a.output) != (b.input, b.output):
                raise _Mismatch(f"view {a.name} differs between sizes")
    except _Mismatch as err:
        return str(err)
    fam = GraphFamily(top, sym, hi, values, ops, pieces)
    check = fam.at(other)
    if {k: v.shape for k, v in check.values.items()} != {k: v.shape for k, v in other_graph.values.items()}:
        return "the graph at another size is not the greatest one's with its sizes substituted"
    try:
        check.check()
    except AssertionError as err:
        return f"the graph with its sizes substituted does not hold together ({err})"
    return fam


def _leads(shape: tuple[int, ...], grow: Mapping[int, int]) -> bool:
    """True when only unit dimensions precede the one growing dimension: the rows of a size are a prefix."""
    return len(grow) == 1 and all(d == 1 for d in shape[:min(grow)])


@dataclass
class GenericModel(TargetBound):
    """A model with one open size, its operators kernel sets or built per size (see the module docstring)."""

    family: GraphFamily
    target: Target
    sets: dict[str, KernelSet]  # the value an op node writes -> its kernel set (one operator: one set)
    artifacts: dict[int, list[Any]]  # id(kernel set) -> rendered kernels
    device: Device
    # the value an op node writes -> its operator and why it has no kernel set: built for each size instead
    exact: dict[str, tuple[ScaledOp, str]] = field(default_factory=dict)
    build_s: float = 0.0
    # values held in their layout at the greatest size (the symbol does not lead them; runtime-extent kernels)
    greatest_layout: frozenset[str] = frozenset()
    _runners: dict[tuple[int, int], Runner] = field(default_factory=dict, repr=False)
    _executor: Executor | None = field(default=None, repr=False)
    _capacity: int = 0
    _exact_runners: dict[tuple[str, int], Runner] = field(default_factory=dict, repr=False)
    # the value an elementwise op node writes -> its kernel at the greatest size, launched whole at every size
    # (see ``_whole``); with any, every buffer is planned at the greatest size
    whole: dict[str, Runner] = field(default_factory=dict)
    _launches: dict[tuple[int, int], dict[str, Runner]] = field(default_factory=dict, repr=False)
    # every size runs on one set of buffers with launchers set for it: runs from several threads take turns
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    @property
    def kernels_compiled(self) -> int:
        """Kernels compiled so far: the kernel sets' (at build) and the per-size operators'."""
        return len(self._runners) + len(self._exact_runners) + len(self.whole)

    @property
    def per_size_compiled(self) -> int:
        return len(self._exact_runners)

    def exact_runner(self, output: str, v: int) -> Runner:
        """The kernel of a per-size operator at size ``v`` (built and compiled at its first use)."""
        from roller.compiler.kernel import build_kernel

        op = self.exact[output][0]
        expr = op.instantiate({self.family.symbol: v})
        key = (expr.content_hash(), v)
        if key not in self._exact_runners:
            self._exact_runners[key] = build_kernel(expr, self.target).runner
        return self._exact_runners[key]

    def runner(self, ks: KernelSet, i: int) -> Runner:
        key = (id(ks), i)
        if key not in self._runners:
            self._runners[key] = self.backend.compile(self.artifacts[id(ks)][i], self.hw, None)
        return self._runners[key]

    def capacity(self, v: int) -> int:
        """Rows of the symbol every buffer must hold to run size ``v``: the most any kernel's blocks cover."""
        if self.whole:
            return self.family.greatest
        need = max([v] + [ks.rows(ks.choose(v), v) for ks in self.sets.values()])
        cap = 1
        while cap < need:
            cap *= 2
        return min(max(cap, self._capacity), self.family.greatest)

    def executor(self, v: int) -> Executor:
        """The executor whose buffers hold size ``v`` (re-planned, and the constants uploaded again, when a
        size needs more than the last plan holds)."""
        cap = self.capacity(v)
        if self._executor is None or cap > self._capacity:
            g = self.family.at(cap)
            if self.greatest_layout:
                top = self.family.top
                g = Graph(g.name, list(g.inputs), list(g.outputs),
                          {n: top.values[n] if n in self.greatest_layout else val for n, val in g.values.items()},
                          {n: top.constants[n] if n in self.greatest_layout else arr for n, arr in g.constants.items()},
                          list(g.nodes))
            pads: dict[str, tuple[InputPad | None, ...]] = {}
            for node in g.op_nodes:
                if node.output in self.sets:
                    pads[kernel_key(node)] = self._pads(self.sets[node.output], node, cap)
            p = plan(g, pads)
            self._executor = Executor(g, p, {}, self.device)
            self._capacity = cap
        return self._executor

    def _pads(self, ks: KernelSet, node: OpNode, cap: int) -> tuple[InputPad | None, ...]:
        """How the node's kernels read each input at capacity ``cap``: launch.json's padding (built at the
        greatest size), with the padded shape's growing dimension at ``cap``."""
        out: list[InputPad | None] = []
        for spec, t in zip([a for a in self.artifacts[id(ks)][0].launch["arguments"] if a["role"] == "input"],
                           node.expr.inputs):
            p = spec.get("pad")
            if p is None:
                out.append(None)
                continue
            shape = tuple(int(d) + b + a for d, b, a in zip(t.storage_shape, p["before"], p["after"]))
            out.append(InputPad(shape, tuple(zip(p["before"], p["after"])), float(p["value"]),
                                spec.get("dtype", "float32")))
        return tuple(out)

    def _launchers(self, v: int, ex: Executor) -> dict[str, Runner]:
        """Each kernel key's launch at size ``v`` on the current plan (made once per size and capacity: every
        run at a size launches the same)."""
        if (v, self._capacity) not in self._launches:
            self._launches[(v, self._capacity)] = self._make_launchers(v, ex)
        return self._launches[(v, self._capacity)]

    def _make_launchers(self, v: int, ex: Executor) -> dict[str, Runner]:
        out: dict[str, Runner] = {}
        for node in ex.graph.op_nodes:
            key = kernel_key(node)
            if key in out:
                continue
            if node.output in self.exact:
                out[key] = self.exact_runner(node.output, v)
                continue
            if node.output in self.whole:
                out[key] = self.whole[node.output]
                continue
            ks = self.sets[node.output]
            i = ks.choose(v)
            # Shapes at the capacity the buffers hold (a launch reads only its grid: the plan moves the data).
            shapes = [p.shape if p is not None else tuple(t.storage_shape)
                      for p, t in zip(self._pads(ks, node, self._capacity), node.expr.inputs)]
            out[key] = self.runner(ks, i).with_launch(ks.blocks(i, v), [*shapes, tuple(node.expr.output.storage_shape)],
                                                      ks.scalars(v))
        return out

    def value_shape(self, name: str, v: int) -> tuple[int, ...]:
        val = self.family.top.values[name]
        return _scaled(val.shape, self.family.values.get(name, {}), v)

    def _held(self, name: str, v: int) -> tuple[tuple[int, ...], tuple[slice, ...] | None]:
        """How an input or output at size ``v`` lies in its buffer: the buffer's shape, and where the value is
        in it (None where it is the buffer's first elements: the size leads it, or the operators that touch it
        are built per size and read it as it lies at that size)."""
        shape = self.value_shape(name, v)
        held = tuple(self.family.top.values[name].shape)
        if name not in self.greatest_layout or held == shape:
            return shape, None
        return held, tuple(slice(0, d) for d in shape)

    def run(self, inputs: Mapping[str, np.ndarray], v: int) -> dict[str, np.ndarray]:
        with self._lock:
            return self._run(inputs, v)

    def _run(self, inputs: Mapping[str, np.ndarray], v: int) -> dict[str, np.ndarray]:
        ex = self._prepare(inputs, v)
        ex.enqueue()
        outputs = {}
        for name in ex.graph.outputs:
            val = ex.graph.values[name]
            kind = dtype_of(val.dtype)
            shape, where = self._held(name, v)
            host: np.ndarray = np.empty(shape, dtype=kind.storage)
            self.device.download(ex.buffers[ex.plan.value_buffer[name]], host)
            outputs[name] = kind.from_storage(host if where is None else np.ascontiguousarray(host[where]))
        return outputs

    def _prepare(self, inputs: Mapping[str, np.ndarray], v: int) -> Executor:
        ex = self.executor(v)
        ex.runners = self._launchers(v, ex)
        ex.load_constants()
        if ex.poisoned:
            ex.poison()
        for name in ex.graph.inputs:
            val = ex.graph.values[name]
            arr: np.ndarray = np.ascontiguousarray(inputs[name], dtype=dtype_of(val.dtype).host)
            if tuple(arr.shape) != self.value_shape(name, v):
                raise InputError(f"input {name!r} has shape {list(arr.shape)}, the model takes "
                                 f"{list(self.value_shape(name, v))} at {self.family.symbol}={v}")
            shape, where = self._held(name, v)
            if where is not None:
                # The size does not lead it: its rows lie apart in the buffer, the gaps never read as data.
                whole = np.zeros(shape, arr.dtype)
                whole[where] = arr
                arr = whole
            self.device.upload(ex.buffers[ex.plan.value_buffer[name]], dtype_of(val.dtype).to_storage(arr))
        return ex

    def time(self, inputs: Mapping[str, np.ndarray], v: int, repeat: int = 10, warmup: int = 2) -> list[float]:
        """Seconds of each of ``repeat`` runs of the steps at size ``v`` (inputs uploaded once)."""
        with self._lock:
            return self._prepare(inputs, v).time_steps(repeat, warmup)


def _greatest_layout(family: GraphFamily, sets: Mapping[str, KernelSet],
                     exact: Mapping[str, tuple[ScaledOp, str]]) -> frozenset[str] | str:
    """The values held in their layout at the greatest size (those the symbol does not lead), or why they
    cannot be: an operator built per size touches one, or a view reads one otherwise than that layout lays it
    out."""
    g = family.top
    inner = _not_led(family)
    for node in g.op_nodes:
        touched = inner & {*node.inputs, node.output}
        if touched and node.output in exact:
            return f"{exact[node.output][1]}, and it reads or writes {min(touched)}, which the size does not lead"
    for view in g.nodes:
        if isinstance(view, ViewNode) and {view.input, view.output} & inner:
            for v in sorted({min(2, family.greatest), min(3, family.greatest)}):
                if not _same_offsets(family, view.input, view.output, v):
                    return f"view {view.name} reads {view.input} otherwise than it lies at the greatest size"
    return frozenset(inner)


def _not_led(family: GraphFamily) -> set[str]:
    """The values that grow with the size other than in their leading dimension (after unit ones)."""
    return {n for n, grow in family.values.items() if not _leads(family.top.values[n].shape, grow)}


def _same_offsets(family: GraphFamily, a: str, b: str, v: int) -> bool:
    """Whether every element of values ``a`` and ``b`` (one a view of the other) at size ``v`` lies at the
    same offset when each is held in its layout at the greatest size."""
    def offsets(name: str) -> np.ndarray:
        at_v = _scaled(family.top.values[name].shape, family.values.get(name, {}), v)
        index = np.unravel_index(np.arange(int(np.prod(at_v))), at_v)
        return np.ravel_multi_index(index, family.top.values[name].shape)

    return bool(np.array_equal(offsets(a), offsets(b)))


def _whole(family: GraphFamily, node: OpNode, op: ScaledOp) -> bool:
    """Whether an operator without a kernel set can run its kernel built for the greatest size, whole, at every
    size: it is elementwise and writes a value the size does not lead (held in the greatest size's layout; so is
    every such value it reads, and the values the size leads are then planned at the greatest size too, where
    their layout is that one). Its points past the size read and write padding, never read as data. (GPT-2's
    causal Where and mask Add over the scores ``[h, s, s]``: construction fuses the two length axes, which
    neither a prefix of the grid nor a runtime extent serves; the whole ``[h, G, G]`` costs microseconds.)"""
    e = op.top
    if e is None or e.reduce_axes or e.stages or e.epilogue is not None:
        return False
    return node.output in _not_led(family)


def generic_model(family: GraphFamily, target: Target, evaluate: bool = False) -> GenericModel | str:
    """Kernel sets for the operators of ``family`` that have one (compiled and launched once each, so that no
    run compiles them), the others built for each size at its first run; or why the model cannot run so.
    With ``evaluate``, each set is chosen by timing its operator's shortlist on this machine (DeviceTimer)."""
    from roller.compiler.kernel_set import DeviceTimer, GenericKernel, built_kernels
    from roller.construction import prepared

    t = time.perf_counter()
    hw, backend = target.hw, target.backend
    if not backend.sub_grid:
        return f"the {backend.name} backend launches every kernel on the grid it was built for"
    g = family.top
    # A copy's rectangles are planned at the capacity, which lays out only a value the size leads as it lies
    # at a smaller size (a prefix of rows).
    for node in g.nodes:
        if isinstance(node, CopyNode):
            for name in (*node.reads, node.output):
                grow = family.values.get(name, {})
                if grow and not _leads(g.values[name].shape, grow):
                    return f"copy {node.name} moves {name}, which the size does not lead"
    sets: dict[str, KernelSet] = {}
    by_key: dict[str, KernelSet | str] = {}
    exact: dict[str, tuple[ScaledOp, str]] = {}
    whole: dict[str, ScaledOp] = {}
    compiled: dict[tuple, tuple[Any, Any]] = {}  # DeviceTimer.key(program) -> (artifact, runner), from timing
    for node in g.op_nodes:
        key = kernel_key(node)
        op = family.ops[node.output]
        if op is None:
            return f"operator {node.name} does not depend on the size (a kernel built for one size serves)"
        if key not in by_key:
            timer = DeviceTimer(op, target, progress=False) if evaluate else None
            found = construct_generic(op, hw, matrix=target.matrix_support, timer=timer)
            if timer is not None:
                compiled.update(timer.compiled)
            if isinstance(found, str):
                top = prepared(op.instantiate({family.symbol: family.greatest}), hw)
                if top.preparation is not None and top.preparation.pads:
                    # Padded inputs are planned at the capacity: a kernel built for one size reads them there.
                    return f"operator {node.name}: {found}, and it reads padded inputs"
            by_key[key] = found
        found = by_key[key]
        if isinstance(found, str) and _whole(family, node, op):
            whole[node.output] = op
        elif isinstance(found, str):
            exact[node.output] = (op, f"operator {node.name}: {found}")
        else:
            sets[node.output] = found
    layout = _greatest_layout(family, sets, exact)
    if isinstance(layout, str):
        # The values it touches lie as at each size: built per size too.
        exact.update({out: (op, f"operator {out}: {layout}") for out, op in whole.items()})
        whole = {}
        grown = sorted(_not_led(family) & set(g.constants))
        if grown:
            # Its operators built per size would read it as it lies at that size, from a buffer planned at the
            # capacity (an input or a value is written so at each run; a constant is uploaded once).
            return f"{layout}; constant {grown[0]} grows with the size other than in its leading dimension"
        # Some operator on a value the symbol does not lead is built per size (with the value as it is at that
        # size): so is every other operator on such a value.
        inner = _not_led(family)
        for node in g.op_nodes:
            ks = sets.get(node.output)
            op = family.ops[node.output]
            if ks is not None and ks.scalar_args and op is not None and inner & {*node.inputs, node.output}:
                exact[node.output] = (op, f"operator {node.name}: {layout}")
                del sets[node.output]
        layout = frozenset()
    kept = {id(ks): ks for ks in sets.values()}
    built = {i: built_kernels(ks.programs, backend, hw, compiled) for i, ks in kept.items()}
    artifacts = {i: arts for i, (arts, _) in built.items()}
    model = GenericModel(family, target, sets, artifacts, backend.device(), exact=exact,
                         greatest_layout=layout)
    # Every kept kernel of every set compiled in one batch (the backend compiles many at once faster).
    todo = [(i, j) for i in kept for j in range(len(artifacts[i])) if j not in built[i][1]]
    for (i, j), runner in zip(todo, backend.compile_many([artifacts[i][j] for i, j in todo], hw)):
        built[i][1][j] = runner
    for i, ks in kept.items():
        warm = GenericKernel(ks.op, target, ks, artifacts=artifacts[i])
        warm._runners.update(built[i][1])
        warm.warm()
        for j, r in warm._runners.items():
            model._runners[(i, j)] = r
    if whole:
        from roller.compiler.kernel import build_kernel

        for out, op in whole.items():
            assert op.top is not None
            model.whole[out] = build_kernel(op.top, target).runner
    model.build_s = time.perf_counter() - t
    return model
