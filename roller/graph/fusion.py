"""Operator fusion on a model graph: elementwise chains inlined into their readers, and elementwise consumers of a
reduction (a convolution's bias, batch norm, activation, residual add) folded into its epilogue.

Both rewrites are substitutions on ``TensorExpr``s, so a fused operator is again one TensorExpr that every
backend lowers through the same plan, and that construction tiles as a whole (``TensorExpr.epilogue``):

* **inline**: an elementwise producer ``P`` read by ``C`` is replaced, inside ``C``'s body, by ``P``'s body at
  the read's index. Allowed where every element of ``P`` is still computed once (``C`` reads it injectively:
  a reduction over it, another elementwise op), or where ``P`` only moves data (a transpose), and where no read
  relies on padding (the pad value belongs to the read, not to what ``P`` computes). A cheap producer read by
  several such consumers is inlined into each of them (softmax's exp, read by the sum and the division).
* **epilogue**: an elementwise ``C`` whose only producer input is a reduction ``P`` read point for point (its
  axes a permutation of ``P``'s output axes) becomes ``P``'s epilogue; ``C``'s output, in ``C``'s order, is
  what the fused kernel stores.

Each candidate is offered to ``accept`` (the micro-performance model's prediction,
``roller.compiler.model.fuse_stage``) with the operators it replaces, and kept only where it is predicted no
slower: Apollo's feedback, splitting at the edge whose fusion the model rejects.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from roller.graph.ir import Graph, OpNode, ViewNode
from roller.graph.passes import remove_dead
from roller.ir.expr import (
    Affine,
    AxisValue,
    Expr,
    Read,
    axis_values,
    depth,
    flop_count,
    gathers,
    map_reads,
    reads,
    walk,
)
from roller.ir.parse import MAX_DEPTH
from roller.ir.tensor_expr import Stage, TensorDecl, TensorExpr
from roller.ir.types import BodyTypes, compute_dtype

#: a producer recomputed in each of several readers costs at most this many operations per element
MAX_DUPLICATED_FLOPS = 8

#: ``accept(fused, replaced)``: whether the fused operator is predicted no slower than those it replaces
Accept = Callable[[TensorExpr, list[TensorExpr]], bool]


@dataclass
class FusionReport:
    kernels_before: int
    kernels_after: int
    inlined: int = 0
    epilogues: int = 0
    stages: int = 0  # reductions made stages of row kernels
    rejected: int = 0  # candidates the model predicted slower
    seconds: float = 0.0  # the pass's own time, the model's predictions included
    method: str = "greedy"  # or "solver" (roller.graph.orchestrate)
    candidates: int = 0  # fused kernels the solver chose among
    merged: int = 0  # operators the solver's kernels absorbed
    predicted_s: float = 0.0  # the fused graph's kernels, predicted by the micro-performance model


def fuse(graph: Graph, accept: Accept | None = None, rows: bool = True) -> tuple[Graph, FusionReport]:
    """``graph`` with its elementwise operators fused (a new graph; constants are shared, not copied); with
    ``rows``, reductions read per row by an elementwise operator become its stages (row kernels)."""
    t0 = time.perf_counter()
    g = Graph(graph.name, list(graph.inputs), list(graph.outputs), dict(graph.values), dict(graph.constants),
              list(graph.nodes))
    report = FusionReport(len(g.op_nodes), 0)
    rejected: set[tuple[str, ...]] = set()
    changed = True
    while changed:
        changed = _merge_one(g, fold_step, "epilogues", accept, report, rejected) or \
            _inline_one(g, accept, report, rejected) or \
            (rows and _merge_one(g, stage_step, "stages", accept, report, rejected))
    g = remove_dead(g)
    g.check()
    report.kernels_after = len(g.op_nodes)
    report.seconds = time.perf_counter() - t0
    return g, report


# ---- the two rewrites on a graph --------------------------------------------------------------------------

def fold_step(g: Graph, p: OpNode, c: OpNode) -> OpNode | None:
    """The operator that computes ``c`` with ``c`` folded into the epilogue of its producer ``p``, or None where
    that is not a fold (``p`` not a reduction, its output read elsewhere, ``c`` not point for point)."""
    if c.expr.reduce_axes or axis_values(c.expr.body) or not p.expr.is_reduction or p.output not in c.inputs \
            or not _private(g, p.output, c):
        return None
    names = {t.name for t, val in zip(c.expr.inputs, c.inputs) if val == p.output}
    fused = fold_epilogue(p.expr, c.expr, names)
    if fused is None or not _renderable(fused):
        return None
    others = tuple(val for val in c.inputs if val != p.output)
    return one_read_per_value(OpNode(p.name, fused, p.inputs + others, c.output,
                                     f"{p.origin} + {c.origin}".strip(" +")))


def inline_step(g: Graph, p: OpNode) -> list[tuple[OpNode, OpNode]] | None:
    """(reader, the reader with ``p`` inlined) for every reader of the elementwise ``p``, or None where ``p``
    cannot be inlined into all of them."""
    if p.expr.reduce_axes or p.output in g.outputs or axis_values(p.expr.body) or _narrowing(p.expr):
        return None
    readers: list[OpNode] = []
    for n in _readers(g, p.output, g.consumers()):
        if not isinstance(n, OpNode):
            return None
        if not any(n is r for r in readers):
            readers.append(n)
    moves = isinstance(p.expr.body, Read)   # a transpose or copy: inlined, it only changes an index
    if not readers or (len(readers) > 1 and (moves or flop_count(p.expr.body) > MAX_DUPLICATED_FLOPS)):
        return None
    out = []
    inlined = depth(p.expr.body)
    for c in readers:
        names = {t.name for t, v in zip(c.expr.inputs, c.inputs) if _view_source(g, v)[0] == p.output}
        if any(depth(b, names, inlined) > MAX_DEPTH for b in _bodies(c.expr)):
            return None   # the fused body would nest too deep (_renderable): found without building it
        fused = _inline_into(g, p, c) if moves or _injective(g, p, c) else None
        if fused is None or not _renderable(fused.expr):
            return None
        out.append((c, fused))
    return out


def stage_step(g: Graph, r: OpNode, e: OpNode) -> OpNode | None:
    """The row kernel computing ``e`` with the reduction ``r`` as one more of its stages (softmax's maximum and
    sum, layer norm's mean and variance), or None where ``r``'s output is read elsewhere, ``e`` does not read it
    per row (its axes a subset of ``e``'s, the reduced ones matching ``e``'s others in extent and order), or
    either reads outside a tensor."""
    if e.expr.reduce_axes or e.expr.epilogue is not None or not r.expr.is_reduction or r.expr.epilogue is not None \
            or r.expr.stages or r.output not in e.inputs or not _private(g, r.output, e) or \
            axis_values(r.expr.body) or axis_values(e.expr.body) or not _inside(r.expr) or not _inside(e.expr):
        return None
    expr = e.expr
    names = {t.name for t, v in zip(expr.inputs, e.inputs) if v == r.output}
    accs = list(dict.fromkeys(i for t in sorted(names) for i in expr.accesses(t)))
    if len(accs) != 1 or any(i.plain_axis() is None for i in accs[0]):
        return None
    rows = [str(i.plain_axis()) for i in accs[0]]
    if expr.stages and set(rows) != set(expr.row_axes) or len(set(rows)) != len(rows):
        return None
    cols = [a for a in expr.axes if a.name not in rows]
    red = list(r.expr.reduce_axes)
    if [a.extent for a in red] != [a.extent for a in cols] or not cols:
        return None
    rename = {str(i.plain_axis()): a for i, a in zip(r.expr.out_index, rows)}
    rename.update({a.name: c.name for a, c in zip(red, cols)})
    order = [a.name for a in expr.axes if a.name in rows]
    index = tuple(Affine.axis(a) for a in order)
    taken = {t.name for t in expr.tensors} | {st.name for st in expr.stages}
    fresh = _fresh_names([t.name for t in r.expr.inputs], taken)
    stage_name = _fresh_names(["stage"], taken | set(fresh.values()))["stage"]
    body = map_reads(r.expr.body, lambda q: Read(fresh[q.tensor], tuple(i.rename(rename) for i in q.index), q.pos))
    stage = Stage(stage_name, str(r.expr.reduce_op), index, body)

    def reader(q: Read) -> Expr:
        return Read(stage_name, index, q.pos) if q.tensor in names else q

    staged = expr.remap_reads(reader)
    staged = replace(staged, body=map_reads(staged.body, reader),
                     stages=(stage,) + tuple(replace(st, body=map_reads(st.body, reader)) for st in staged.stages))
    inputs = [(t, v) for t, v in zip(expr.inputs, e.inputs) if t.name not in names]
    inputs += [(TensorDecl(fresh[t.name], t.shape, t.dtype), v) for t, v in zip(r.expr.inputs, r.inputs)]
    axes = tuple(a for a in expr.axes if a.name in rows) + tuple(cols)
    fused = replace(staged, inputs=tuple(t for t, _ in inputs), axes=axes, source=None, preparation=None)
    if not _renderable(fused):
        return None
    return one_read_per_value(OpNode(e.name, fused, tuple(v for _, v in inputs), e.output,
                                     f"{r.origin} + {e.origin}".strip(" +")))


def _merge_one(g: Graph, step: Callable[[Graph, OpNode, OpNode], OpNode | None], kind: str,
               accept: Accept | None, report: FusionReport, rejected: set[tuple[str, ...]]) -> bool:
    """Apply ``step`` (``fold_step``: a consumer into its producer's epilogue; ``stage_step``: a reduction into
    the row kernel reading it) to one producer-consumer pair; False when it applies to none."""
    found = None
    with g.unchanged():
        producer = g.producer()
        for c in g.op_nodes:
            for v in dict.fromkeys(c.inputs):
                p = producer.get(v)
                key = (kind, v, c.output)
                if not isinstance(p, OpNode) or key in rejected:
                    continue
                node = step(g, p, c)
                if node is None:
                    continue
                if accept is not None and not accept(node.expr, [p.expr, c.expr]):
                    rejected.add(key)
                    report.rejected += 1
                    continue
                found = (p, c, node)
                break
            if found is not None:
                break
    if found is None:
        return False
    p, c, node = found
    _replace(g, [p, c], node)
    setattr(report, kind, getattr(report, kind) + 1)
    return True


def _inline_one(g: Graph, accept: Accept | None, report: FusionReport, rejected: set[tuple[str, ...]],
                only_shared: bool = False, keep: Callable[[Graph, OpNode], bool] | None = None) -> bool:
    """Inline one elementwise producer into all of its readers (``only_shared``: one with several readers; not
    one ``keep`` keeps); False when none can be."""
    found = None
    with g.unchanged():
        for p in g.op_nodes:
            if ("inline", p.output) in rejected or (only_shared and _distinct_readers(g, p.output) < 2) or \
                    (keep is not None and keep(g, p)):
                continue
            pairs = inline_step(g, p)
            if pairs is None or (only_shared and len(pairs) < 2):
                continue
            if accept is not None and not all(accept(f.expr, [p.expr, c.expr]) for c, f in pairs):
                rejected.add(("inline", p.output))
                report.rejected += 1
                continue
            found = (p, pairs)
            break
    if found is None:
        return False
    p, pairs = found
    for c, f in pairs:
        _replace(g, [c], f)
    g.nodes[:] = [n for n in g.nodes if n is not p]
    report.inlined += 1
    return True


def _distinct_readers(g: Graph, value: str) -> int:
    """How many steps read ``value``, directly or through views (counted before building any rewrite)."""
    return len({id(n) for n in _readers(g, value, g.consumers())})


def foldable(g: Graph, p: OpNode) -> bool:
    """Whether the elementwise ``p`` can join a reduction's epilogue: it folds into its producer, or into an
    elementwise producer (read by ``p`` alone) that can."""
    producer = g.producer()
    for v in dict.fromkeys(p.inputs):
        q = producer.get(v)
        if not isinstance(q, OpNode):
            continue
        if q.expr.is_reduction and fold_step(g, q, p) is not None:
            return True
        if not q.expr.reduce_axes and _private(g, v, p) and foldable(g, q):
            return True
    return False


def _renderable(expr: TensorExpr) -> bool:
    """Whether a fused operator is one the backends build: epilogues and row kernels compute in float, so no
    integer or bool value may take part in them (``roller.ir.build``); a read through a run-time index belongs
    to an elementwise operator (a reduction stages its tiles, and a gathered row is no tile); no expression
    nests deeper than an op file's may (``MAX_DEPTH``: a chain of a thousand activations is several kernels,
    not one whose body no compiler, and no recursive walk, gets through)."""
    if any(depth(b) > MAX_DEPTH for b in _bodies(expr)):
        return False
    if expr.reduce_axes and gathers(expr.body):
        return False
    return not expr.typed or (expr.epilogue is None and not expr.stages)


def _bodies(expr: TensorExpr) -> list[Expr]:
    return [expr.body, *([expr.epilogue] if expr.epilogue is not None else []), *(s.body for s in expr.stages)]


def _narrowing(expr: TensorExpr) -> bool:
    """Whether an elementwise op's store changes its values: a typed body computed in a type other than the one
    its output holds (an int64 sum stored as int32 wraps there), so that inlining it would skip the conversion.
    (Float bodies computing in float32 for a float16 output are inlined, as they always were.)"""
    if not expr.typed:
        return False
    tensors = {t.name: t.dtype for t in expr.tensors}
    return BodyTypes(tensors).body(expr.body, expr.output.dtype) != compute_dtype(expr.output.dtype)


def _readers(g: Graph, value: str, consumers: dict[str, list]) -> list:
    """The steps that read ``value``, directly or through views of it."""
    out = []
    for n in consumers.get(value, []):
        if isinstance(n, ViewNode):
            if n.output in g.outputs:
                return [n]   # a view that is an output keeps the value alive: not ours to remove
            out.extend(_readers(g, n.output, consumers))
        else:
            out.append(n)
    return out


def _private(g: Graph, value: str, reader: OpNode) -> bool:
    """Whether ``reader`` is the only step that reads ``value`` and ``value`` is not a model output."""
    if value in g.outputs:
        return False
    return all(n is reader for n in g.consumers().get(value, []))


def _replace(g: Graph, old: list[OpNode], new: OpNode) -> None:
    """Put ``new`` where the last of ``old`` was (everything it reads is made before that) and drop ``old``."""
    gone = {id(o) for o in old}
    at = max(i for i, n in enumerate(g.nodes) if id(n) in gone)
    g.nodes[at] = new
    g.nodes[:] = [n for n in g.nodes if id(n) not in gone]


def _inline_into(g: Graph, p: OpNode, c: OpNode) -> OpNode | None:
    """``c`` with every read of ``p``'s output (directly or through views) replaced by ``p``'s body."""
    expr = c.expr
    inputs = list(c.inputs)
    decls = list(expr.inputs)
    taken = {t.name for t in expr.tensors}
    for pos, v in list(enumerate(c.inputs)):
        if _view_source(g, v)[0] != p.output:
            continue
        tname = c.expr.inputs[pos].name
        new = inline_read(p.expr, expr, tname, g.values[v].shape, taken)
        if new is None:
            return None
        expr, renamed = new
        # The producer's inputs become the reader's, under the fresh names ``inline_read`` gave them.
        for t in p.expr.inputs:
            decls.append(TensorDecl(renamed[t.name], t.shape, t.dtype))
        inputs.extend(p.inputs)
        at = [d.name for d in decls].index(tname)
        del decls[at], inputs[at]
        taken |= set(renamed.values())
        expr = replace(expr, inputs=tuple(decls))
    return one_read_per_value(replace(c, expr=expr, inputs=tuple(inputs),
                                      origin=f"{p.origin} + {c.origin}".strip(" +")))


def one_read_per_value(node: OpNode) -> OpNode:
    """``node`` with each value its epilogue reads bound to one tensor: a rewrite appends the producer's inputs
    to the reader's, so a value read twice (a bias added before SiLU's x * sigmoid(x), inlined into both)
    arrived as two tensors, two kernel arguments whose loads no compiler merges (EfficientNet-B0's
    solver-fused convolutions)."""
    first: dict[tuple[object, ...], str] = {}
    rename: dict[str, str] = {}
    decls, values = [], []
    # Only the epilogue's tensors: a value the body reads (staged, or through its padding) and the epilogue
    # reads too stays two tensors, since the backends read an epilogue's tensors apart from the body's
    # (TensorExpr.epilogue_inputs), and a body's tensors are staged, padded and packed one by one.
    body = {t.name for t in node.expr.body_inputs}
    for t, v in zip(node.expr.inputs, node.inputs):
        key = (v, t.shape, t.dtype, t.view, t.orig_shape)
        if t.name not in body and key in first:
            rename[t.name] = first[key]
            continue
        if t.name not in body:
            first.setdefault(key, t.name)
        decls.append(t)
        values.append(v)
    if not rename:
        return node
    expr = node.expr.remap_reads(lambda r: replace(r, tensor=rename[r.tensor]) if r.tensor in rename else r)
    return replace(node, expr=replace(expr, inputs=tuple(decls)), inputs=tuple(values))


def _view_source(g: Graph, value: str) -> tuple[str, tuple[int, ...]]:
    """(the value a chain of views starts from, the shape it is read in) or (value, its shape)."""
    producer = g.producer()
    v = value
    while isinstance(producer.get(v), ViewNode):
        v = producer[v].input   # type: ignore[union-attr]
    return v, g.values[value].shape


def _injective(g: Graph, p: OpNode, c: OpNode) -> bool:
    """Whether ``c`` reads each element of ``p``'s output at most once over its iteration space (so that
    recomputing ``p`` inside ``c`` adds no work): every read of it indexes with every axis of ``c``, each a
    plain index of its own (a matmul reading ``A[m,k]`` reads each element once per ``n``: not injective)."""
    names = {t.name for t, v in zip(c.expr.inputs, c.inputs) if _view_source(g, v)[0] == p.output}
    for r in reads(c.expr.body) + (reads(c.expr.epilogue) if c.expr.epilogue is not None else []):
        if r.tensor in names:
            plain = [i.plain_axis() for i in r.index if i.terms]
            if None in plain or sorted(map(str, plain)) != sorted(a.name for a in c.expr.axes):
                return False
    return True


# ---- the rewrites on expressions --------------------------------------------------------------------------

def fold_epilogue(p: TensorExpr, c: TensorExpr, tnames: set[str]) -> TensorExpr | None:
    """``p`` with ``c`` (elementwise, reading ``p``'s output as the tensors ``tnames``) as its epilogue, or None
    where ``c`` does not read it point for point or reads anything outside a tensor (padding)."""
    accs = list(dict.fromkeys(i for t in sorted(tnames) for i in c.accesses(t)))
    tname = min(tnames)
    if len(accs) != 1 or c.reduce_axes or c.stages or p.stages or not _inside(c):
        return None
    plain = [i.plain_axis() for i in accs[0]]
    c_axes = [a.name for a in c.axes]
    p_out = [i.plain_axis() for i in p.out_index]
    if None in plain or sorted(map(str, plain)) != sorted(c_axes) or len(plain) != len(p_out) or None in p_out:
        return None
    if tuple(p.output.storage_shape) != tuple(c.tensor(tname).storage_shape) or p.output.view is not None:
        return None
    rename = {str(a): str(b) for a, b in zip(plain, p_out)}
    taken = {t.name for t in p.tensors}
    fresh = _fresh_names([t.name for t in c.inputs if t.name not in tnames], taken)
    acc = p.epilogue if p.epilogue is not None else Read(p.output.name, p.out_index)

    def sub(r: Read) -> Expr:
        if r.tensor in tnames:
            return acc
        return Read(fresh[r.tensor], tuple(i.rename(rename) for i in r.index), r.pos)

    epilogue = map_reads(c.body, sub)
    out_index = tuple(i.rename(rename) for i in c.out_index)
    out = TensorDecl(p.output.name, c.output.shape, c.output.dtype)
    order = [str(i.plain_axis()) for i in out_index]
    axes = tuple(p.axis(a) for a in order) + p.reduce_axes
    extra = tuple(TensorDecl(fresh[t.name], t.shape, t.dtype) for t in c.inputs if t.name not in tnames)
    return replace(p, output=out, out_index=out_index, axes=axes, inputs=p.inputs + extra, epilogue=epilogue,
                   source=None, preparation=None)


def inline_read(p: TensorExpr, c: TensorExpr, tname: str, read_shape: tuple[int, ...],
                taken: set[str]) -> tuple[TensorExpr, dict[str, str]] | None:
    """``c`` with its reads of ``tname`` (``p``'s output seen in ``read_shape``, a split of its dimensions)
    replaced by ``p``'s body, and ``p``'s tensor names -> the fresh names they have in ``c``; None where a read
    could leave ``tname`` (the pad value would then apply to ``p``'s result, not its inputs), ``p`` reads
    outside its inputs, or the shapes are not a split of ``p``'s output."""
    if p.reduce_axes or p.epilogue is not None or p.stages or c.stages or not _inside(p) or \
            any(isinstance(n, AxisValue) for n in walk(p.body)) or \
            any(g.source.tensor == tname for g in gathers(c.body)):   # a gathered row is read, not recomputed
        return None
    groups = _split(tuple(p.output.storage_shape), read_shape)
    p_out = [i.plain_axis() for i in p.out_index]
    if groups is None or None in p_out:
        return None
    ext = c.extents
    fresh = _fresh_names([t.name for t in p.inputs], taken | {t.name for t in c.tensors})
    for r in c.input_reads():
        if r.tensor == tname:
            for d, i in enumerate(r.index):
                lo, hi = i.span(ext)
                if lo < 0 or hi >= read_shape[d]:
                    return None

    def sub(r: Read) -> Expr:
        if r.tensor != tname:
            return r
        # the index into p's output: each of its dimensions is a group of the read's dimensions, row-major
        values: dict[str, Affine] = {}
        for dim, group in enumerate(groups):
            idx = Affine()
            for d in group:
                idx = idx.scale(read_shape[d]) + r.index[d]
            values[str(p_out[dim])] = idx
        return map_reads(p.body, lambda q: Read(fresh[q.tensor], tuple(_substitute(i, values) for i in q.index)))

    return c.remap_reads(sub), fresh


def _inside(e: TensorExpr) -> bool:
    """Whether every read of ``e`` stays inside its tensor over the iteration space (no padding is read)."""
    ext = e.extents
    for r in e.input_reads():
        shape = e.tensor(r.tensor).storage_shape if e.tensor(r.tensor).view is None else None
        if shape is None or len(shape) != len(r.index):
            return False
        for d, i in enumerate(r.index):
            lo, hi = i.span(ext)
            if lo < 0 or hi >= shape[d]:
                return False
    return True


def _substitute(i: Affine, values: dict[str, Affine]) -> Affine:
    out = Affine((), i.const)
    for a, coef in i.terms:
        out = out + values[a].scale(coef)
    return out


def _split(source: tuple[int, ...], read: tuple[int, ...]) -> list[list[int]] | None:
    """Per dimension of ``source``, the dimensions of ``read`` (the same elements, row-major) it is split into;
    None where a dimension of ``read`` spans several of ``source`` (a merge: not affine). Unit dimensions index
    nothing: a unit dimension of ``source`` gets no group, and a unit dimension of ``read`` joins any."""
    if math.prod(source) != math.prod(read):
        return None
    groups: list[list[int]] = [[] for _ in source]
    d = 0
    for j, size in enumerate(source):
        if size == 1:
            if d < len(read) and read[d] == 1:
                groups[j].append(d)
                d += 1
            continue
        while d < len(read) and read[d] == 1:
            d += 1
        prod = 1
        while prod < size:
            if d >= len(read):
                return None
            groups[j].append(d)
            prod *= read[d]
            d += 1
        if prod != size:
            return None
    return groups if all(n == 1 for n in read[d:]) else None


def _fresh_names(names: list[str], taken: set[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    used = set(taken)
    for n in names:
        k = 0
        while f"E{k}" in used:
            k += 1
        out[n] = f"E{k}"
        used.add(f"E{k}")
    return out


