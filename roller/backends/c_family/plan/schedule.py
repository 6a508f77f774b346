"""The scheduling decisions of a C-family kernel: what the lowering prints is chosen here.

Each function is a decision about a program and its tensor and axis plans, returning plain values (a bool,
a width, an axis, loop unroll counts, ranges): whether reduction steps are staged and how threads own their
points, the vector width of a staged tile's loads, the order threads follow, which loops unroll and how far,
whether and how a CPU kernel vectorises (which vector path, its width, its versions), whether its output
streams past the caches, and where a constant divisor is applied. ``lowering.py``, ``rows.py`` and
``vector.py`` ask for these and print the kernel they describe; nothing here writes C. Kept apart so that a
change to how a kernel is scheduled is a change to this module, and the measurements behind each choice stay
with it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from roller.backends.c_family.plan.access import axis_maxes, flat_coef, index_span, is_guarded
from roller.backends.c_family.plan.cexpr import row_major_strides
from roller.backends.c_family.plan.types import AxisPlan, Dialect, TensorPlan
from roller.ir.expr import Affine, BinOp, Const, Read, map_reads
from roller.ir.tensor_expr import Axis, TensorDecl, TensorExpr
from roller.ir.vector import VECTOR_WIDTHS, flat_step, reduction_vector, vector_width
from roller.program import RProgram

# -- staging and the threads' runs ---------------------------------------------------------------------------

def scratchpad(prog: RProgram) -> bool:
    """Whether the block's layer is a scratchpad (scope 'block': shared memory, LDS) rather than a cache (scope
    'cache': a CPU's L2 under PoCL)."""
    return prog.scopes[prog.block_level + 1] == "block"


def staged_steps(prog: RProgram) -> bool:
    """Whether each reduction step is staged into the block's layer: where it is a scratchpad. Where it is a
    cache, threads read through it directly."""
    return bool(prog.expr.reduce_axes) and scratchpad(prog)


def blocked_threads(prog: RProgram) -> bool:
    """Whether each thread owns a contiguous run of every axis (KernelPlan.blocked), which is what a CPU compiler
    turns into SIMD inside one work-item: where the block's layer is a cache. On GPUs (a scratchpad) threads
    own strided runs, which is what coalesces a warp."""
    return not scratchpad(prog)


def stage_width(tp: TensorPlan, accs: list, block: Mapping[str, int], low: int, itemsize: int,
                pad_value: float, d: Dialect) -> int:
    """Elements per 16-byte load with which ``tp``'s tile can be staged, or 0. Each vector must be whole inside or
    whole outside the tensor and aligned in global and shared memory: a plain row-major tensor read through one
    access whose last index moves by whole vectors from tile to tile (every term's coefficient times its block
    extent, and the lowest offset, multiples of the vector), a row length and a tile row that are multiples of
    it, shared rows (padding included) of whole 16-byte units, and zero for the points outside (a max-pool's
    -inf padding stages element by element). On an H200 the float16 tensor-core GEMMs staged 2-byte elements one
    by one and ran at 48-58 TFLOP/s against cuBLAS's 380-400 (BENCHMARKS.md, GPU)."""
    if not d.stage_vector or tp.view is not None or len(accs) != 1 or not tp.dims or pad_value != 0.0:
        return 0
    v = 16 // itemsize
    if v < 2 or tp.strides[-1] != 1 or len(tp.sizes) != len(tp.dims):
        return 0
    last = accs[0][-1]
    if tp.sizes[-1] % v or tp.dims[-1].extent % v or low % v:
        return 0
    if any(c * block[a] % v for a, c in last.terms):
        return 0
    if len(tp.smem_strides) > 1 and tp.smem_strides[-2] * itemsize % 16:
        return 0
    return v


def stage_order(t: TensorDecl, extents: list[int]) -> list[int]:
    """The dimensions of ``t``'s staged tile (``extents``) in the order consecutive threads walk them when they
    stage it element by element, fastest first: the last dimension first (a plain tensor's contiguous one),
    except in a view (a convolution's im2col gather) where another dimension's innermost sub-axis touches
    fewer 32-byte sectors per 32 consecutive points (``_sectors``). In an NCHW convolution's view
    [n*h*w, c*r*s], consecutive points of the reduction dimension touch 3 contiguous elements (s) and then jump
    a row or a channel, while those of n*h*w run along w: threads walking c*r*s first read scattered 2-4-byte
    pieces, a sector each (gpu-mainloops.md: the float16 convolutions at 0.11x cuDNN). An NHWC view keeps the
    default (c, innermost of c*r*s, is contiguous)."""
    order = list(range(len(extents)))[::-1]
    view = t.view
    if view is None or len(extents) < 2:
        return order
    strides = row_major_strides(list(view.source_shape))
    cost = []
    for d in order:
        if not view.dims[d]:
            cost.append(math.inf)
            continue
        sub, ext = view.dims[d][-1]
        step = abs(sum(i.coefs.get(sub, 0) * s for i, s in zip(view.index, strides)))
        cost.append(_sectors(min(ext, extents[d]), step, t.itemsize))
    best = order[cost.index(min(cost))]   # the first of equals: the innermost
    return [best] + [d for d in order if d != best]


#: what a warp's load touches: 32 points, read in 32-byte sectors
WARP_POINTS = 32
SECTOR_BYTES = 32


def _sectors(run: int, step: int, itemsize: int) -> float:
    """Sectors 32 consecutive points touch when they go in runs of ``run`` points ``step`` elements apart (each
    run starting elsewhere)."""
    run = max(1, min(run, WARP_POINTS))
    per_run = min(run, math.ceil((run - 1) * step * itemsize / SECTOR_BYTES) + 1) if step else 1
    return WARP_POINTS / run * per_run


# -- thread order -------------------------------------------------------------------------------------------

def read_axis(expr: TensorExpr, spatial: list[AxisPlan]) -> str | None:
    """With its stores streamed, a kernel's adjacent threads should read adjacent data, for the prefetchers: the
    spatial axis other than the vector axis along which the largest input is contiguous (a transpose's input
    rows), or None where the vector axis is that axis too. Threads ordered along the output instead read the
    transpose's input 16 rows at a time, 16 KiB apart, at 0.26-0.37x of a copy kernel even with streamed stores;
    along the input, 0.75-0.83x."""
    if len(spatial) < 2:
        return None
    names = [a.name for a in spatial[:-1]]
    for t in sorted((t for t in expr.inputs if t.view is None), key=lambda t: -t.size * t.itemsize):
        for idx in expr.accesses(t.name):
            for a in names:
                if flat_step(t.shape, idx, a) == 1:
                    return a
    return None


#: lanes of a warp along the innermost spatial axis where threads own runs (``AxisPlan.run``): eight 16-byte reads
#: fill one 128-byte shared-memory wavefront (32 banks x 4 bytes), and the warp's other lanes go down the next
#: axis. With all 32 lanes along a 256-wide tile's columns, a float32 GEMM's vector reads of B took 4 wavefronts
#: each and those of A one (a broadcast), 80 per 8 reduction points of a warp against 128 cycles of its FMAs;
#: with 8 x 4 lanes, 1 each, 32 (the CUTLASS SIMT arrangement).
RUN_LANES = 8


def warp_order(spatial: list[AxisPlan], warp: int) -> str:
    """A C expression of the thread index the spatial decode reads instead of the thread id, so that each warp
    covers RUN_LANES points of the innermost axis by ``warp / RUN_LANES`` of the next (warps tile the block in
    that order); "" where the threads own no runs, the dialect has no warps, or the axes' thread counts do not
    divide so (the plain order then)."""
    if warp <= RUN_LANES or len(spatial) < 2 or not any(a.run > 1 for a in spatial[-2:]):
        return ""
    m, n = spatial[-2], spatial[-1]
    lm = warp // RUN_LANES
    if n.threads <= RUN_LANES or n.threads % RUN_LANES or m.threads % lm or n.threads * m.threads % warp:
        return ""
    wn, wm = n.threads // RUN_LANES, m.threads // lm
    lane, w = f"rl_tid % {warp}", f"(rl_tid / {warp})"
    t_n = f"({w} % {wn}) * {RUN_LANES} + ({lane}) % {RUN_LANES}"
    t_m = f"(({w} / {wn}) % {wm}) * {lm} + ({lane}) / {RUN_LANES}"
    return f"(({w} / {wn * wm}) * {m.threads} + {t_m}) * {n.threads} + {t_n}"


# -- unrolling ----------------------------------------------------------------------------------------------

def unrolled(loops: list[tuple[str, int | str, int]]) -> list[tuple[str, int | str, int]]:
    """``loops`` with the innermost unrolled as an unstaged reduction's is (whole when short, else by
    UNROLL_STEP; an extent known only at launch by UNROLL_STEP): left to itself, nvcc unrolled a 100-column
    layer norm into 128 registers."""
    if loops:
        name, ext, _ = loops[-1]
        loops[-1] = (name, ext, -1 if isinstance(ext, int) and ext <= UNROLL_WHOLE else UNROLL_STEP)
    return loops


#: an unstaged reduction's innermost loop is unrolled whole up to this many points (a 3x3 window's 3), else by
#: UNROLL_STEP; outer loops are not unrolled
UNROLL_WHOLE = 8
UNROLL_STEP = 8


def unshared(expr: TensorExpr) -> bool:
    """Whether every input of the body moves with every spatial axis (a pooling window, not a convolution's
    shared weights)."""
    spatial = {a.name for a in expr.spatial_axes}
    return all(spatial <= set(expr.axes_of(t.name)) for t in expr.body_inputs)


def reduce_loops(reduce: list[AxisPlan], window: bool = False) -> list[tuple[str, int | str, int]]:
    """The loop nest that walks an unstaged reduction, one loop per reduction axis, outermost first. Nested
    loops with constant trip counts, not one flat loop that decodes each point: the compiler then moves each
    address's outer terms out of the inner loops (a 3x3 convolution on PoCL: 200 GFLOP/s nested, 92-135 flat
    with the same tile). A pooling window (``window``: no read shared between outputs, at most UNROLL_WINDOW
    points) is unrolled whole: the rows a thread's tile shares between its outputs are then loaded once (a 3x3
    average pool 2-2.5x faster; a depthwise convolution, whose weights are shared, ran 0.8-1.0x as fast so)."""
    loops: list[tuple[str, int | str, int]] = [(ax.name, ax.extent_c or ax.extent, 0) for ax in reduce]
    if window and loops and all(isinstance(e, int) for _, e, _ in loops) and \
            math.prod(int(e) for _, e, _ in loops) <= UNROLL_WINDOW:
        return [(n, e, -1) for n, e, _ in loops]
    return unrolled(loops)


#: a pooling window of at most this many points is unrolled whole (reduce_loops)
UNROLL_WINDOW = 16


def window_inner(loops: list[tuple[str, int | str, int]], vectors: bool) -> bool:
    """Whether the vector path's register tile runs outside the reduction's loops (KernelPlan.window_inner):
    where those are a window unrolled whole."""
    return vectors and bool(loops) and all(u == -1 for _, _, u in loops)


# -- vectors ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VecSchedule:
    """How a CPU kernel's register tile runs as vectors along its last spatial axis (``vector.vec_plan`` prints
    it)."""

    width: int
    # the other spatial axes along which a read gathered along the vector axis loads whole vectors instead (a
    # transpose), each with its decode divisor in the register-tile point index
    across: dict[str, int]
    contiguous: bool  # the output is contiguous along the vector axis: whole vectors are stored with one store
    cross: int | None  # the start of the one run across the vector axis's end, a version of its own; None: none
    skip: bool  # a version for the runs wholly past the axis's end, which compute nothing
    interior: dict[str, tuple[int, int]]  # the ranges of a first version without bounds tests (``interior``)
    stream: bool  # whole vectors stored past the caches (``streamed``)


def vectorise(prog: RProgram, expr: TensorExpr, spatial: list[AxisPlan], inputs: list[TensorPlan],
              out: TensorPlan, d: Dialect, blocked: bool, staged: bool,
              streaming: Streaming | None) -> tuple[tuple[str, int] | None, VecSchedule | None]:
    """Whether and how a kernel vectorises inside a work-item: only a CPU kernel (threads own contiguous runs,
    nothing staged, a dialect with vector loads) does. ``(reduction, tile)``: the reduction walked in vectors
    along its innermost axis, ``(axis, width)`` where roller.ir.vector.reduction_vector picks it; else the
    register tile in vectors (``tile_vectors``), whose output streams only where every extent is known here."""
    if not (blocked and not staged and d.vector_loads) or expr.typed:   # typed bodies print scalars only
        return None, None
    form = reduction_vector(expr, frozenset(t for t, c in d.ctype.items() if c in d.vector_io))
    if form is not None:
        return form, None
    return None, tile_vectors(expr, spatial, inputs, out, d, None if prog.runtime else streaming)


def tile_vectors(expr: TensorExpr, spatial: list[AxisPlan], inputs: list[TensorPlan], out: TensorPlan,
                 d: Dialect, streaming: Streaming | None = None) -> VecSchedule | None:
    """The vector form of a CPU kernel's register tile, or None where it does not apply: no spatial axis, a
    last-axis thread run that no vector width divides, or a tensor that is not the accumulator's type (the
    vector path would need conversions). With ``streaming``, its whole vectors may store past the caches
    (``streamed``)."""
    if not spatial:
        return None
    ax = spatial[-1]
    width = vector_width(ax.thread)
    acc = d.ctype[expr.acc_dtype]
    if not width or not all(d.vector_type_ok(d.ctype[t.dtype], acc) for t in (*expr.inputs, expr.output)):
        return None
    partial = {a.name: a.extent for a in spatial if a.extent % a.block}
    contiguous = out.view is None and flat_coef(expr.out_index, out.strides, ax.name) == 1

    # Spatial axes along which a read gathered along the vector axis can load whole vectors instead (a
    # transpose): their thread runs are whole vectors and no tile is partial along them or the vector axis.
    across = {a.name: a.jdiv for a in spatial[:-1] if a.thread % width == 0 and not a.extent % a.block} \
        if not ax.extent % ax.block else {}
    rows = {a: n for a, n in partial.items() if a != ax.name}
    # Runs start at multiples of the thread's run, so at most one crosses the end, and at a position known
    # here: given as a constant, its lane tests fold away. With a run-time start they stayed, and the
    # crossing threads gathered and stored lane by lane: 8x16 tiles of a 97x31x13 matmul ran 1.8x slower
    # than 4x32 ones, whose single run's start was a constant anyway (docs/opencl.md).
    cross = ax.extent // ax.thread * ax.thread if ax.name in partial and ax.extent % ax.thread else None
    skip = cross is not None and ax.blocks * ax.block // ax.thread > cross // ax.thread + 1
    # (a converting store has no streaming form)
    stream = contiguous and streaming is not None and d.ctype[expr.output.dtype] == acc and \
        streamed(expr, ax, width, out, d, streaming)
    return VecSchedule(width, across, contiguous, cross, skip, interior(expr, spatial, inputs, rows), stream)


def interior(expr: TensorExpr, spatial: list[AxisPlan], inputs: list[TensorPlan],
             clamp: dict[str, int]) -> dict[str, tuple[int, int]]:
    """The range of each spatial axis inside which a window read needs no bounds test (a pooling window's
    ``h + r - 1`` for every ``r``), where some thread's run lies wholly inside it: ``{axis: (lo, hi)}``. Only
    dimensions indexed by one spatial axis (with a positive step) and reduction axes count. A 3x3 average pool
    read its input unpadded with a bounds test on each of its nine loads per output vector, at 0.40x of a copy
    kernel; a kernel reading a padded copy without them ran at 0.6-0.96x (docs/opencl.md)."""
    names = {a.name: a for a in spatial}
    bounds: dict[str, tuple[int, int]] = {}
    for tp in inputs:
        if tp.view is not None:
            continue
        maxes = axis_maxes(tp, clamp)
        for idx in expr.accesses(tp.name):
            for dim, i in enumerate(idx):
                moving = [(a, c) for a, c in i.terms if a in names]
                if len(moving) != 1 or moving[0][1] <= 0 or not is_guarded(tp, dim, i, maxes):
                    continue
                a, c = moving[0]
                low, high = index_span(Affine(tuple((r, cr) for r, cr in i.terms if r != a), i.const), tp.lows,
                                       maxes)
                lo = -(low // c)   # the ceiling of -low / c
                hi = (tp.sizes[dim] - 1 - high) // c
                was = bounds.get(a, (lo, hi))
                bounds[a] = (max(was[0], lo), min(was[1], hi))
    return {a: (lo, hi) for a, (lo, hi) in bounds.items()
            if names[a].thread <= hi - lo + 1 and (lo > 0 or hi < names[a].extent - 1)}


@dataclass(frozen=True)
class Streaming:
    """When a CPU kernel stores past the caches: outputs of at least ``min_bytes`` (more than the caches hold),
    in vectors of whole transactions (``whole_bytes``: a streaming store of part of a line writes the line in
    pieces)."""

    min_bytes: int
    whole_bytes: int


def streamed(expr: TensorExpr, ax: AxisPlan, width: int, out: TensorPlan, d: Dialect,
             streaming: Streaming) -> bool:
    """Whether a CPU kernel's output, stored in ``width``-wide vectors along ``ax``, streams past the caches: the
    dialect has a streaming store, the output is large enough (a store that fills the cache first would only
    evict, and for a line not yet cached read it from memory for nothing), and every vector the kernel stores
    whole is whole transactions and aligned to its size, which a streaming store needs: the vector axis is the
    output's contiguous one, its tiles start at multiples of the width, and every other axis and the index's
    constant move the offset by whole vectors (buffers start at CL_DEVICE_MEM_BASE_ADDR_ALIGN, 128 bytes or
    more). A transpose whose rows of vectors land 16 KiB apart wrote 0.26x of a copy kernel's bandwidth through
    the caches, 0.77x streamed (docs/opencl.md, "Streaming stores")."""
    nbytes = expr.output.size * expr.output.itemsize
    if not d.streaming_store or out.view is not None or nbytes < streaming.min_bytes or ax.block % width or \
            width * expr.output.itemsize % streaming.whole_bytes:
        return False
    if flat_coef(expr.out_index, out.strides, ax.name) != 1:
        return False
    const = sum(i.const * s for i, s in zip(expr.out_index, out.strides))
    others = {a for i in expr.out_index for a, _ in i.terms if a != ax.name}
    return not const % width and all(not flat_coef(expr.out_index, out.strides, a) % width for a in others)


def row_vector_width(expr: TensorExpr, cols: list[Axis], d: Dialect, blocked: bool) -> int:
    """The vector width of a CPU row kernel's column walks (KernelPlan.row_vec), or 0: one column axis, a
    dialect with vector loads, threads that own contiguous runs, and every tensor of the accumulator's type."""
    width = next((w for w in VECTOR_WIDTHS if w <= cols[-1].extent), 0) if cols else 0
    acc = d.ctype[expr.acc_dtype]
    if d.vector_loads and blocked and len(cols) == 1 and width and \
            all(d.vector_type_ok(d.ctype[t.dtype], acc) for t in expr.tensors):
        return width
    return 0


# -- what is computed where ---------------------------------------------------------------------------------

def hoist_divisor(expr: TensorExpr) -> TensorExpr:
    """A sum of ``x / c`` (c a constant: an average pool's K*K, a mean's count) as the sum of ``x`` divided
    by ``c`` once, in the epilogue: one division per output instead of one per point. A 3x3 average pool on
    PoCL divided every window point, and vector divisions, not memory, set its time."""
    body = expr.body
    if expr.reduce_op != "sum" or not expr.reduce_axes or not isinstance(body, BinOp) or body.op != "/" \
            or not isinstance(body.rhs, Const) or expr.typed:   # integer quotients truncate each point
        return expr
    c = body.rhs
    if expr.epilogue is None:
        return replace(expr, body=body.lhs, epilogue=BinOp("/", Read(expr.output.name, expr.out_index), c))
    # A fused epilogue reads the reduced value as the output: it reads the sum divided instead.
    return replace(expr, body=body.lhs, epilogue=map_reads(
        expr.epilogue, lambda r: BinOp("/", r, c) if r.tensor == expr.output.name else r))
