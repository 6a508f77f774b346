"""Row kernels (TensorExpr.stages: a softmax, a layer norm): each thread point is a row whose columns every
stage walks.

Their plan shares the axes, reads and C of the reduction kernels but not its shape (no staging, no register
tile of reduction steps: one walk per stage, then one that stores), so it is lowered apart from ``lower``.
The choices it prints, whether threads own contiguous runs, the column walks' vector width and the innermost
loop's unrolling, come from ``schedule.py``.
"""
from __future__ import annotations

import math

from roller.backends.c_family.plan.access import flat_coef, global_read, tensor_plan
from roller.backends.c_family.plan.axes import decode, runtime_axes
from roller.backends.c_family.plan.cexpr import affine_c, c_float, combine_stmt, render_body, var_global
from roller.backends.c_family.plan.schedule import blocked_threads, row_vector_width, unrolled
from roller.backends.c_family.plan.types import AxisPlan, Dialect, KernelPlan, RowVecPlan, StagePlan
from roller.backends.c_family.plan.vector import vector_read
from roller.ir.expr import Read
from roller.ir.tensor_expr import Axis
from roller.program import RProgram


def lower_rows(prog: RProgram, d: Dialect, kernel_name: str | None) -> KernelPlan:
    """The plan of a row kernel: the program's tiles over the row axes (``RProgram`` of its first stage as a
    reduction); each thread point is a row, whose columns every stage walks in nested loops, the last walk
    storing. Reads are straight from global memory: a row's columns stay in the thread's cache between walks.
    ``lower`` has checked the tensors' types against the dialect."""
    expr = prog.expr
    rows = set(expr.row_axes)
    b_tile, t_tile = prog.block_tile.shape, prog.thread_tile.shape
    spatial = [AxisPlan(a.name, a.extent, b_tile[i], t_tile[i], b_tile[i] // t_tile[i], -(-a.extent // b_tile[i]),
                        0, 0, 0) for i, a in enumerate(expr.axes) if a.name in rows]
    decode(spatial)
    runtime = dict(prog.runtime)
    runtime_axes(spatial, runtime)

    def col_extent(a: Axis) -> int | str:
        return f"rl_e_{a.name}" if a.name in runtime else a.extent

    # Rows are tested against their extents before any read, and columns run exactly their extents.
    exact = {a.name: a.extent - 1 for a in expr.axes}
    plans = []
    for t in expr.inputs:
        tp = tensor_plan(t, d)
        tp.ranges = exact
        plans.append(tp)
    by_name = {tp.name: tp for tp in plans}
    names = {st.name: f"rl_st_{st.name}" for st in expr.stages}

    def read(r: Read) -> str:
        if r.tensor in names:
            return names[r.tensor]
        return global_read(by_name[r.tensor], r.index, var_global, expr.pad_value, d)

    init = {"max": f"(-{d.infinity})", "min": d.infinity}
    stages = [StagePlan(names[st.name], init.get(st.reduce_op, c_float(0.0, d)), combine_stmt(st.reduce_op, d),
                        render_body(st.body, d, read)) for st in expr.stages]
    out = tensor_plan(expr.output, d)
    out.ranges = exact
    blocked = blocked_threads(prog)
    cols = [a for a in expr.axes if a.name not in rows]
    row_vec = None
    width = row_vector_width(expr, cols, d, blocked)
    if width:
        col = cols[0]
        vtype = f"{d.ctype[expr.acc_dtype]}{width}"

        def vread(r: Read) -> str:
            if r.tensor in names:
                return f"(({vtype})({names[r.tensor]}))"
            return vector_read(by_name[r.tensor], r.index, col.name, col.extent, width, vtype, expr.pad_value, d, {})

        contiguous = flat_coef(expr.out_index, out.strides, col.name) == 1
        offset = " + ".join(f"({affine_c(i, var_global)}) * {st}" if st != 1 else f"({affine_c(i, var_global)})"
                            for i, st in zip(expr.out_index, out.strides)) if contiguous else ""
        row_vec = RowVecPlan(width, vtype, col.name, col_extent(col),
                             [render_body(st.body, d, vread, vtype) for st in expr.stages],
                             [combine_stmt(st.reduce_op, d, True) for st in expr.stages],
                             render_body(expr.body, d, vread, vtype), offset)
    return KernelPlan(
        name=kernel_name or expr.name, grid=prog.grid, block=prog.block, acc_ctype=d.ctype[expr.acc_dtype],
        out_ctype=d.ctype[expr.output.dtype], out_vstore=d.vstore_format(d.ctype[expr.output.dtype]),
        spatial=spatial, reduce=[], inputs=plans, output=out, staged=False,
        n_rtiles=1, rstep_points=1, thread_points=math.prod(ax.thread for ax in spatial) if spatial else 1,
        reduce_op=None, acc_init=c_float(0.0, d), combine="", body=render_body(expr.body, d, read),
        out_index=[affine_c(i, var_global) for i in expr.out_index], pad_value=c_float(expr.pad_value, d),
        reduce_guard="", smem_bytes=0, params=[(t.name, d.ctype[t.dtype], False) for t in expr.inputs] +
        [(expr.output.name, d.ctype[expr.output.dtype], True)], blocked=blocked,
        reduce_loops=unrolled([(a.name, col_extent(a), 0) for a in cols]), stages=stages, row_vec=row_vec,
        runtime=list(prog.runtime), real=d.real)
