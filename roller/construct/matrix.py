"""rPrograms for matrix instructions (tensor cores): GEMM-shaped contractions tiled for warp-level fragments.

A float16 (or bfloat16) matmul, batch matmul or implicit-GEMM convolution, on a description that lists a
warp-level fragment instruction (the ``wmma`` family: a whole warp computes an m x n x k product with float32
accumulators), gets programs whose register-level tile is one *warp's* tile: a multiple of the instruction's
m and n (paper rule 2.2a applied to the instruction shape), and whose reduction step is a multiple of its k.
The block tile is a grid of warp tiles; threads per block = warps x warp size.

The aligned space is small (warp tiles up to 8 fragments a side, up to 16 warps, three reduction steps), so
every aligned tile that fits the description's limits is scored by the micro-model with the matrix peak and
the best ``want`` are kept; the scalar construction's candidates compete with them in the final ranking.

Other matrix families (AMD's wavefront-64 MFMA) are not constructed here: their operand layout per lane
differs, and a backend would need its own fragment path.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from roller.construct.align import EPSILONS, padding_ok, warp_multiple
from roller.construct.rtile import RProgram, RTile
from roller.hw import HardwareDesc, MatrixInstruction
from roller.ir.expr import BinOp, Read
from roller.ir.tensor_expr import TensorExpr
from roller.model.micro import matrix_registers_per_thread, predict, resources
from roller.model.traffic import TileGeometry

FAMILY = "wmma"
FRAGMENT_MULTIPLES = (1, 2, 4, 8)
WARP_COUNTS = (1, 2, 4, 8, 16)
K_MULTIPLES = (1, 2, 4)
# Fragment loads read rows in 16-byte pieces and need rows 16-byte aligned.
ROW_BYTES = 16


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
    if expr.reduce_op != "sum" or expr.pad_value != 0 or len(expr.reduce_axes) != 1 or len(expr.inputs) != 2:
        return None
    body = expr.body
    if not (isinstance(body, BinOp) and body.op == "*" and isinstance(body.lhs, Read)
            and isinstance(body.rhs, Read) and body.lhs.tensor != body.rhs.tensor):
        return None
    k = expr.reduce_axes[0].name
    out = [i.plain_axis() for i in expr.out_index]
    if len(out) < 2 or any(a is None for a in out):
        return None
    m, n = out[-2], out[-1]
    batch = tuple(a for a in out[:-2] if a is not None)
    axes: dict[str, list[str]] = {}
    for r in (body.lhs, body.rhs):
        names = [i.plain_axis() for i in r.index]
        if any(a is None for a in names) or len(expr.accesses(r.tensor)) != 1:
            return None
        axes[r.tensor] = [a for a in names if a is not None]
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


def instruction(hw: HardwareDesc, dtype: str) -> MatrixInstruction | None:
    """The warp-level instruction used for ``dtype``: the square 16x16x16 shape when listed (every NVIDIA
    part since Volta has it), else the first of the family. Backends call this too, so both agree."""
    found = [mi for mi in hw.matrix_instructions_for(dtype) if mi.name.startswith(FAMILY)]
    if not found:
        return None
    return next((mi for mi in found if tuple(mi.shape) == (16, 16, 16)), found[0])


def applies(expr: TensorExpr, hw: HardwareDesc) -> tuple[GemmRoles, MatrixInstruction] | None:
    """(roles, instruction) when ``expr`` gets matrix programs on ``hw``."""
    if not expr.inputs or any(t.dtype != expr.inputs[0].dtype for t in expr.inputs):
        return None
    if expr.acc_dtype != "float32":
        return None
    inst = instruction(hw, expr.inputs[0].dtype)
    roles = gemm_roles(expr)
    if inst is None or roles is None or inst.accumulator_dtype != "float32":
        return None
    return roles, inst


def row_padding(inner: int, itemsize: int) -> int:
    """Rule 2.2c for fragment loads: pad a staged row to whole 16-byte pieces, an odd number of them, so that
    the rows one load phase reads start in different bank groups."""
    unit = max(1, ROW_BYTES // itemsize)
    if inner <= 1:
        return 0
    pad = (-inner) % unit
    if ((inner + pad) // unit) % 2 == 0:
        pad += unit
    return pad


def scratch_bytes(inst: MatrixInstruction, warps: int) -> int:
    """Shared memory of the epilogue: one float32 accumulator fragment per warp, written out through it."""
    return warps * inst.shape[0] * inst.shape[1] * 4


def matrix_programs(expr: TensorExpr, geo: TileGeometry, hw: HardwareDesc, block_level: int, thread_level: int,
                    want: int) -> list[RProgram]:
    """The ``want`` best-predicted matrix programs of ``expr`` on ``hw`` (none when the path does not apply)."""
    found = applies(expr, hw)
    if found is None or hw.memory[block_level + 1].scope != "block":
        return []
    roles, inst = found
    im, in_, ik = inst.shape
    par = hw.parallelism
    smem_layer = hw.memory[block_level + 1]
    cap = smem_layer.capacity_per_block_bytes or 0
    names = geo.axis_names
    pos = {a: i for i, a in enumerate(names)}
    ext = dict(zip(names, geo.extents))
    align_warps = max(1, warp_multiple(hw) // par.warp_size)
    progs: list[RProgram] = []
    for wm in (im * f for f in FRAGMENT_MULTIPLES):
        for wn in (in_ * f for f in FRAGMENT_MULTIPLES):
            warp = _tile(names, roles, pos, 1, wm, wn, ik)
            regs = matrix_registers_per_thread(geo, warp, inst.shape, par.warp_size)
            if regs > par.max_registers_per_thread:
                continue
            for wy in WARP_COUNTS:
                for wx in WARP_COUNTS:
                    warps = wy * wx
                    threads = warps * par.warp_size
                    if threads > par.max_threads_per_block or regs * threads > par.registers_per_unit:
                        continue
                    bm, bn = wm * wy, wn * wx
                    if not (_fits(bm, ext[roles.m], im) and _fits(bn, ext[roles.n], in_)):
                        continue
                    for bk in (ik * f for f in K_MULTIPLES):
                        if not _fits(bk, ext[roles.k], ik):
                            continue
                        block = _tile(names, roles, pos, 1, bm, bn, bk)
                        pads = {t.name: row_padding(_inner_extent(expr, t.name, block, names), t.itemsize)
                                for t in expr.inputs}
                        pads = {k: v for k, v in pads.items() if v}
                        smem = geo.footprint(block, pads) + scratch_bytes(inst, warps)
                        if smem > cap:
                            continue
                        prog = _program(expr, geo, hw, warp, block, pads, threads, smem, regs, block_level,
                                        thread_level, aligned=warps % align_warps == 0)
                        if prog is not None:
                            progs.append(prog)
    # Rule 2.2a (threads a multiple of warp size x schedulers) where any aligned program exists.
    aligned = [p for p in progs if (p.block // par.warp_size) % align_warps == 0]
    pool = aligned or progs
    # One warp tiling per block tile: the one whose fragments move least between shared memory and
    # registers (the inner level's reuse), then the fewest threads. Without this, ties on a global-bound
    # prediction fall to the smallest warp tiles, which reload each fragment for every product.
    best: dict[tuple[int, ...], RProgram] = {}
    for p in pool:
        cur = best.get(p.block_tile.shape)
        if cur is None or _inner_rank(p) < _inner_rank(cur):
            best[p.block_tile.shape] = p
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


def _tile(names: tuple[str, ...], roles: GemmRoles, pos: dict[str, int], batch: int, m: int, n: int,
          k: int) -> tuple[int, ...]:
    t = [1] * len(names)
    for a in roles.batch:
        t[pos[a]] = batch
    t[pos[roles.m]], t[pos[roles.n]], t[pos[roles.k]] = m, n, k
    return tuple(t)


def _inner_extent(expr: TensorExpr, tensor: str, block: tuple[int, ...], names: tuple[str, ...]) -> int:
    """The staged row length of ``tensor``: the block extent of the axis indexing its innermost dimension
    (not clipped to the tensor: the kernel stages whole tiles, and fragment rows need the unclipped stride)."""
    idx = expr.accesses(tensor)[0]
    axis = idx[-1].plain_axis()
    return block[names.index(axis)] if axis is not None else 1


def _program(expr: TensorExpr, geo: TileGeometry, hw: HardwareDesc, warp: tuple[int, ...],
             block: tuple[int, ...], pads: dict[str, int], threads: int, smem: int, regs: int, block_level: int,
             thread_level: int, aligned: bool) -> RProgram | None:
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
                    epsilon=eps, padding_waste=waste, use_matrix=True, prediction=pred)


def lanes_tile(prog: RProgram) -> int:
    """Threads that share one register-level tile: a warp on the matrix path, one thread otherwise."""
    if not prog.use_matrix:
        return 1
    return max(1, prog.block // max(1, math.prod(prog.threads_per_axis())))
