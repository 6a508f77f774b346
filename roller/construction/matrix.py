"""rPrograms for matrix instructions: GEMM-shaped contractions tiled for warp- or wavefront-wide fragments.

A float16 (or bfloat16) matmul, batch matmul or implicit-GEMM convolution, on a description that lists a
matrix instruction which the chosen backend renders (``MatrixSupport``), gets programs whose register-level
tile is one *warp's* tile: a multiple of the instruction's m and n (paper rule 2.2a applied to the instruction
shape), and whose reduction step is a multiple of its k. The block tile is a grid of warp tiles; threads per
block = warps x warp size. One search serves every family a description can declare:

``wmma`` (NVIDIA): a 32-thread warp computes an m x n x k product from fragments it loads out of shared memory
  in rows of 16 bytes; its accumulators leave through shared memory (one fragment per warp).
``mfma`` (AMD CDNA): a 64-lane wavefront computes it from 4 elements per lane and operand; accumulators stay in
  registers and are stored directly.

The aligned space is small (tens of warp tilings, a few reduction steps), so every aligned tile that fits the
description's limits is scored by the micro-model with the matrix peak and the best ``want`` are kept; the
scalar construction's candidates compete with them in the final ranking.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from roller.construction.align import EPSILONS, padding_ok, storage_padding, warp_multiple
from roller.hw import HardwareDesc, MatrixInstruction, MemoryLayer
from roller.ir.expr import BinOp, Read
from roller.ir.tensor_expr import TensorExpr
from roller.perf.micro import matrix_registers_per_thread, predict, register_cap, resources
from roller.perf.traffic import TileGeometry
from roller.program import MatrixChoice, RProgram, RTile


@dataclass(frozen=True)
class Family:
    """How programs of one family of matrix instructions are laid out: what construction must know to size
    them (the backends render exactly that layout)."""

    name: str
    lanes: int  # threads that issue one instruction together; descriptions with another warp size get none
    tile_multiples: tuple[int, ...]  # instruction tiles per warp side
    warp_counts: tuple[int, ...]  # warps per block side
    k_multiples: tuple[int, ...]  # instruction k-steps per staged reduction step
    row_bytes: int  # fragment loads read staged rows in pieces of this many bytes (0: the bank rule pads)
    epilogue_scratch: bool  # accumulators leave through shared memory, one float32 fragment per warp


FAMILIES = {
    "wmma": Family("wmma", lanes=32, tile_multiples=(1, 2, 4, 8), warp_counts=(1, 2, 4, 8, 16),
                   k_multiples=(1, 2, 4), row_bytes=16, epilogue_scratch=True),
    "mfma": Family("mfma", lanes=64, tile_multiples=(1, 2, 4), warp_counts=(1, 2, 4),
                   k_multiples=(1, 2, 4, 8), row_bytes=0, epilogue_scratch=False),
}


@dataclass(frozen=True)
class MatrixSupport:
    """One matrix instruction shape a backend renders: a backend's capability, handed to construction."""

    family: str
    input_dtype: str
    shape: tuple[int, int, int]


def family_of(inst: MatrixInstruction) -> Family | None:
    """The family of a description's instruction, by its name's prefix (``wmma_m16n16k16_f16``)."""
    return FAMILIES.get(inst.name.split("_", 1)[0])


@dataclass(frozen=True)
class GemmRoles:
    """Which axes and tensors of an expression play which part of C[batch, m, n] += A . B."""

    batch: tuple[str, ...]
    m: str
    n: str
    k: str
    a: str  # the input indexed by m and k
    b: str  # the input indexed by k and n


def gemm_roles(expr: TensorExpr) -> GemmRoles | None:
    """The GEMM roles of ``expr``, or None when it is not a plain product-sum over one reduction axis with
    plain (single-axis) indices everywhere: the shape the fragment path handles."""
    if expr.reduce_op != "sum" or expr.pad_value != 0 or len(expr.reduce_axes) != 1 or \
            len(expr.body_inputs) != 2:
        return None
    body = expr.body
    if not (isinstance(body, BinOp) and body.op == "*" and isinstance(body.lhs, Read)
            and isinstance(body.rhs, Read) and body.lhs.tensor != body.rhs.tensor):
        return None
    k = expr.reduce_axes[0].name
    out = [i.plain_axis() for i in expr.out_index]
    if len(out) < 2 or any(a is None for a in out):
        return None
    m, n = str(out[-2]), str(out[-1])
    batch = tuple(str(a) for a in out[:-2])
    axes: dict[str, list[str]] = {}
    for r in (body.lhs, body.rhs):
        names = [i.plain_axis() for i in r.index]
        if any(a is None for a in names) or len(expr.accesses(r.tensor)) != 1:
            return None
        axes[r.tensor] = [str(a) for a in names]
    a_name = next((t for t, ax in axes.items() if m in ax and k in ax and n not in ax), None)
    b_name = next((t for t, ax in axes.items() if n in ax and k in ax and m not in ax), None)
    if a_name is None or b_name is None or a_name == b_name:
        return None
    for t in (a_name, b_name):
        ax = axes[t]
        # batch axes lead, the two matrix axes are the innermost pair (either order: transposes are layouts)
        if len(ax) != len(batch) + 2 or tuple(ax[:len(batch)]) != batch:
            return None
    return GemmRoles(batch, m, n, k, a_name, b_name)


def instructions(expr: TensorExpr, hw: HardwareDesc,
                 support: Iterable[MatrixSupport]) -> list[tuple[Family, MatrixInstruction]]:
    """The description's instructions that apply to ``expr`` and that the backend renders, largest m first:
    a GEMM-shaped op whose inputs share the instruction's input dtype, accumulated in float32."""
    if not expr.inputs or expr.acc_dtype != "float32" or gemm_roles(expr) is None:
        return []
    dtype = expr.inputs[0].dtype
    if any(t.dtype != dtype for t in expr.body_inputs):
        return []
    allowed = {(s.family, s.input_dtype, tuple(s.shape)) for s in support}
    found = []
    for mi in hw.matrix_instructions_for(dtype):
        fam = family_of(mi)
        if fam is None or fam.lanes != hw.parallelism.warp_size or mi.accumulator_dtype != "float32":
            continue
        if (fam.name, dtype, tuple(mi.shape)) in allowed:
            found.append((fam, mi))
    return sorted(found, key=lambda f: -f[1].shape[0])


def row_padding(inner: int, itemsize: int, row_bytes: int) -> int:
    """Rule 2.2c for fragment loads: pad a staged row to whole ``row_bytes`` pieces, an odd number of them, so
    that the rows one load phase reads start in different bank groups."""
    unit = max(1, row_bytes // itemsize)
    if inner <= 1:
        return 0
    pad = (-inner) % unit
    if ((inner + pad) // unit) % 2 == 0:
        pad += unit
    return pad


def scratch_bytes(family: Family, inst_shape: tuple[int, int, int], warps: int) -> int:
    """Shared memory of the epilogue: one float32 accumulator fragment per warp where the family writes its
    results out through shared memory."""
    return warps * inst_shape[0] * inst_shape[1] * 4 if family.epilogue_scratch else 0


def matrix_programs(expr: TensorExpr, geo: TileGeometry, hw: HardwareDesc, block_level: int, thread_level: int,
                    want: int, support: Iterable[MatrixSupport] = (), every_tiling: bool = False) -> list[RProgram]:
    """The ``want`` best-predicted matrix programs of ``expr`` on ``hw`` for the instructions in ``support``
    (none when no instruction applies, or the description has no block-scope layer to stage fragments in).
    One warp tiling per block tile unless ``every_tiling`` (which checks of the backends' layouts use)."""
    found = instructions(expr, hw, support)
    roles = gemm_roles(expr)
    if not found or roles is None or hw.memory[block_level + 1].scope != "block":
        return []
    par = hw.parallelism
    smem_layer = hw.memory[block_level + 1]
    cap = smem_layer.capacity_per_block_bytes or 0
    names = geo.axis_names
    ext = dict(zip(names, geo.extents))
    align_warps = max(1, warp_multiple(hw) // par.warp_size)
    progs: list[RProgram] = []
    for fam, inst in found:
        im, in_, ik = inst.shape
        for wm in (im * f for f in fam.tile_multiples):
            for wn in (in_ * f for f in fam.tile_multiples):
                warp = _tile(names, roles, wm, wn, ik)
                regs = matrix_registers_per_thread(geo, warp, inst.shape, par.warp_size)
                for wy in fam.warp_counts:
                    for wx in fam.warp_counts:
                        warps = wy * wx
                        threads = warps * par.warp_size
                        if threads > par.max_threads_per_block or regs > register_cap(threads, hw):
                            continue
                        bm, bn = wm * wy, wn * wx
                        if not (_fits(bm, ext[roles.m], im) and _fits(bn, ext[roles.n], in_)):
                            continue
                        for bk in (ik * f for f in fam.k_multiples):
                            if not _fits(bk, ext[roles.k], ik):
                                continue
                            block = _tile(names, roles, bm, bn, bk)
                            pads = _padding(expr, geo, fam, block, smem_layer)
                            smem = geo.footprint(block, pads) + scratch_bytes(fam, inst.shape, warps)
                            if smem > cap:
                                continue
                            prog = _program(expr, geo, hw, MatrixChoice(fam.name, inst.name, inst.shape), warp,
                                            block, pads, threads, smem, regs, block_level, thread_level)
                            if prog is not None:
                                progs.append(prog)
    # Rule 2.2a (threads a multiple of warp size x schedulers) where any aligned program exists.
    aligned = [p for p in progs if (p.block // par.warp_size) % align_warps == 0]
    pool = aligned or progs
    # One warp tiling per block tile: the one whose fragments move least between shared memory and
    # registers (the inner level's reuse), then the fewest threads. Without this, ties on a global-bound
    # prediction fall to the smallest warp tiles, which reload each fragment for every product.
    best: dict[tuple, RProgram] = {}
    for p in pool:
        shape = p.key() if every_tiling else p.block_tile.shape
        cur = best.get(shape)
        if cur is None or _inner_rank(p) < _inner_rank(cur):
            best[shape] = p
    ranked = sorted(best.values(), key=lambda p: (p.prediction.time_s, p.key()))  # type: ignore[union-attr]
    return ranked[:want]


def _inner_rank(p: RProgram) -> tuple[float, float, int]:
    pred = p.prediction
    assert pred is not None
    inner = dict(pred.layer_times_s).get(p.layers[p.thread_level], 0.0)
    return (pred.time_s, inner, p.block)


def _fits(size: int, extent: int, unit: int) -> bool:
    """A block size is useful when it does not exceed the extent rounded up to the instruction, within rule
    2.2d at the largest epsilon (the model charges the padded work, so ranking settles the rest)."""
    return size <= -(-extent // unit) * unit and padding_ok(size, extent, EPSILONS[-1])


def _tile(names: tuple[str, ...], roles: GemmRoles, m: int, n: int, k: int) -> tuple[int, ...]:
    t = dict.fromkeys(names, 1)
    t[roles.m], t[roles.n], t[roles.k] = m, n, k
    return tuple(t[a] for a in names)


def _padding(expr: TensorExpr, geo: TileGeometry, fam: Family, block: tuple[int, ...],
             layer: MemoryLayer) -> dict[str, int]:
    """Storage padding of each input's staged rows: whole fragment-load pieces where the family reads rows in
    pieces, the bank rule (2.2c) otherwise."""
    pads: dict[str, int] = {}
    for t in geo.inputs:
        if fam.row_bytes:
            p = row_padding(_inner_extent(expr, t.name, block, geo.axis_names), t.itemsize, fam.row_bytes)
        else:
            box = geo.box(t, block)
            p = storage_padding(box[-1], t.itemsize, layer) if len(box) > 1 else 0
        if p:
            pads[t.name] = p
    return pads


def _inner_extent(expr: TensorExpr, tensor: str, block: tuple[int, ...], names: tuple[str, ...]) -> int:
    """The staged row length of ``tensor``: the block extent of the axis indexing its innermost dimension
    (not clipped to the tensor: the kernel stages whole tiles, and fragment rows need the unclipped stride)."""
    idx = expr.accesses(tensor)[0]
    axis = idx[-1].plain_axis()
    return block[names.index(axis)] if axis is not None else 1


def _program(expr: TensorExpr, geo: TileGeometry, hw: HardwareDesc, choice: MatrixChoice, warp: tuple[int, ...],
             block: tuple[int, ...], pads: dict[str, int], threads: int, smem: int, regs: int, block_level: int,
             thread_level: int) -> RProgram | None:
    n = len(hw.memory) - 1
    shapes = tuple(block if i <= block_level else warp for i in range(n))
    tiles = tuple(RTile(s, tuple(sorted(pads.items())) if i == block_level else ()) for i, s in enumerate(shapes))
    grid = geo.num_tiles(block)
    res = resources(geo, hw, shapes, block_level, thread_level, threads, pads, registers=regs, smem_bytes=smem)
    if res.blocks_per_unit < 1:
        return None
    dtype = expr.inputs[0].dtype
    pred = predict(geo, hw, shapes, block_level, thread_level, grid, threads, res, use_matrix=True, dtype=dtype)
    waste = geo.padding_waste(block)
    eps = next((e for e in EPSILONS if waste <= e + 1e-9), EPSILONS[-1])
    return RProgram(expr=expr, hw_name=hw.name, hw_hash=hw.content_hash()[:16],
                    layers=tuple(m.name for m in hw.memory), scopes=tuple(m.scope for m in hw.memory),
                    tiles=tiles, grid=grid, block=threads, block_level=block_level, thread_level=thread_level,
                    epsilon=eps, padding_waste=waste, matrix=choice, prediction=pred)


def lanes_tile(prog: RProgram) -> int:
    """Threads that share one register-level tile: a warp on the matrix path, one thread otherwise."""
    if not prog.use_matrix:
        return 1
    return max(1, prog.block // max(1, math.prod(prog.threads_per_axis())))
