"""Kernel orchestration by a solver (Korch, Apollo): which operators of a graph share a kernel, chosen as the
partition of its operators into fused kernels with the least total predicted time, by a binary linear program.

1. Candidates: from every operator, the fused operators that grow from it one neighbour at a time through the
   fusion pass's rewrites (``fusion.fold_step``, ``fusion.inline_step``: each is legal, and its intermediates
   are read only inside it), up to ``MAX_GROUP`` operators; each is one TensorExpr, costed by ``seconds``
   (construction's best program, as the micro-performance model predicts it).
2. ``scipy.optimize.milp`` picks candidates covering every operator exactly once at the least total predicted
   time. Since a candidate's intermediates are read only inside it, any such cover is a valid graph: a
   candidate's output operator depends on all of its members, so placing the fused operator where that one was
   keeps the order.
3. A cheap elementwise operator still read by several kernels is then inlined into each of them where the
   model predicts no slowdown (its copies belong to no single kernel, so it is no part of the partition).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from roller.graph.fusion import (
    FusionReport,
    _distinct_readers,
    _inline_one,
    _replace,
    _view_source,
    fold_step,
    foldable,
    inline_step,
    stage_step,
)
from roller.graph.ir import Graph, OpNode
from roller.graph.passes import remove_dead
from roller.ir.tensor_expr import TensorExpr

#: operators one candidate kernel may fuse
MAX_GROUP = 8
#: candidates enumerated per graph at most (the program stays small; every operator keeps its singleton)
MAX_CANDIDATES = 5000


@dataclass(frozen=True)
class Candidate:
    members: frozenset[int]   # positions, in ``graph.op_nodes``, of the operators it computes
    node: OpNode
    seconds: float


def orchestrate(graph: Graph, seconds: Callable[[TensorExpr], float], max_group: int = MAX_GROUP,
                rows: bool = True) -> tuple[Graph, FusionReport]:
    """``graph`` partitioned into the fused kernels of least total predicted ``seconds`` (row kernels among
    the candidates with ``rows``: the backend renders them).

    A cheap operator read by several others belongs to no single kernel: it is inlined into each of them
    either before the partition (which then sees softmax's exp inside both its sum and its division, free to
    become one row kernel) or after it (where a partition keeps it whole, e.g. folded into the matmul before
    it); both are solved and the one predicted faster is kept."""
    t0 = time.perf_counter()

    def no_slower(fused: TensorExpr, replaced: list[TensorExpr]) -> bool:
        return seconds(fused) <= sum(seconds(e) for e in replaced)

    best: tuple[Graph, FusionReport] | None = None
    for first in (False, True):
        g = Graph(graph.name, list(graph.inputs), list(graph.outputs), dict(graph.values), dict(graph.constants),
                  list(graph.nodes))
        report = FusionReport(len(g.op_nodes), 0, method="solver")
        if first:   # unconditionally (the whole partition's predicted time judges it, not one rewrite's), but
            # not what could be an epilogue (a residual add after a matmul, read by the layer norm after it)
            while _inline_one(g, None, report, set(), only_shared=True, keep=foldable):
                pass
        _partition(g, seconds, max_group, rows, report)
        while _inline_one(g, no_slower, report, set(), only_shared=True):
            pass
        g = remove_dead(g)
        g.check()
        report.kernels_after = len(g.op_nodes)
        report.predicted_s = sum(seconds(n.expr) for n in g.op_nodes)
        if best is None or report.predicted_s < best[1].predicted_s:
            best = (g, report)
    assert best is not None
    best[1].seconds = time.perf_counter() - t0
    return best


def _partition(g: Graph, seconds: Callable[[TensorExpr], float], max_group: int, rows: bool,
               report: FusionReport) -> None:
    """Replace ``g``'s operators, in place, by the cover of candidate kernels of least total predicted time."""
    ops = g.op_nodes
    if not ops:   # a graph of copies and views only
        return
    cands = candidates(g, seconds, max_group, rows)
    report.candidates += len(cands)
    for chosen in _cover(g.name, [c.members for c in cands], np.array([c.seconds for c in cands]), len(ops)):
        c = cands[int(chosen)]
        if len(c.members) > 1:
            _replace(g, [ops[i] for i in c.members], c.node)
            report.merged += len(c.members) - 1


def _cover(name: str, members: list[frozenset[int]], cost: np.ndarray, n_ops: int) -> list[int]:
    """The candidates (by index) of least total cost that together compute each of ``n_ops`` operators once:
    scipy's milp, the answer kept in Roller's cache under the problem itself (members and costs), so that a
    warm build neither solves it again nor imports scipy.optimize (0.35-0.43 s of a 2 s warm build)."""
    import hashlib

    from roller import cache

    layout = ";".join(",".join(map(str, sorted(m))) for m in members)
    key = cache.result_key("fusion-cover", str(n_ops), hashlib.sha256(layout.encode() + cost.tobytes()).hexdigest())
    found = cache.load_result("fusion-cover", key)
    if isinstance(found, list) and all(isinstance(j, int) and 0 <= j < len(members) for j in found):
        covered = sorted(i for j in found for i in members[j])
        if covered == list(range(n_ops)):
            return found
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    member = [i for m in members for i in m]
    cand = [j for j, m in enumerate(members) for _ in m]
    a = coo_matrix((np.ones(len(member)), (member, cand)), shape=(n_ops, len(members)))
    # milp needs finite costs: an operator the model cannot predict costs more than any it can
    cost = cost.copy()
    finite = cost[np.isfinite(cost)]
    cost[~np.isfinite(cost)] = 1.0 + 2 * (finite.sum() if finite.size else 1.0)
    res = milp(cost, constraints=LinearConstraint(a, 1, 1), integrality=np.ones(len(members)), bounds=Bounds(0, 1))
    if not res.success:   # the singletons always cover: only a solver failure lands here
        raise RuntimeError(f"fusion solver failed on {name}: {res.message}")
    chosen = [int(j) for j in np.flatnonzero(res.x > 0.5)]
    cache.store_result("fusion-cover", key, chosen)
    return chosen


def candidates(g: Graph, seconds: Callable[[TensorExpr], float], max_group: int = MAX_GROUP,
               rows: bool = True) -> list[Candidate]:
    """Every operator alone, and the fused operators grown from each, up to ``max_group`` operators (row
    kernels among them with ``rows``)."""
    ops = g.op_nodes
    pos = {id(n): i for i, n in enumerate(ops)}
    found: dict[frozenset[int], Candidate] = {}
    for i, n in enumerate(ops):
        found[frozenset([i])] = Candidate(frozenset([i]), n, seconds(n.expr))
    # The graphs here are only read once made: each keeps its maps, derived from the graph it grew from.
    base = Graph(g.name, g.inputs, g.outputs, g.values, g.constants, list(g.nodes)).fixed()
    stack = [(base, frozenset([i]), n) for i, n in enumerate(ops)]
    while stack and len(found) < MAX_CANDIDATES:
        h, members, cur = stack.pop()
        if len(members) >= max_group:
            continue
        for other, merged in _merges(h, cur, rows):
            grown = members | {pos[id(other)]}
            if grown in found:
                continue
            found[grown] = Candidate(grown, merged, seconds(merged.expr))
            after = Graph(g.name, g.inputs, g.outputs, g.values, g.constants, list(h.nodes))
            _replace(after, [cur, other], merged)
            stack.append((after.replaced_from(h, [cur, other], merged), grown, merged))
    return list(found.values())


def _merges(h: Graph, cur: OpNode, rows: bool) -> list[tuple[OpNode, OpNode]]:
    """(an operator of the graph as given, the operator that computes it fused with ``cur``) for each legal
    single rewrite between ``cur`` and a neighbour."""
    producer = h.producer()
    # fold: a consumer joins the producer's epilogue; stage: the producer becomes one of the consumer's stages
    steps = (fold_step, stage_step) if rows else (fold_step,)
    pairs_of = [(cur, n, n) for n in h.consumers().get(cur.output, []) if isinstance(n, OpNode)]
    pairs_of += [(p, cur, p) for p in (producer.get(v) for v in dict.fromkeys(cur.inputs)) if isinstance(p, OpNode)]
    out = [(other, node) for p, c, other in pairs_of for step in steps
           if (node := step(h, p, c)) is not None]
    # inlining builds the fused operator of every reader: asked only of an operator with one
    pairs = inline_step(h, cur) if _distinct_readers(h, cur.output) == 1 else None   # cur into its reader
    if pairs is not None and len(pairs) == 1:
        out.append(pairs[0])
    for v in dict.fromkeys(cur.inputs):
        src = producer.get(_view_source(h, v)[0])
        if isinstance(src, OpNode) and _distinct_readers(h, src.output) == 1:   # its producer into cur
            pairs = inline_step(h, src)
            if pairs is not None and len(pairs) == 1 and pairs[0][0] is cur:
                out.append((src, pairs[0][1]))
    return out
