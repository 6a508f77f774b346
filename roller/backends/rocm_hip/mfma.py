"""Matrix cores (MFMA) for float16 GEMM-shaped programs on CDNA (MI100 and newer).

A program with ``use_matrix`` has the matrix path's tile convention (the same as ``roller/construct``'s
warp-level path): its register-level tile is one *wavefront's* tile, ``(wave_m, wave_n, k)`` on the m, n and
reduction axes, a multiple of the instruction's m x n; its block is ``waves x wavefront`` threads; its
reduction step is a multiple of the instruction's k. Inputs are staged into LDS by the shared plan's loops;
each wavefront then issues one MFMA per (m, n) instruction tile and k-step, with float32 accumulators.

Per-lane operand layout (AMD's matrix instruction calculator, CDNA1-3; both shapes are "one block"):
  ``v_mfma_f32_32x32x8f16``: lane l holds A[l % 32][4 (l / 32) + 0..3] and B[4 (l / 32) + 0..3][l % 32];
  result element v (0..15) of lane l is D[8 (v / 4) + 4 (l / 32) + v % 4][l % 32].
  ``v_mfma_f32_16x16x16f16``: lane l holds A[l % 16][4 (l / 16) + 0..3] and B[4 (l / 16) + 0..3][l % 16];
  result element v (0..3) of lane l is D[4 (l / 16) + v][l % 16].
In general, with G = wavefront / m lane groups: A[l % m][(k / G)(l / m) + q], and D row
(v / 4)(4 G) + 4 (l / m) + v % 4. These layouts are compile-checked only: no AMD GPU ran them here.

Construction (``roller.construct``) builds matrix programs for the ``wmma`` family only; ``programs`` below
builds MFMA-aligned ones for AMD descriptions until it covers this family too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from roller.construct.align import EPSILONS, padding_ok, storage_padding, warp_multiple
from roller.construct.rtile import Prediction, RProgram, RTile
from roller.errors import InputError
from roller.hw import HardwareDesc, MatrixInstruction, MemoryLayer
from roller.ir.expr import BinOp, Read
from roller.ir.tensor_expr import TensorExpr
from roller.model.micro import REGISTER_OVERHEAD, Resources, predict
from roller.model.traffic import TileGeometry

if TYPE_CHECKING:
    from roller.backends.c_family.plan import KernelPlan

FAMILY = "mfma"
#: MFMA executes across a whole 64-lane wavefront; a description with another width gets no MFMA programs
WAVEFRONT = 64
# (input dtype, m, n, k) -> clang builtin; the per-lane operand is 4 elements, the result m*n/64 floats.
BUILTINS = {
    ("float16", 32, 32, 8): "__builtin_amdgcn_mfma_f32_32x32x8f16",
    ("float16", 16, 16, 16): "__builtin_amdgcn_mfma_f32_16x16x16f16",
}
OPERAND_ELEMS = 4
# Search space of ``programs``: instruction tiles per wavefront side, wavefronts per block side, k-steps.
TILE_MULTIPLES = (1, 2, 4)
WAVE_COUNTS = (1, 2, 4)
K_MULTIPLES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Roles:
    """Which axes and inputs play which part of C[batch.., m, n] += A[.., m, k] * B[.., k, n]."""

    batch: tuple[str, ...]
    m: str
    n: str
    k: str
    a: str
    b: str


@dataclass(frozen=True)
class Operand:
    """Where a wavefront reads an input's fragments in LDS: element strides along its two GEMM axes."""

    smem: str
    ctype: str
    stride_row: int  # along m (A) or n (B)
    stride_k: int


@dataclass(frozen=True)
class MfmaPlan:
    instruction: MatrixInstruction
    builtin: str
    wave: int  # lanes per wavefront (from the description)
    im: int
    in_: int
    ik: int
    groups: int  # lane groups sharing a row of A: wave / m
    k_per_group: int  # k elements per lane group: ik / groups
    acc_per_tile: int  # result elements per lane of one instruction tile
    wave_m: int
    wave_n: int
    m_tiles: int  # instruction tiles per wavefront along m
    n_tiles: int
    block_k: int
    roles: Roles
    a: Operand
    b: Operand
    others: tuple[str, ...]  # spatial axes besides m and n (batch): block tile 1, local coordinate 0

    @property
    def tiles(self) -> int:
        return self.m_tiles * self.n_tiles

    @property
    def acc_type(self) -> str:
        return f"rl_float{self.acc_per_tile}"


def roles(expr: TensorExpr) -> Roles | None:
    """GEMM roles of a plain product-sum over one reduction axis with single-axis indices, else None."""
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
    m, n = str(out[-2]), str(out[-1])
    batch = tuple(str(a) for a in out[:-2])
    axes: dict[str, list[str | None]] = {}
    for r in (body.lhs, body.rhs):
        if len(expr.accesses(r.tensor)) != 1:
            return None
        axes[r.tensor] = [i.plain_axis() for i in r.index]
        if any(a is None for a in axes[r.tensor]):
            return None
    a_name = next((t for t, ax in axes.items() if m in ax and k in ax and n not in ax), None)
    b_name = next((t for t, ax in axes.items() if n in ax and k in ax and m not in ax), None)
    if a_name is None or b_name is None:
        return None
    for t in (a_name, b_name):
        if sorted(a for a in axes[t] if a not in batch) != sorted([m if t == a_name else n, k]) or \
                len(axes[t]) != len(batch) + 2:
            return None
    return Roles(batch, m, n, k, a_name, b_name)


def instructions(hw: HardwareDesc, dtype: str) -> list[MatrixInstruction]:
    """The description's MFMA instructions for ``dtype`` that the backend can emit, largest m first."""
    if hw.parallelism.warp_size != WAVEFRONT:
        return []
    found = [mi for mi in hw.matrix_instructions_for(dtype)
             if mi.name.startswith(FAMILY) and mi.accumulator_dtype == "float32"
             and (dtype, *mi.shape) in BUILTINS]
    return sorted(found, key=lambda mi: -mi.shape[0])


def applies(expr: TensorExpr, hw: HardwareDesc) -> tuple[Roles, list[MatrixInstruction]] | None:
    if not expr.inputs or any(t.dtype != expr.inputs[0].dtype for t in expr.inputs) or expr.acc_dtype != "float32":
        return None
    r = roles(expr)
    insts = instructions(hw, expr.inputs[0].dtype)
    return (r, insts) if r is not None and insts else None


def plan_for(prog: RProgram, hw: HardwareDesc, plan: KernelPlan) -> MfmaPlan | None:
    """The MFMA layout of a ``use_matrix`` program (None for other programs). A matrix program that MFMA
    cannot compute is refused: its register-level tile is a wavefront's, which the scalar kernel would
    misread as one thread's."""
    if not prog.use_matrix:
        return None
    expr = prog.expr
    found = applies(expr, hw)
    if found is None or not plan.staged:
        raise InputError(f"{expr.name}: a matrix program for {hw.name}, but no MFMA instruction of the HIP backend "
                         f"applies (float16 GEMM-shaped ops on a 64-wide wavefront with "
                         f"{', '.join(f'{m}x{n}x{k}' for _, m, n, k in BUILTINS)})", field="use_matrix")
    r, insts = found
    names = [a.name for a in expr.axes]
    block = dict(zip(names, prog.block_tile.shape))
    wave_tile = dict(zip(names, prog.thread_tile.shape))
    others = tuple(a.name for a in expr.spatial_axes if a.name not in (r.m, r.n))
    for inst in insts:
        im, in_, ik = inst.shape
        if wave_tile[r.m] % im or wave_tile[r.n] % in_ or block[r.k] % ik or any(block[o] != 1 for o in others):
            continue
        waves = (block[r.m] // wave_tile[r.m]) * (block[r.n] // wave_tile[r.n])
        if waves * hw.parallelism.warp_size != prog.block:
            continue
        groups = hw.parallelism.warp_size // im
        return MfmaPlan(inst, BUILTINS[(expr.inputs[0].dtype, im, in_, ik)], hw.parallelism.warp_size, im, in_, ik,
                        groups, ik // groups, im * in_ // hw.parallelism.warp_size, wave_tile[r.m],
                        wave_tile[r.n], wave_tile[r.m] // im, wave_tile[r.n] // in_, block[r.k], r,
                        _operand(expr, plan, r.a, r.m, r.k), _operand(expr, plan, r.b, r.n, r.k), others)
    raise InputError(f"{expr.name}: matrix program {prog.line()} is not aligned to an MFMA instruction of "
                     f"{hw.name} ({', '.join(mi.name for mi in insts)})", field="use_matrix")


def _operand(expr: TensorExpr, plan: KernelPlan, tensor: str, row_axis: str, k_axis: str) -> Operand:
    tp = next(t for t in plan.inputs if t.name == tensor)
    idx = expr.accesses(tensor)[0]
    dims = {i.plain_axis(): d for d, i in enumerate(idx)}
    return Operand(tp.smem, tp.ctype, tp.smem_strides[dims[row_axis]], tp.smem_strides[dims[k_axis]])


# -- construction of MFMA-aligned programs -------------------------------------------------------------------------

def registers(wave_m: int, wave_n: int, im: int, in_: int, lanes: int) -> int:
    """32-bit registers per lane: the accumulators of the wavefront's tile, one k-step of operands (4 halves in
    2 registers per instruction tile side), and the scalar path's overhead for indices."""
    acc = wave_m * wave_n // lanes
    operands = (wave_m // im + wave_n // in_) * OPERAND_ELEMS // 2
    return acc + operands + REGISTER_OVERHEAD


def programs(expr: TensorExpr, hw: HardwareDesc, want: int = 10) -> list[RProgram]:
    """The ``want`` best-predicted MFMA programs of a prepared ``expr`` on ``hw`` (empty when MFMA does not
    apply): wavefront tiles of 1-4 instruction tiles a side, 1-4 wavefronts a side, k-steps of 1-8
    instructions; blocks within the LDS and register limits; ranked by the micro-model at the matrix peak."""
    from roller.backends.rocm_hip import register_cap
    from roller.construct import levels

    found = applies(expr, hw)
    block_level, thread_level = levels(hw)
    if found is None or hw.memory[block_level + 1].scope != "block":
        return []
    r, insts = found
    geo = TileGeometry(expr)
    names = geo.axis_names
    ext = dict(zip(names, geo.extents))
    par = hw.parallelism
    lds = hw.memory[block_level + 1]
    cap = lds.capacity_per_block_bytes or 0
    align_waves = max(1, warp_multiple(hw) // par.warp_size)
    progs: dict[tuple, RProgram] = {}
    for inst in insts:
        im, in_, ik = inst.shape
        for wm in (im * f for f in TILE_MULTIPLES):
            for wn in (in_ * f for f in TILE_MULTIPLES):
                regs = registers(wm, wn, im, in_, par.warp_size)
                for wy in WAVE_COUNTS:
                    for wx in WAVE_COUNTS:
                        threads = wy * wx * par.warp_size
                        if threads > par.max_threads_per_block or regs > register_cap(threads, hw):
                            continue
                        bm, bn = wm * wy, wn * wx
                        if not (_fits(bm, ext[r.m], im) and _fits(bn, ext[r.n], in_)):
                            continue
                        for bk in (ik * f for f in K_MULTIPLES):
                            if not _fits(bk, ext[r.k], ik):
                                continue
                            block = _tile(names, r, 1, bm, bn, bk)
                            pads = _padding(expr, geo, block, lds)
                            smem = geo.footprint(block, pads)
                            if smem > cap:
                                continue
                            p = _program(expr, geo, hw, _tile(names, r, 1, wm, wn, ik), block, pads, threads,
                                         smem, regs, block_level, thread_level)
                            if p is not None:
                                progs.setdefault(p.key(), p)
    pool = [p for p in progs.values() if (p.block // par.warp_size) % align_waves == 0] or list(progs.values())
    return sorted(pool, key=_rank)[:want]


def _rank(p: RProgram) -> tuple:
    """Predicted time; on ties (a global-bound prediction), the least LDS-to-register traffic (larger
    wavefront tiles reload fewer fragments), then fewer threads."""
    pred = p.prediction
    assert pred is not None
    inner = dict(pred.layer_times_s).get(p.layers[p.thread_level], 0.0)
    return (pred.time_s, inner, p.block, p.key())


def _fits(size: int, extent: int, unit: int) -> bool:
    return size <= -(-extent // unit) * unit and padding_ok(size, extent, EPSILONS[-1])


def _tile(names: tuple[str, ...], r: Roles, batch: int, m: int, n: int, k: int) -> tuple[int, ...]:
    t = dict.fromkeys(names, batch)
    t[r.m], t[r.n], t[r.k] = m, n, k
    return tuple(t[a] for a in names)


def _padding(expr: TensorExpr, geo: TileGeometry, block: tuple[int, ...], lds: MemoryLayer) -> dict[str, int]:
    """Construction's bank rule (2.2c) on each input's staged row."""
    pads = {}
    for t in geo.inputs:
        box = geo.box(t, block)
        if len(box) > 1:
            p = storage_padding(box[-1], t.itemsize, lds)
            if p:
                pads[t.name] = p
    return pads


def _program(expr: TensorExpr, geo: TileGeometry, hw: HardwareDesc, wave: tuple[int, ...], block: tuple[int, ...],
             pads: dict[str, int], threads: int, smem: int, regs: int, block_level: int,
             thread_level: int) -> RProgram | None:
    par = hw.parallelism
    lds = hw.memory[block_level + 1]
    limits = [par.max_blocks_per_unit, par.max_threads_per_unit // threads,
              par.registers_per_unit // max(1, regs * threads)]
    if smem and lds.capacity_per_unit_bytes:
        limits.append(lds.capacity_per_unit_bytes // smem)
    res = Resources(smem, regs, max(0, min(limits)))
    if res.blocks_per_unit < 1:
        return None
    shapes = tuple(block if i <= block_level else wave for i in range(len(hw.memory) - 1))
    tiles = tuple(RTile(s, tuple(sorted(pads.items())) if i == block_level else ()) for i, s in enumerate(shapes))
    grid = geo.num_tiles(block)
    pred: Prediction = predict(geo, hw, shapes, block_level, thread_level, grid, threads, res, use_matrix=True,
                               dtype=expr.inputs[0].dtype)
    waste = geo.padding_waste(block)
    eps = next((e for e in EPSILONS if waste <= e + 1e-9), EPSILONS[-1])
    return RProgram(expr=expr, hw_name=hw.name, hw_hash=hw.content_hash()[:16],
                    layers=tuple(m.name for m in hw.memory), scopes=tuple(m.scope for m in hw.memory),
                    tiles=tiles, grid=grid, block=threads, block_level=block_level, thread_level=thread_level,
                    epsilon=eps, padding_waste=waste, use_matrix=True, prediction=pred)

