"""Matrix cores (MFMA) for float16 GEMM-shaped programs on CDNA (MI100 and newer).

A program with ``use_matrix`` has the matrix path's tile convention (the same as ``roller/construction``'s
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

Construction (``roller.construction.matrix``, family ``mfma``) chooses the instruction and the tiles; this
module only lays the chosen program out for the template.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from roller.construction.matrix import GemmRoles, gemm_roles
from roller.errors import InputError
from roller.hw import HardwareDesc, MatrixInstruction
from roller.ir.tensor_expr import TensorExpr
from roller.program import RProgram

if TYPE_CHECKING:
    from roller.backends.c_family.plan import KernelPlan

# (input dtype, m, n, k) -> clang builtin; the per-lane operand is 4 elements, the result m*n/64 floats.
# These are the instructions the backend renders (its matrix_support).
#: MFMA executes across a whole 64-lane wavefront
WAVEFRONT = 64
BUILTINS = {
    ("float16", 32, 32, 8): "__builtin_amdgcn_mfma_f32_32x32x8f16",
    ("float16", 16, 16, 16): "__builtin_amdgcn_mfma_f32_16x16x16f16",
}


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
    roles: GemmRoles
    a: Operand
    b: Operand
    others: tuple[str, ...]  # spatial axes besides m and n (batch): block tile 1, local coordinate 0

    @property
    def tiles(self) -> int:
        return self.m_tiles * self.n_tiles

    @property
    def acc_type(self) -> str:
        return f"rl_float{self.acc_per_tile}"


def plan_for(prog: RProgram, hw: HardwareDesc, plan: KernelPlan) -> MfmaPlan | None:
    """The MFMA layout of the instruction construction chose for ``prog`` (None for scalar programs). A
    matrix program this backend cannot compute is refused: its register-level tile is a wavefront's, which
    the scalar kernel would misread as one thread's."""
    choice = prog.matrix
    if choice is None:
        return None
    expr = prog.expr
    r = gemm_roles(expr)
    dtype = expr.inputs[0].dtype
    builtin = BUILTINS.get((dtype, *choice.shape))
    inst = next((mi for mi in hw.matrix_instructions if mi.name == choice.name), None)
    if choice.family != "mfma" or builtin is None or inst is None or r is None or not plan.staged \
            or hw.parallelism.warp_size != WAVEFRONT:
        raise InputError(f"{expr.name}: matrix program {prog.line()} uses {choice.family} {choice.name}, which the "
                         f"HIP backend does not render on {hw.name} (it renders float16 GEMM-shaped ops on a "
                         f"64-wide wavefront with {', '.join(f'{m}x{n}x{k}' for _, m, n, k in BUILTINS)})",
                         field="matrix")
    im, in_, ik = choice.shape
    names = [a.name for a in expr.axes]
    block = dict(zip(names, prog.block_tile.shape))
    wave_tile = dict(zip(names, prog.thread_tile.shape))
    others = tuple(a.name for a in expr.spatial_axes if a.name not in (r.m, r.n))
    waves = (block[r.m] // max(1, wave_tile[r.m])) * (block[r.n] // max(1, wave_tile[r.n]))
    if wave_tile[r.m] % im or wave_tile[r.n] % in_ or block[r.k] % ik or any(block[o] != 1 for o in others) \
            or waves * WAVEFRONT != prog.block:
        raise InputError(f"{expr.name}: matrix program {prog.line()} is not aligned to {choice.name} "
                         f"{im}x{in_}x{ik}", field="tiles")
    groups = WAVEFRONT // im
    return MfmaPlan(inst, builtin, WAVEFRONT, im, in_, ik, groups, ik // groups, im * in_ // WAVEFRONT,
                    wave_tile[r.m], wave_tile[r.n], wave_tile[r.m] // im, wave_tile[r.n] // in_, block[r.k], r,
                    _operand(expr, plan, r.a, r.m, r.k), _operand(expr, plan, r.b, r.n, r.k), others)


def _operand(expr: TensorExpr, plan: KernelPlan, tensor: str, row_axis: str, k_axis: str) -> Operand:
    tp = next(t for t in plan.inputs if t.name == tensor)
    idx = expr.accesses(tensor)[0]
    dims = {i.plain_axis(): d for d, i in enumerate(idx)}
    return Operand(tp.smem, tp.ctype, tp.smem_strides[dims[row_axis]], tp.smem_strides[dims[k_axis]])
