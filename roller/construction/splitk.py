"""Split-K: programs whose output tiles do not fill the device reduce each tile in S blocks.

Block ``b`` of a split program computes output tile ``b % tiles`` over the ``b // tiles``-th contiguous range
of its reduction tiles and writes float32 partial sums into a workspace [S, outputs]; a second kernel sums the
S partials of each output in split order (deterministic: no atomics) and stores the output. Only a backend
that renders that pair asks for them (``construct(split_k=True)``), and only for a plain sum (no fused epilogue,
no output view), where the description allows it (``parallelism.max_split_k``).
"""
from __future__ import annotations

import dataclasses
import math

from roller.hw import HardwareDesc
from roller.ir.tensor_expr import TensorExpr
from roller.perf.micro import Resources, predict
from roller.perf.traffic import TileGeometry
from roller.program import Prediction, RProgram

#: reduction tiles (k-steps) each split keeps at least: fewer, and the partials' traffic and the second
#: kernel outweigh the blocks gained
MIN_STEPS_PER_SPLIT = 4
#: the reduction must be this many times longer than the block tile's longest spatial side (K >> M, N tile)
LONG_REDUCTION = 4
#: seconds the second (reduce) kernel costs beyond its traffic: one more launch queued behind the first, when
#: the description has no measured launch cost
REDUCE_LAUNCH_S = 3e-6
#: threads per block of the reduce kernel
REDUCE_BLOCK = 256
#: element types whose partial sums are float32 (float64 ones accumulate in double, integers exactly: not split)
FLOAT_TYPES = ("float32", "float16", "bfloat16")
#: workspace elements (S x outputs) must index with a 32-bit int
MAX_WORKSPACE_ELEMS = 2**31 - 1


def splittable(expr: TensorExpr) -> bool:
    """Whether ``expr``'s reduction can be split and its partials summed by a separate kernel: a plain sum
    stored as it is (no epilogue, no view or padded layout of the output), float types, fixed extents."""
    out = expr.output
    return (expr.reduce_op == "sum" and expr.epilogue is None and not expr.stages and bool(expr.reduce_axes)
            and out.view is None and out.orig_shape is None and tuple(out.storage_shape) == tuple(out.shape)
            and all(t.dtype in FLOAT_TYPES for t in expr.tensors))


def split_axis(prog: RProgram) -> int | None:
    """The index of the one reduction axis the block tile walks in more than one step (the axis a split
    divides); None where several or none do."""
    walked = [i for i, a in enumerate(prog.expr.axes) if a.reduce and prog.block_tile.shape[i] < a.extent]
    return walked[0] if len(walked) == 1 else None


def reduction_tiles(prog: RProgram) -> int:
    """Reduction tiles (k-steps) a block of ``prog`` walks."""
    return math.prod(-(-a.extent // b) for a, b in zip(prog.expr.axes, prog.block_tile.shape) if a.reduce)


def per_split(prog: RProgram) -> int:
    """Reduction tiles each split of ``prog`` walks (the last one the rest)."""
    return -(-reduction_tiles(prog) // prog.reduce_threads)


def output_tiles(prog: RProgram) -> int:
    """Output tiles of ``prog`` (its grid without the splits)."""
    return prog.grid // max(1, prog.reduce_threads)


def split_factors(prog: RProgram, hw: HardwareDesc) -> list[int]:
    """The split factors construction offers for ``prog`` (none where it fills the device, its reduction is
    short, or the description allows no split): each keeps at least MIN_STEPS_PER_SPLIT k-steps and leaves no
    split empty; the factors go up to the one whose blocks first fill every unit's resident slots."""
    pred = prog.prediction
    cap = hw.parallelism.max_split_k
    if pred is None or cap < 2 or prog.reduce_threads != 1 or prog.runtime or not splittable(prog.expr):
        return []
    axis = split_axis(prog)
    if axis is None:
        return []
    slots = hw.parallelism.compute_units * max(1, pred.blocks_per_unit)
    spatial = [b for a, b in zip(prog.expr.axes, prog.block_tile.shape) if not a.reduce]
    if prog.grid >= slots or prog.expr.axes[axis].extent < LONG_REDUCTION * max(spatial, default=1):
        return []
    steps = reduction_tiles(prog)
    outputs = prog.expr.output.size
    out: list[int] = []
    for s in range(2, cap + 1):
        per = -(-steps // s)
        if per < MIN_STEPS_PER_SPLIT or s * outputs > MAX_WORKSPACE_ELEMS:
            break
        if (s - 1) * per >= steps:   # an empty last split: the same blocks as a smaller factor
            continue
        out.append(s)
        if prog.grid * s >= slots:
            break
    return out


def split_program(prog: RProgram, s: int, hw: HardwareDesc) -> RProgram | None:
    """``prog`` with its reduction split ``s`` ways, predicted: each block walks ``per_split`` k-steps of the
    one walked reduction axis, the grid is ``s`` times larger, and the partials' traffic (written as float32,
    read back by the second kernel) and that kernel's launch are added."""
    pred = prog.prediction
    axis = split_axis(prog)
    if pred is None or axis is None:
        return None
    split = dataclasses.replace(prog, reduce_threads=s, grid=prog.grid * s, prediction=None)
    step = prog.block_tile.shape[axis]
    part = min(prog.expr.axes[axis].extent, per_split(split) * step)
    expr = prog.expr
    shrunk = dataclasses.replace(expr, axes=tuple(dataclasses.replace(a, extent=part) if i == axis else a
                                                  for i, a in enumerate(expr.axes)))
    geo = TileGeometry(shrunk)
    res = Resources(0, pred.registers_per_thread, pred.blocks_per_unit)
    shapes = tuple(t.shape for t in prog.tiles)
    base = predict(geo, hw, shapes, prog.block_level, prog.thread_level, split.grid, prog.block, res,
                   use_matrix=prog.use_matrix, dtype=expr.output.dtype)
    extra = reduce_seconds(expr, s, hw)
    useful = base.fraction_of_peak * base.time_s * math.prod(a.extent for a in expr.axes) / \
        max(1, math.prod(a.extent for a in shrunk.axes))
    time = base.time_s + extra
    return dataclasses.replace(split, prediction=Prediction(
        time_s=time, bottleneck=base.bottleneck, fraction_of_peak=useful / time if time > 0 else 0.0,
        layer_times_s=base.layer_times_s + (("split-k reduce", extra),), compute_time_s=base.compute_time_s,
        waves=base.waves, blocks_per_unit=base.blocks_per_unit, registers_per_thread=base.registers_per_thread))


def reduce_seconds(expr: TensorExpr, s: int, hw: HardwareDesc) -> float:
    """The split's extra time: the partials written as float32 instead of the output type, the second
    kernel's read of them and its store of the output, at the outermost layer's bandwidth, plus its launch."""
    out = expr.output
    nbytes = out.size * (s * 4 - s * out.itemsize + s * 4 + out.itemsize)
    cal = hw.calibration
    launch = cal.launch_us * 1e-6 if cal is not None and cal.launch_us else REDUCE_LAUNCH_S
    return nbytes / hw.bandwidth(0) + launch


def split_programs(progs: list[RProgram], hw: HardwareDesc) -> list[RProgram]:
    """The split-K variants of ``progs`` that construction offers (see ``split_factors``)."""
    out = []
    for p in progs:
        for s in split_factors(p, hw):
            q = split_program(p, s, hw)
            if q is not None:
                out.append(q)
    return out
