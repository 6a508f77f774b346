"""The wmma side of a kernel plan: which staged buffer feeds which fragment, in which layout and stride.

The shared plan (roller/backends/c_family/plan/lowering.py) already stages each input's block tile into shared memory
in the tensor's own dimension order; a GEMM operand tile is then either [m][k] or [k][m] (A) and [k][n] or
[n][k] (B), with a leading dimension that construction padded to whole 16-byte rows
(roller/construction/matrix.py). This module reads those facts off the plan so the template only spells them.
"""
from __future__ import annotations

from dataclasses import dataclass

from roller.backends.c_family.plan import KernelPlan, TensorPlan
from roller.construction.matrix import GemmRoles, gemm_roles
from roller.errors import InputError
from roller.hw import HardwareDesc
from roller.ir.tensor_expr import TensorExpr
from roller.program import RProgram

#: C++ element types of wmma fragments per dtype
FRAGMENT_TYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16"}
#: threads of a warp, which computes one fragment together
WARP = 32


@dataclass(frozen=True)
class MatrixPlan:
    m: int
    n: int
    k: int
    fm: int  # fragments along m per warp
    fn: int  # fragments along n per warp
    bk: int  # reduction step staged per iteration
    ctype: str
    a_smem: str
    b_smem: str
    a_layout: str  # row_major | col_major
    b_layout: str
    lda: int
    ldb: int
    a_offset: str  # C expression: element offset of fragment rl_i at reduction offset rl_kk
    b_offset: str
    m_axis: str
    n_axis: str
    warp_size: int
    warps: int
    scratch: str = "rl_sm_acc"

    @property
    def scratch_elems(self) -> int:
        return self.warps * self.m * self.n


def matrix_plan(prog: RProgram, plan: KernelPlan, hw: HardwareDesc) -> MatrixPlan | None:
    """The fragment plan of the instruction construction chose for ``prog`` (None for scalar programs)."""
    choice = prog.matrix
    if choice is None:
        return None
    roles = gemm_roles(prog.expr)
    dtype = prog.expr.inputs[0].dtype
    if choice.family != "wmma" or roles is None or dtype not in FRAGMENT_TYPES \
            or hw.parallelism.warp_size != WARP:
        raise InputError(f"{prog.expr.name}: the rProgram uses {choice.family} {choice.name}, which the CUDA "
                         f"backend does not render for this op on {hw.name} (it renders wmma fragments of "
                         "GEMM-shaped float16/bfloat16 ops on 32-thread warps)", field="matrix")
    m, n, k = choice.shape
    thread = prog.thread_tile.as_dict(prog.expr)
    block = prog.block_tile.as_dict(prog.expr)
    wm, wn = thread[roles.m], thread[roles.n]
    if wm % m or wn % n or block[roles.k] % k or thread[roles.k] != k:
        raise InputError(f"{prog.expr.name}: warp tile {wm}x{wn}x{thread[roles.k]} / step {block[roles.k]} is "
                         f"not aligned to {choice.name} {m}x{n}x{k}", field="tiles")
    tensors = {t.name: t for t in plan.inputs}
    a_layout, lda, a_offset = _operand(prog.expr, roles, tensors[roles.a], roles.m, m, "rl_i")
    b_layout, ldb, b_offset = _operand(prog.expr, roles, tensors[roles.b], roles.n, n, "rl_j")
    # matrix_b's "row_major" means k is its row index: the transpose of A's convention.
    b_layout = "col_major" if b_layout == "row_major" else "row_major"
    warps = prog.block // hw.parallelism.warp_size
    return MatrixPlan(m=m, n=n, k=k, fm=wm // m, fn=wn // n, bk=block[roles.k],
                      ctype=FRAGMENT_TYPES[prog.expr.inputs[0].dtype], a_smem=tensors[roles.a].smem,
                      b_smem=tensors[roles.b].smem, a_layout=a_layout, b_layout=b_layout, lda=lda, ldb=ldb,
                      a_offset=a_offset, b_offset=b_offset, m_axis=roles.m, n_axis=roles.n,
                      warp_size=hw.parallelism.warp_size, warps=warps)


def _operand(expr: TensorExpr, roles: GemmRoles, tp: TensorPlan, row_axis: str, frag: int,
             index: str) -> tuple[str, int, str]:
    """(layout, leading dimension, offset expression) of one operand's staged tile, with ``row_axis`` (m for
    A, n for B) as the fragment's row: 'row_major' when the reduction axis is the tile's innermost dimension."""
    idx = expr.accesses(tp.name)[0]
    names = [i.plain_axis() for i in idx]
    d_row, d_k = names.index(row_axis), names.index(roles.k)
    s_row, s_k = tp.smem_strides[d_row], tp.smem_strides[d_k]
    row = f"(rl_wo_{row_axis} + {index} * {frag})"
    itemsize = 2
    if s_k == 1:
        layout, ld, off = "row_major", s_row, f"{row} * {s_row} + rl_kk"
    elif s_row == 1:
        layout, ld, off = "col_major", s_k, f"rl_kk * {s_k} + {row}"
    else:
        raise InputError(f"{expr.name}: staged tile of {tp.name} has neither {row_axis} nor {roles.k} innermost",
                         field="tiles")
    if (ld * itemsize) % 16:
        raise InputError(f"{expr.name}: staged rows of {tp.name} are {ld} elements, not whole 16-byte pieces "
                         "(wmma needs them)", field="storage_padding")
    return layout, ld, off
