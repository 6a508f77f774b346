"""Construction: from an operator and a hardware description to the top-K rPrograms, best predicted first.

Reads only the IR and the hardware description; imports no backend.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from roller.construction.align import EPSILONS
from roller.construction.enlarge import Candidate, Search, thread_start_sizes
from roller.construction.exchange import exchange_fed
from roller.construction.matrix import MatrixSupport, matrix_programs
from roller.construction.pipeline import exposed_latency_s, with_stages
from roller.construction.scaleout import shrink_for_parallelism
from roller.construction.shared_vector import with_shared_vectors
from roller.construction.splitk import split_program, split_programs
from roller.construction.stream import stream_programs
from roller.errors import InputError
from roller.hw import HardwareDesc, MemoryLayer, load
from roller.ir.expr import Affine, Const, gathers, map_reads, reads
from roller.ir.fuse import prepare
from roller.ir.opfile import OpLike, load_op
from roller.ir.tensor_expr import TensorDecl, TensorExpr
from roller.perf.micro import predict, resources
from roller.perf.traffic import TileGeometry
from roller.program import Prediction, RProgram, RTile, launch_counts

__all__ = ["MatrixSupport", "Prediction", "RProgram", "RTile", "channel_lanes", "construct", "levels",
           "matrix_candidates", "predict_program", "prepared", "repredict", "row_proxy"]

# Construction explores this many candidates per requested program before the model ranks them: the DFS
# order follows reuse, the model's order follows predicted time.
POOL_FACTOR = 3
# ...and, where kernels read global memory through a cache (a CPU), as many as for this many programs at least,
# so that the model's first choice does not depend on how many programs were asked for: with a pool of 9 for
# top-1, the search stopped at the exact-fit tiles of its first epsilon (2x2 register tiles over a 14x14
# depthwise convolution, predicted 0.54 ms) and never reached the overhanging 8x8 ones a pool of 30 finds
# (predicted 0.12 ms, measured 2-3x faster). Not yet on GPUs: there the larger pool brought in a top-1 at the
# register cap (C24 on mi100: 64 registers predicted, 65 VGPRs from hipcc at 896 threads).
POOL_MIN_PROGRAMS = 10


def levels(hw: HardwareDesc) -> tuple[int, int]:
    """(block level, thread level): the tile levels staged into the block's layer and into the thread-scope
    (register) layer. The block's layer is the first 'block'-scope layer (shared memory, LDS, tile SRAM), or,
    without one, the innermost 'cache' layer above the registers (a CPU's cache holding the block's tile)."""
    scopes = [m.scope for m in hw.memory]
    if scopes[-1] != "thread":
        raise InputError(f"{hw.name}: the innermost memory layer must have scope 'thread' (registers)",
                         source=hw.source or None, field=f"memory[{len(scopes) - 1}].scope")
    if "block" in scopes:
        return scopes.index("block") - 1, len(scopes) - 2
    if len(scopes) >= 3 and scopes[-2] == "cache":
        return len(scopes) - 3, len(scopes) - 2
    raise InputError(f"{hw.name}: construction needs a memory layer with scope 'block' (shared memory, LDS, "
                     "local memory or tile SRAM) or a 'cache' layer just above the registers",
                     source=hw.source or None, field="memory")


def construct(op: OpLike | TensorExpr, hw: str | HardwareDesc, top_k: int = 10,
              gemm_conv: bool = True, shrink: bool = True,
              matrix: Iterable[MatrixSupport] = (), split_k: bool = False,
              vectors: bool = False) -> list[RProgram]:
    """The ``top_k`` rPrograms for ``op`` on ``hw``, best predicted first (deterministic). ``matrix``: the
    matrix instructions the backend that will render the programs can emit (its capabilities); programs for
    the description's instructions among them compete with the scalar ones. Without it, none are built.
    ``split_k``: the caller renders and launches split-K programs (``Backend.split_k``: a second kernel and a
    workspace, construction/splitk.py); they then compete where the output tiles do not fill the device.
    ``vectors``: the caller renders vector grid-stride programs (``Backend.vector_programs``,
    construction/stream.py); they then compete for ops with no reuse where the description gives a wide access."""
    if top_k < 1:
        raise InputError(f"top_k must be at least 1, got {top_k}")
    hwd = load(hw) if isinstance(hw, str) else hw
    expr = op if isinstance(op, TensorExpr) else load_op(op)
    if expr.stages:
        return _row_programs(expr, hwd, top_k)
    block_level, thread_level = levels(hwd)
    form = prepared(expr, hwd, gemm_conv)
    variants = [form]
    if expr.preparation is None and form.preparation is not None and form.preparation.pads \
            and not _shares_reads(expr):
        # A padded copy costs a read and a write of the input before the kernel: for a window that shares no
        # read between outputs (a pooling window) that doubles a memory-bound op's traffic, while its bounds
        # tests cost little (a 3x3 average pool's kernel ran as fast either way). Such ops are built both
        # ways, and the model, which charges the copies (padding_time), ranks them.
        variants.append(prepare(expr, gemm_conv=False, pad=False))
    unique: dict[tuple, RProgram] = {}
    forms = []
    for i, form in enumerate(variants):
        built, search, geo = _programs_of(form, hwd, block_level, thread_level, top_k, shrink, matrix, split_k,
                                          vectors)
        forms.append((form, geo))
        for p in (with_stages(with_shared_vectors(b, hwd, predict_program), hwd) for b in built):
            unique.setdefault((i, p.key()), p)
    # Programs the model predicts alike (a transpose's blocks of one size, whatever their shape) are ordered by
    # how many contiguous runs they move: the model's traffic is the same, the memory system's work is not.
    # An output stored past the caches moves no runs through them: its inputs' runs alone order those.
    # Before the runs: the latency a program's ring of staged steps leaves exposed (construction/pipeline.py).
    geos = {id(form): geo for form, geo in forms}
    least = hwd.streamed_from()

    def rank(p: RProgram) -> tuple:
        geo = geos.get(id(p.expr)) or TileGeometry(p.expr)
        out = p.expr.output
        streamed = least is not None and out.size * out.itemsize >= least
        return (p.prediction.time_s, exposed_latency_s(p, hwd),  # type: ignore[union-attr]
                geo.row_runs(p.block_tile.shape, output=not streamed), p.key())

    ranked = sorted(unique.values(), key=rank)
    if not ranked:
        raise InputError(_nothing_fits(form, geo, hwd, block_level, search))
    return ranked[:top_k]


def channel_lanes(hw: HardwareDesc) -> int:
    """Channels per block of a blocked activation layout (``roller.graph.blocking``) on ``hw``: the float32
    points of one line of the cache its kernels read through (16 on a 64-byte line), where the block's layer
    is a cache (a CPU, whose kernels compute vectors along their last axis); 0 elsewhere: a GPU's threads
    read along the image's rows, and blocked channels would only scatter them."""
    block_level, _ = levels(hw)
    layer = hw.memory[block_level + 1]
    return layer.line_bytes // 4 if layer.scope == "cache" else 0


def read_pads(expr: TensorExpr, hw: HardwareDesc) -> dict[str, tuple[tuple[int, int], ...]]:
    """Per input, the padding (before, after per dimension) with which every program ``construct`` builds for
    ``expr`` reads it: a CPU's windows over an input that outputs share (convolutions); {} where some program
    reads its inputs as they are (pooling is built both ways) or the description pads nothing."""
    if expr.stages or expr.source is not None:
        return {}
    form = prepared(expr, hw)
    if form.preparation is None or not form.preparation.pads or not _shares_reads(expr):
        return {}
    return dict(form.preparation.pads)


def _shares_reads(expr: TensorExpr) -> bool:
    """Whether some input of the body is read by several output points through the same element across a
    spatial axis (a convolution's weights, a matmul's operands): where register tiles and staging pay."""
    spatial = [a.name for a in expr.spatial_axes]
    for t in expr.body_inputs:
        for idx in expr.accesses(t.name):
            used = {a for i in idx for a, _ in i.terms}
            if any(a not in used for a in spatial):
                return True
    return False


def _programs_of(expr: TensorExpr, hwd: HardwareDesc, block_level: int, thread_level: int, top_k: int,
                 shrink: bool, matrix: Iterable[MatrixSupport],
                 split_k: bool = False, vectors: bool = False) -> tuple[list[RProgram], Search, TileGeometry]:
    """The candidate programs of a prepared ``expr`` (scalar and matrix), with the search and geometry that
    built them (for the message when none fits)."""
    geo = TileGeometry(expr)
    itemsize = expr.output.itemsize
    unstaged = hwd.memory[block_level + 1].scope == "cache"
    pool = max(top_k, POOL_MIN_PROGRAMS) * POOL_FACTOR if unstaged else max(top_k * POOL_FACTOR, top_k + 8)
    search = Search(geo, hwd, block_level, thread_level, itemsize, want=pool)
    for eps in EPSILONS:
        search.steps = 0
        search.visited.clear()
        sizes = thread_start_sizes(geo, eps, search.thread_align)
        start = tuple(s[0] for s in sizes)
        search.enlarge_thread(start, eps, sizes)
        if len(search.found) >= pool:
            break
    if not search.found:
        # Nothing fits the description's limits with aligned tiles: fall back to one thread per output
        # element so that every op still compiles (the model will say how slow it is).
        unit = tuple(1 for _ in geo.extents)
        search.record(unit, geo.full_reduce(unit) if search.exchange_fed else unit, EPSILONS[-1], True)
    cands = list(search.found)
    if shrink:
        cands += shrink_for_parallelism(geo, hwd, cands, search)
    built = [_program(expr, geo, hwd, c, block_level, thread_level) for c in cands]
    progs = [p for p in built if p is not None]
    pad_s = padding_time(expr, hwd)
    if pad_s:
        # The padded copies are part of the op's time (a device copy each, before the kernel).
        progs = [dataclasses.replace(p, prediction=dataclasses.replace(
            p.prediction, time_s=p.prediction.time_s + pad_s)) if p.prediction else p for p in progs]
    # float16 GEMM-shaped ops on a description with matrix instructions the backend renders: tensor-core
    # (or matrix-core) programs compete with the scalar ones in the same ranking.
    progs += matrix_programs(expr, geo, hwd, block_level, thread_level, want=pool, support=matrix)
    # ops with no reuse on a description with a wide access: vector, grid-stride programs compete as well
    if vectors:
        progs += stream_programs(expr, geo, hwd, block_level, thread_level)
    if split_k:
        progs += split_programs(progs, hwd)
    return progs, search, geo


def prepared(expr: TensorExpr, hw: HardwareDesc, gemm_conv: bool = True, align: bool = True) -> TensorExpr:
    """The form construction tiles ``expr`` in on ``hw`` (``expr`` itself when it is already prepared, and
    for a row kernel, whose rows and columns stay apart). ``align=False`` leaves out ``alias_pads`` (a kernel
    that serves many sizes: its padding would move with the size)."""
    if expr.stages:
        return expr
    block_level, _ = levels(hw)
    # An exchange copies boxes of a tensor into a unit; the im2col view of an implicit GEMM reads no box (its
    # bounding box in the source can be several times the region construction counts), so convolutions stay
    # direct on exchange-fed devices. Where the block's layer is a cache (a CPU), kernels read global memory
    # directly: a window reads a padded copy of its input (no bounds test inside the loops: a 3x3 convolution
    # ran 21 GFLOP/s guarded, 200 from a padded copy, on PoCL), and convolutions stay direct (the implicit GEMM's
    # gathered im2col lanes ran 10-22 GFLOP/s on the same layer).
    unstaged = hw.memory[block_level + 1].scope == "cache"
    return prepare(expr, gemm_conv=gemm_conv and not exchange_fed(hw, block_level) and not unstaged, pad=unstaged,
                   row_pads=alias_pads(expr, hw.memory[block_level + 1]) if unstaged and align else None)


def alias_pads(expr: TensorExpr, cache: MemoryLayer) -> dict[str, tuple[tuple[int, int], ...]]:
    """Per input whose rows a thread reads together while it walks a reduction along them (a matmul's A[m, k]:
    a register tile's rows, each line reused for a line's worth of k), and whose rows lie a multiple of the
    cache's ``alias_bytes`` apart: one line more at the end of each row, so that those rows fall in different
    sets of the L1 instead of all in one set's few ways. On PoCL (L1 32 KiB, 8 ways) a 197x768 matmul over
    K = 3072 (rows 12 KiB apart) ran 45 GFLOP/s with the model's program, against 90-100 at K = 3056 and 3088
    with the same program (bench/layers.py measures the padded one)."""
    if cache.alias_bytes is None or expr.stages:
        return {}
    reduce = {a.name for a in expr.reduce_axes}
    spatial = {a.name for a in expr.spatial_axes}
    gathered = {g.source.tensor for g in gathers(expr.body)}
    out: dict[str, tuple[tuple[int, int], ...]] = {}
    for t in expr.inputs:
        if len(t.shape) < 2 or t.view is not None or t.orig_shape is not None or t.name in gathered:
            continue
        if t.size == t.shape[-1]:   # one row (a classifier's A[1, k]) has nothing to alias with
            continue
        row_bytes = t.shape[-1] * t.itemsize
        if row_bytes % cache.alias_bytes or cache.line_bytes % t.itemsize:
            continue
        reads_of = expr.accesses(t.name)
        walks = bool(reads_of) and all(idx[-1].plain_axis() in reduce and
                                       any(a in spatial for i in idx[:-1] for a, _ in i.terms) for idx in reads_of)
        if walks:
            out[t.name] = ((0, 0),) * (len(t.shape) - 1) + ((0, cache.line_bytes // t.itemsize),)
    return out


def _row_programs(expr: TensorExpr, hw: HardwareDesc, top_k: int) -> list[RProgram]:
    """A row kernel's programs: the tiles of its first stage as a reduction (rows spatial, the columns reduced,
    each thread walking its rows' columns), which is the pass that reads the inputs from memory; the model's
    time adds the last pass, which writes the output (the stages between re-read a row the first pass brought
    into the thread's cache or registers)."""
    proxy = row_proxy(expr)
    names = {st.name for st in expr.stages}
    last = dataclasses.replace(expr, stages=(), body=map_reads(expr.body, lambda r: Const(1.0) if r.tensor in names
                                                               else r))
    last = dataclasses.replace(last, inputs=tuple(t for t in last.inputs if t.name in {r.tensor for r in
                                                                                       last.input_reads()}))
    last_s = 0.0
    if last.inputs:
        pred = construct(last, hw, top_k=1)[0].prediction
        last_s = pred.time_s if pred is not None else 0.0
    out = []
    for p in construct(proxy, hw, top_k=max(top_k, 4), gemm_conv=False):
        if p.reduce_threads != 1 or p.prediction is None:
            continue
        out.append(dataclasses.replace(p, expr=expr, prediction=dataclasses.replace(
            p.prediction, time_s=p.prediction.time_s + last_s)))
    if not out:
        raise InputError(f"{expr.name}: no program walks whole rows on {hw.name}")
    return out[:top_k]


def row_proxy(expr: TensorExpr) -> TensorExpr:
    """A row kernel's first stage as a reduction over its columns (rows spatial): what its programs tile and
    the model predicts (the stages after it re-read rows the first brought into the thread's cache)."""
    rows = expr.row_axes
    if tuple(a.name for a in expr.axes[:len(rows)]) != rows:
        raise ValueError(f"{expr.name}: a row kernel's row axes lead its axes")
    first = expr.stages[0]
    used = {r.tensor for r in reads(first.body)}
    axes = tuple(dataclasses.replace(a, reduce=a.name not in rows) for a in expr.axes)
    proxy = TensorExpr(expr.name, "row_reduce", TensorDecl("Y", tuple(expr.axis(a).extent for a in rows)),
                       tuple(Affine.axis(a) for a in rows), tuple(t for t in expr.inputs if t.name in used), axes,
                       first.reduce_op, first.body, expr.pad_value)
    # Already in the form the kernel walks: no axis fusion (rows and columns must stay apart).
    return dataclasses.replace(proxy, source=proxy)


def padding_time(expr: TensorExpr, hw: HardwareDesc) -> float:
    """Seconds the device copies into padded inputs take (``RProgram.pads``): each copy reads the tensor and
    writes it into the padded buffer's interior, at the outermost layer's effective bandwidth."""
    prep = expr.preparation
    if prep is None or not prep.pads:
        return 0.0
    src = expr.source or expr
    return sum(copy_seconds(src.tensor(name).size * src.tensor(name).itemsize, hw) for name, _ in prep.pads)


def copy_seconds(nbytes: int, hw: HardwareDesc) -> float:
    """Seconds a device copy of ``nbytes`` takes (read and written once at the outermost layer's bandwidth)."""
    return 2 * nbytes / (hw.memory[0].bandwidth_effective_gbps * 1e9)


def matrix_candidates(op: OpLike | TensorExpr, hw: str | HardwareDesc, matrix: Iterable[MatrixSupport],
                      want: int = 10, every_tiling: bool = False) -> list[RProgram]:
    """Only the matrix-instruction programs of ``op`` (the ``want`` best predicted), for checks of one
    family's kernels; empty where no instruction in ``matrix`` applies. ``every_tiling`` keeps every warp
    tiling of a block tile, not only the one construction would rank."""
    hwd = load(hw) if isinstance(hw, str) else hw
    expr = prepare(op if isinstance(op, TensorExpr) else load_op(op))
    block_level, thread_level = levels(hwd)
    return matrix_programs(expr, TileGeometry(expr), hwd, block_level, thread_level, want=want, support=matrix,
                           every_tiling=every_tiling)
def _nothing_fits(expr: TensorExpr, geo: TileGeometry, hw: HardwareDesc, block_level: int, search: Search) -> str:
    """Why not even the one-point tile became a program (an empty top-K would end as an IndexError later, or
    as an empty table)."""
    unit = tuple(1 for _ in geo.extents)
    block = geo.full_reduce(unit) if search.exchange_fed else unit
    layer = hw.memory[block_level + 1]
    need = geo.footprint(block, {}) if layer.scope == "block" else 0
    have = layer.capacity_per_unit_bytes or 0
    what = "one output point with its whole reduction, as an exchange-fed unit receives it" \
        if search.exchange_fed else "one output point"
    if need > have:
        return (f"{expr.name}: no program fits {hw.name}: its smallest tile ({what}) needs {need} bytes of "
                f"{layer.name}, which holds {have} per unit")
    return f"{expr.name}: no program fits {hw.name}: no tile, down to {what}, meets its limits"


def _program(expr: TensorExpr, geo: TileGeometry, hw: HardwareDesc, c: Candidate, block_level: int,
             thread_level: int) -> RProgram | None:
    n = len(hw.memory) - 1
    shapes: list[tuple[int, ...]] = []
    for i in range(n):
        if i < block_level:
            shapes.append(c.block)  # cache levels: one block's tile (the cache holds what the block reuses)
        elif i == block_level:
            shapes.append(c.block)
        else:
            shapes.append(c.thread)
    tiles = tuple(RTile(s, tuple(sorted(c.padding.items())) if i == block_level else ())
                  for i, s in enumerate(shapes))
    grid, block = launch_counts(expr, tiles[block_level], tiles[thread_level])
    pred = _predict(geo, hw, tuple(shapes), block_level, thread_level, grid, block, c.padding)
    if pred is None:
        return None
    return RProgram(expr=expr, hw_name=hw.name, hw_hash=hw.content_hash()[:16],
                    layers=tuple(m.name for m in hw.memory), scopes=tuple(m.scope for m in hw.memory),
                    tiles=tiles, grid=grid, block=block, block_level=block_level, thread_level=thread_level,
                    epsilon=c.epsilon, padding_waste=geo.padding_waste(c.block), prediction=pred)


def _predict(geo: TileGeometry, hw: HardwareDesc, shapes: tuple[tuple[int, ...], ...], block_level: int,
             thread_level: int, grid: int, block: int, padding: dict[str, int]) -> Prediction | None:
    res = resources(geo, hw, shapes, block_level, thread_level, block, padding)
    if res.blocks_per_unit < 1:
        return None
    return predict(geo, hw, shapes, block_level, thread_level, grid, block, res, dtype=geo.expr.output.dtype)


def predict_program(prog: RProgram, hw: HardwareDesc) -> Prediction | None:
    """The model's prediction for ``prog``'s tiles over ``prog.expr`` as it is now (None where they do not fit
    ``hw``), padded copies included: how a shape-generic kernel is ranked at each size. A row kernel is
    predicted by its first stage (``row_proxy``): the storing pass costs every program of it the same."""
    if prog.expr.stages:
        prog = dataclasses.replace(prog, expr=row_proxy(prog.expr))
    if prog.reduce_threads > 1:   # split-K: the unsplit tiles' resources, then the split's own prediction
        s = prog.reduce_threads
        base = dataclasses.replace(prog, reduce_threads=1, grid=prog.grid // s)
        base = dataclasses.replace(base, prediction=predict_program(base, hw))
        split = split_program(base, s, hw) if base.prediction is not None else None
        return split.prediction if split is not None else None
    shapes = tuple(t.shape for t in prog.tiles)
    padding = dict(prog.tiles[prog.block_level].storage_padding)
    # a grid-stride program's grid is what runs at once; the model counts its tiles
    grid = launch_counts(prog.expr, prog.block_tile, prog.thread_tile)[0] if prog.vector > 1 else prog.grid
    pred = _predict(TileGeometry(prog.expr), hw, shapes, prog.block_level, prog.thread_level, grid,
                    prog.block, padding)
    pad_s = padding_time(prog.expr, hw)
    if pred is not None and pad_s:
        pred = dataclasses.replace(pred, time_s=pred.time_s + pad_s)
    return pred


def repredict(prog: RProgram, hw: HardwareDesc) -> RProgram:
    """``prog`` with the current model's prediction for ``hw``: what a change of the model or of the description
    does to programs already measured (bench/fidelity.py --repredict). Matrix programs are not supported: their
    resources come from the instruction search in construction/matrix.py."""
    if prog.use_matrix:
        raise ValueError("re-predicting matrix-instruction programs is not supported")
    pred = predict_program(prog, hw)
    if pred is None:
        raise ValueError(f"{prog.line()} does not fit {hw.name}")
    return dataclasses.replace(prog, prediction=pred)
