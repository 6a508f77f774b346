"""Vector programs of ops with no reuse: each thread moves U whole vectors of the description's widest access
(``memory[0].vector_bytes``) along the op's one contiguous axis, and a grid sized to what the device holds at
once walks the tiles in a grid-stride loop.

Enlargement grows a thread tile only where it cuts traffic, and an elementwise op has none to cut: its programs
held one 4-byte element per thread and a block per 128-1024 elements (1.78M blocks for a 227M-float relu), at
0.57x of a copy's bandwidth on an H200. To keep a memory's bandwidth busy, each unit needs bandwidth x latency
/ units bytes in flight (Little's law: about 13 KB per SM there); one float per thread at full occupancy is
8 KB. A 16-byte vector per thread is 32 KB, and U in {1, 2, 4} of them issued before the first use leave the
model (perf/micro.py, ``latency_ns``) to pick the smallest U that reaches the bandwidth
(shared/reference/gpu-mainloops.md, section 4).
"""
from __future__ import annotations

from roller.hw import HardwareDesc
from roller.ir.expr import Affine
from roller.ir.tensor_expr import TensorExpr
from roller.perf.micro import predict, resources
from roller.perf.traffic import TileGeometry
from roller.program import RProgram, RTile

#: vectors in flight per thread (U): all loaded before the first is used
VECTORS_PER_THREAD = (1, 2, 4)
#: threads per block of the vector programs (each a multiple of any warp size up to 128)
BLOCKS = (128, 256, 512)
#: element types whose values the vector form converts lane by lane (the accumulator is float32)
FLOATS = ("float32", "float16", "bfloat16")


def stream_axis(expr: TensorExpr) -> str | None:
    """The one spatial axis of ``expr`` along which every tensor is read and written element for element (an
    elementwise op, its axes fused into one contiguous axis), or None: a reduction, a window, a broadcast or
    stride, a view, padded reads, an epilogue, typed (integer) arithmetic, or tensors of unequal widths keep
    the scalar programs."""
    if expr.reduce_axes or expr.stages or expr.typed or expr.epilogue is not None or len(expr.axes) != 1:
        return None
    if expr.preparation is not None and expr.preparation.pads:
        return None
    axis = expr.axes[0]
    flat = (Affine.axis(axis.name),)
    sizes = {t.itemsize for t in expr.tensors}
    if len(sizes) != 1 or any(t.dtype not in FLOATS or t.view is not None or t.shape != (axis.extent,)
                              for t in expr.tensors):
        return None
    if expr.out_index != flat or not expr.body_inputs:
        return None
    if any(idx != flat for t in expr.body_inputs for idx in expr.accesses(t.name)):
        return None
    return axis.name


def stream_width(expr: TensorExpr, hw: HardwareDesc) -> int:
    """Elements of one vector access of ``expr``'s tensors on ``hw``: ``vector_bytes`` / itemsize, or 1 where the
    description gives no wider access or the op has no stream axis."""
    widest = hw.memory[0].vector_bytes
    if widest is None or len(expr.axes) != 1 or stream_axis(expr) is None:
        return 1
    itemsize = expr.output.itemsize
    return max(1, widest // itemsize) if widest % itemsize == 0 else 1


def stream_programs(expr: TensorExpr, geo: TileGeometry, hw: HardwareDesc, block_level: int,
                    thread_level: int) -> list[RProgram]:
    """The vector programs of ``expr`` on ``hw`` (none where ``stream_width`` is 1): for each block size and U,
    a block tile of block x U x V elements, a thread tile of U x V, and a grid of at most the blocks the device
    holds resident at once. Each is predicted over all its tiles (a grid-stride block runs several)."""
    width = stream_width(expr, hw)
    if width < 2 or expr.axes[0].extent < width or thread_level <= block_level:
        return []
    extent = expr.axes[0].extent
    par = hw.parallelism
    out: list[RProgram] = []
    for block in BLOCKS:
        if block > par.max_threads_per_block or block % par.warp_size:
            continue
        for u in VECTORS_PER_THREAD:
            thread = (u * width,)
            btile = (block * u * width,)
            shapes = tuple(btile if i <= block_level else thread for i in range(len(hw.memory) - 1))
            tiles = tuple(RTile(s) for s in shapes)
            tiles_n = -(-extent // btile[0])
            res = resources(geo, hw, shapes, block_level, thread_level, block, {})
            if res.blocks_per_unit < 1:
                continue
            # Every tile is a block's turn of the loop: the model sees the tiles, the launch the resident grid.
            pred = predict(geo, hw, shapes, block_level, thread_level, tiles_n, block, res,
                           dtype=expr.output.dtype)
            grid = min(tiles_n, par.compute_units * res.blocks_per_unit)
            out.append(RProgram(expr=expr, hw_name=hw.name, hw_hash=hw.content_hash()[:16],
                                layers=tuple(m.name for m in hw.memory), scopes=tuple(m.scope for m in hw.memory),
                                tiles=tiles, grid=grid, block=block, block_level=block_level,
                                thread_level=thread_level, padding_waste=geo.padding_waste(btile), vector=width,
                                prediction=pred))
    return out
