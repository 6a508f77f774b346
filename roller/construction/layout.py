"""The storage layout of constant inputs, chosen by construction (the paper's tile layout, issue 23).

A CPU kernel vectorises a thread's register tile along the last spatial axis. A convolution's output width is
a poor vector axis at model shapes (7 or 14 wide, or read with stride 2: 0.1-0.3x onnxruntime on PoCL), while
its output channels are a good one, if the weights hold them innermost: then every lane reads the next
weight with one vector load and the activation is one broadcast. Weights are constants, so that layout costs
a transpose once, when the model is built. The same holds for a Gemm whose weight is stored transposed.

A transposed weight still leaves each thread's weights for its whole reduction as one short run per reduction
step, a row apart (a matmul's ``B[k, n..n+16]``: 64 bytes every 4 KiB when N is 1024), which the hardware
prefetchers do not follow across pages. Blocked, ``B[n / w, k, n % w]`` with ``w`` the lanes of a cache line,
they are one run (the classic GEMM packing): a 1024^3 matmul on PoCL ran 110-144 GFLOP/s with its weights
blocked, 50-58 as written, with the same tiles.

Construction builds the op as written and each packed variant, and keeps the one the model predicts fastest;
among those it predicts alike (within ``MIN_GAIN``: it counts bytes moved, not runs), the one whose weights are
read in the fewest contiguous runs.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

from roller.hw import HardwareDesc
from roller.ir.expr import Affine, Read, gathers
from roller.ir.layout import PackedLayout
from roller.ir.tensor_expr import Axis, TensorExpr
from roller.perf.traffic import TileGeometry
from roller.program import RProgram

# A packed variant must be predicted at least this much faster: the transposed copy of the weights costs
# memory and build time, so a tie keeps the layout the user gave.
MIN_GAIN = 0.9
# Where layouts are measured, only those predicted within this factor of the fastest are: in an evaluate=True
# ResNet-18 build (pocl-cpu, all timed), 19 layouts were predicted 1.5-7.5x slower than their operator's
# fastest; 17 ran slower than its best layout, one 7% faster, one alike; timing each cost ten compiles.
MEASURE_WITHIN = 1.5
# An axis shorter than this makes no vector worth a layout (a batch of 1).
MIN_LANES = 4


def packed_variants(expr: TensorExpr, constants: Iterable[str], block: int = 0) -> list[PackedLayout]:
    """Each way to make a constant input's dimension the innermost one and vectorise along the spatial axis
    that indexes it. Applies where that axis indexes the constant plainly (coefficient 1) in one dimension
    and no other input moves with it (those become broadcasts), where the axis is long enough to vectorise,
    and where the result differs from ``expr``. With ``block``, also each blocked layout (``_blocked_variants``)."""
    spatial = [a.name for a in expr.spatial_axes]
    if not spatial or expr.preparation is not None or gathers(expr.body):   # a gathered read names its dimension
        return []
    out = []
    for name in [t.name for t in expr.body_inputs if t.name in set(constants)]:
        t = expr.tensor(name)
        accs = expr.accesses(name)
        if t.view is not None or len(accs) != 1 or len(t.shape) < 2:
            continue
        for d, ix in enumerate(accs[0]):
            axis = ix.plain_axis()
            if axis not in spatial or (axis == spatial[-1] and d == len(t.shape) - 1) or \
                    expr.axis(axis).extent < MIN_LANES:
                continue
            # An epilogue's reads (a bias, a residual) happen once per output point: they may gather.
            if any(axis in expr.axes_of(o.name) for o in expr.body_inputs if o.name != name):
                continue
            out.append(_pack(expr, name, d, axis))
        out += _blocked_variants(expr, name, block)
    return out


def _blocked_variants(expr: TensorExpr, name: str, block: int) -> list[PackedLayout]:
    """The weights blocked along each spatial axis that indexes them plainly, ``block`` elements of it
    innermost, those blocks outermost: each thread's weights for its whole reduction are then one run. Where
    the axis is a multiple of ``block`` (at least two blocks) and moves no other input of the body (those would
    gather per lane)."""
    if block < 2:
        return []
    spatial = [a.name for a in expr.spatial_axes]
    idx = expr.accesses(name)[0]
    out = []
    for d, ix in enumerate(idx):
        axis = ix.plain_axis()
        if axis not in spatial or expr.axis(axis).extent % block or expr.axis(axis).extent < 2 * block:
            continue
        if any(axis in expr.axes_of(o.name) for o in expr.body_inputs if o.name != name):
            continue
        out.append(_block(expr, name, d, axis, block))
    return out


def _block(expr: TensorExpr, name: str, dim: int, axis: str, block: int) -> PackedLayout:
    t = expr.tensor(name)
    outer, inner = _fresh(expr, f"{axis}_o"), _fresh(expr, f"{axis}_i")
    # After the split, dimension ``dim`` is the blocks and ``dim + 1`` the lanes; the blocks go first, the
    # lanes last.
    rank = len(t.shape) + 1
    perm = (dim,) + tuple(i for i in range(rank) if i not in (dim, dim + 1)) + (dim + 1,)
    split_shape = t.shape[:dim] + (t.shape[dim] // block, block) + t.shape[dim + 1:]
    packed = dataclasses.replace(t, shape=tuple(split_shape[i] for i in perm))
    whole = Affine.of({outer: block, inner: 1})

    def sub(a: Affine) -> Affine:
        c = a.coefs.get(axis, 0)
        if not c:
            return a
        return Affine.of({k: v for k, v in a.coefs.items() if k != axis}, a.const) + whole.scale(c)

    def reindex(r: Read) -> Read:
        if r.tensor == name:
            split = r.index[:dim] + (Affine.axis(outer), Affine.axis(inner)) + r.index[dim + 1:]
            return Read(r.tensor, tuple(split[i] for i in perm), r.pos)
        return Read(r.tensor, tuple(sub(i) for i in r.index), r.pos)

    n = expr.axis(axis).extent
    spatial = [a for a in expr.axes if not a.reduce and a.name != axis]
    axes = tuple(spatial) + (Axis(outer, n // block, False), Axis(inner, block, False)) + \
        tuple(a for a in expr.axes if a.reduce)
    inputs = tuple(packed if i.name == name else i for i in expr.inputs)
    new = dataclasses.replace(expr.remap_reads(reindex, tuple(sub(i) for i in expr.out_index)), inputs=inputs,
                              axes=axes)
    return PackedLayout(new, name, perm, inner, split=dim, block=block)


def _fresh(expr: TensorExpr, base: str) -> str:
    names = {a.name for a in expr.axes}
    out = base
    while out in names:
        out += "_"
    return out


def weight_runs(prog: RProgram, tensor: str) -> int:
    """Contiguous runs in which the threads of ``prog`` read ``tensor`` over their whole reductions: per
    thread tile, the rows of its region, rows merged where the region spans every inner dimension."""
    geo = TileGeometry(prog.expr)
    t = next(x for x in geo.tensors if x.name == tensor)
    tile = prog.thread_tile.shape
    region = geo.region(t, geo.full_reduce(tile))
    runs = len(region) - 1
    while runs > 0 and region[runs] == t.dims[runs].size:
        runs -= 1
    threads = math.prod(-(-e // s) for e, s, r in zip(geo.extents, tile, geo.reduce_mask) if not r)
    return threads * math.prod(region[:runs])


def _pack(expr: TensorExpr, name: str, dim: int, axis: str) -> PackedLayout:
    t = expr.tensor(name)
    perm = tuple(i for i in range(len(t.shape)) if i != dim) + (dim,)
    packed = dataclasses.replace(t, shape=tuple(t.shape[i] for i in perm))

    def reindex(r: Read) -> Read:
        return Read(r.tensor, tuple(r.index[i] for i in perm), r.pos) if r.tensor == name else r

    spatial = [a for a in expr.axes if not a.reduce and a.name != axis] + [expr.axis(axis)]
    axes = tuple(spatial) + tuple(a for a in expr.axes if a.reduce)
    inputs = tuple(packed if i.name == name else i for i in expr.inputs)
    new = dataclasses.replace(expr.remap_reads(reindex), inputs=inputs, axes=axes)
    return PackedLayout(new, name, perm, axis)


def choose_layout(expr: TensorExpr, hw: HardwareDesc, constants: Iterable[str],
                  matrix: Iterable = (), measured: Callable[[TensorExpr], float | None] | None = None,
                  best: Callable[[TensorExpr], RProgram] | None = None) -> PackedLayout | None:
    """The packed variant of ``expr`` the micro-performance model predicts fastest, or None to keep the
    layout as given; among the layouts predicted within ``MIN_GAIN`` of the fastest, the one whose weights are
    read in the fewest runs (``weight_runs``; the layout as given where that ties). With ``measured`` (seconds
    of an expression's kernel as the device runs it, None where none ran), the layout whose kernel ran fastest
    instead: the model ranks layouts as poorly as tiles (a 1x1 convolution of 24 channels to 144 at 56x56 with
    its output channels as the vector axis, the model's pick, ran at 0.43x onnxruntime). Only where kernels read
    global memory through a cache (a CPU: the block's layer is a cache), which is where the vector axis and
    the runs decide the speed; GPU descriptions keep their layouts. Layouts predicted beyond ``MEASURE_WITHIN``
    of the fastest are not measured. ``best`` answers which program construction
    ranks first for an expression (default: construct it here; a build passes its memoised answers)."""
    from roller.construction import construct, levels

    block_level, _ = levels(hw)
    layer = hw.memory[block_level + 1]
    if layer.scope != "cache":
        return None
    constants = tuple(constants)
    body = {t.name for t in expr.body_inputs}
    weights = [c for c in constants if c in body]
    itemsize = max(expr.tensor(c).itemsize for c in weights) if weights else 4
    variants = packed_variants(expr, constants, block=max(layer.transaction_bytes // itemsize, 0))
    if not variants:
        return None
    matrix = tuple(matrix)

    def top1(e: TensorExpr) -> RProgram:
        return construct(e, hw, top_k=1, matrix=matrix)[0]

    best = best or top1

    def seconds(p: RProgram) -> float:
        return p.prediction.time_s if p.prediction else float("inf")

    options: list[tuple[RProgram, PackedLayout | None]] = [(best(expr), None)]
    options += [(best(v.expr), v) for v in variants]
    fastest = min(seconds(p) for p, _ in options)
    if measured is not None:
        near = [v for p, v in options if seconds(p) <= MEASURE_WITHIN * fastest]
        timed = [(t, i, v) for i, v in enumerate(near) if (t := measured(expr if v is None else v.expr)) is not None]
        if timed:
            return min(timed, key=lambda tv: (tv[0], tv[1]))[2]
    alike = [(p, v) for p, v in options if MIN_GAIN * seconds(p) <= fastest]
    _, pick = min(alike, key=lambda pv: (sum(weight_runs(pv[0], c) for c in weights), pv[1] is not None,
                                         seconds(pv[0])))
    return pick
