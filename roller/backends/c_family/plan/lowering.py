"""Lowering: an rProgram to the kernel plan every C-family kernel (OpenCL, CUDA, HIP) is printed from.

Kernel shape: one work-group/block per block tile, threads cyclically over the block tile (thread ``t`` of an
axis with ``n`` threads owns local coordinates t, t+n, ...: adjacent threads touch adjacent elements); every
reduction step stages each input's data tile (a bounding box in the tensor, or a gathered tile for views) into
shared memory with bounds guards and the pad value, then each thread accumulates its register tile.

``lower`` asks ``schedule.py`` for every decision (staging, the threads' runs and order, the loops' unrolling,
the vector path, streamed stores) and assembles the plan from what it was told: axis decodes, staged tiles,
reads and the body as C. Row kernels are lowered by ``rows.py``, the vector path printed by ``vector.py``.
"""
from __future__ import annotations

import math
from dataclasses import replace

from roller.backends.c_family.plan.access import element, global_read, tensor_plan
from roller.backends.c_family.plan.axes import decode, runtime_axes
from roller.backends.c_family.plan.cexpr import (
    INT32_MAX,
    affine_c,
    c_float,
    combine_stmt,
    index_types,
    reach,
    render_body,
    render_epilogue,
    row_major_strides,
    var_global,
)
from roller.backends.c_family.plan.rows import lower_rows
from roller.backends.c_family.plan.schedule import (
    Streaming,
    blocked_threads,
    hoist_divisor,
    read_axis,
    reduce_loops,
    stage_order,
    stage_width,
    staged_steps,
    unshared,
    vectorise,
    warp_order,
    window_inner,
)
from roller.backends.c_family.plan.typed import TypedC
from roller.backends.c_family.plan.types import AxisPlan, Dialect, DimPlan, KernelPlan, TensorPlan
from roller.backends.c_family.plan.vector import reduce_vec_plan, stream_plan, vec_plan
from roller.construction.shared_vector import runs
from roller.errors import InputError
from roller.ir.expr import Affine, Call, Gather, walk
from roller.ir.tensor_expr import TensorExpr
from roller.program import RProgram

#: the name a gathered read's run-time index goes by where its offset is printed (no axis can be called so)
GATHER_AXIS = "@gather"


def computes_float64(expr: TensorExpr) -> bool:
    """Whether a kernel computes in double: it holds a float64 tensor, or converts a value to float64."""
    return expr.acc_dtype == "float64" or any(t.dtype == "float64" for t in expr.tensors) or any(
        isinstance(n, Call) and n.fn == "float64" for e in (expr.body, expr.epilogue) if e is not None
        for n in walk(e))


def lower(prog: RProgram, d: Dialect, kernel_name: str | None = None, blocked: bool | None = None,
          streaming: Streaming | None = None) -> KernelPlan:
    """The kernel plan of ``prog``. With ``streaming``, an output that large stores its whole, aligned vectors
    with the dialect's streaming store (schedule.streamed).

    Reduction steps are staged into the block's layer where it is a scratchpad (schedule.staged_steps); where
    it is a cache, each thread owns a contiguous run of every axis (schedule.blocked_threads; ``blocked``
    decides instead where given)."""
    expr = prog.expr
    for t in expr.tensors:
        if t.dtype not in d.ctype:
            # Checked here for every C-family backend: a dtype without a type of its own must not be rendered as
            # another (OpenCL once ran bfloat16 as float32) nor end as a KeyError.
            raise InputError(f"{expr.name}: tensor {t.name} is {t.dtype}, which {d.language} has no type for here; "
                             f"use {' or '.join(d.ctype)}", field="dtype")
    if computes_float64(expr):
        d = d.for_float64()
    if expr.stages:
        return lower_rows(prog, d, kernel_name)
    expr = hoist_divisor(expr)
    b_tile, t_tile = prog.block_tile.shape, prog.thread_tile.shape
    name = kernel_name or expr.name
    staged = staged_steps(prog)
    if blocked is None:
        blocked = blocked_threads(prog)

    spatial: list[AxisPlan] = []
    reduce: list[AxisPlan] = []
    for i, a in enumerate(expr.axes):
        if a.reduce:
            reduce.append(AxisPlan(a.name, a.extent, b_tile[i], 1, 1, -(-a.extent // b_tile[i]), 0, 0, 0))
        else:
            spatial.append(AxisPlan(a.name, a.extent, b_tile[i], t_tile[i], b_tile[i] // t_tile[i],
                                    -(-a.extent // b_tile[i]), 0, 0, 0))
    decode(spatial)
    if staged and not blocked:
        run = runs(prog)
        for ax in spatial:
            ax.run = run.get(ax.name, 1)
    div_r = div_k = 1
    for ax in reversed(reduce):
        ax.bdiv, ax.tdiv = div_r, div_k
        div_r *= ax.blocks
        div_k *= ax.block
    runtime = dict(prog.runtime)
    runtime_axes(spatial, runtime)
    runtime_axes(reduce, runtime)

    block_shape = {a.name: b_tile[i] for i, a in enumerate(expr.axes)}
    # The largest value each axis variable takes: tiles run past an axis's end (those points are clamped or
    # guarded, never stored), and an unstaged reduction walks exactly its extent.
    ranges = {ax.name: ax.blocks * ax.block - 1 for ax in spatial}
    ranges.update({ax.name: (ax.blocks * ax.block if staged else ax.extent) - 1 for ax in reduce})
    for ax in spatial:
        if ax.blocks * ax.block > INT32_MAX:
            raise InputError(f"{expr.name}: axis {ax.name} runs to {ax.blocks * ax.block} with its tiles, more than "
                             "32-bit thread coordinates hold", field="shapes")
    pads = dict(prog.block_tile.storage_padding)
    acc_ctype = d.ctype[expr.acc_dtype]

    def var_local(ax: str) -> str:
        return f"rl_l_{ax}"

    def var_start(ax: str) -> str:
        return f"rl_s_{ax}"

    inputs: list[TensorPlan] = []
    read_exprs: dict[tuple[str, tuple[Affine, ...]], str] = {}
    smem_total = 0
    for t in expr.body_inputs:
        tp = tensor_plan(t, d)
        accs = expr.accesses(t.name)
        if staged:
            tp.smem = f"rl_sm_{t.name}"
            dims = []
            lows = []
            for dim in range(len(t.shape)):
                lo = min(idx[dim].span(block_shape)[0] for idx in accs)
                hi = max(idx[dim].span(block_shape)[1] for idx in accs)
                lows.append(lo)
                # The tile's first index: the affine map at the tile's start, shifted by the lowest offset.
                starts = Affine.of({a: c for a, c in accs[0][dim].terms})
                widest = max(accs, key=lambda idx: reach(idx[dim], ranges))[dim]
                itype, utype = index_types(widest, ranges, d)
                origin = affine_c(Affine(starts.terms, lo), var_start, "" if itype == "int" else itype)
                dims.append(DimPlan(hi - lo + 1, 0, origin, itype, utype))
            ext = [dp.extent for dp in dims]
            div = 1
            for i in stage_order(t, ext) if d.coalesce_gathers else reversed(range(len(dims))):
                dims[i].div = div
                div *= dims[i].extent
            fastest = next(dp for dp in dims if dp.div == 1) if dims else None
            if fastest is not None and prog.block % fastest.extent == 0:
                fastest.per_thread = True
            tp.dims = dims
            tp.tile_elems = math.prod(ext)
            tp.row_pad = pads.get(t.name, 0) if len(ext) > 1 else 0
            storage = ext[:-1] + [ext[-1] + tp.row_pad] if ext else []
            tp.smem_strides = row_major_strides(storage)
            tp.smem_elems = max(1, math.prod(storage))
            smem_total += tp.smem_elems * t.itemsize
            tp.stage_vec = stage_width(tp, accs, block_shape, lows[-1] if lows else 0, t.itemsize,
                                       expr.pad_value, d)
            if tp.stage_vec:
                vext = ext[:-1] + [ext[-1] // tp.stage_vec]
                tp.stage_divs = [math.prod(vext[i + 1:]) for i in range(len(vext))]
            for idx in accs:
                terms = []
                for dim, aff in enumerate(idx):
                    local = Affine(aff.terms, aff.const - lows[dim])
                    expr_c = affine_c(local, var_local)
                    if tp.smem_strides[dim] != 1:
                        expr_c = f"({expr_c}) * {tp.smem_strides[dim]}"
                    terms.append(expr_c)
                read_exprs[(t.name, idx)] = element(tp, f"{tp.smem}[{' + '.join(terms) or '0'}]", d)
        else:
            # Without staging, padded points of a partial block would read past a tensor's end through a
            # plain spatial index: clamp those (their results are never stored), guard the rest.
            clamp = {a.name: a.extent for a in expr.spatial_axes} if expr.reduce_axes else {}
            tp.ranges = ranges
            for idx in accs:
                read_exprs[(t.name, idx)] = global_read(tp, idx, var_global, expr.pad_value, d, clamp)
        inputs.append(tp)

    # An axis's value: its global coordinate (tile start + local coordinate in a staged kernel).
    real = d.real
    axis_c = (lambda a: f"(({real})(rl_s_{a} + rl_l_{a}))") if staged else (lambda a: f"(({real}){var_global(a)})")
    typed = None
    if expr.typed:
        plans = {tp.name: tp for tp in inputs}

        def gathered(g: Gather, index_c: str) -> str:
            # The run-time index stands for the placeholder as the value of an axis of its own, which ranges
            # over the dimension (it is clamped into it): never guarded, and its offset typed wide enough.
            assert not staged, "gathered reads are elementwise, and elementwise ops are not staged"
            tp = plans[g.source.tensor]
            at = list(g.source.index)
            at[g.dim] = Affine.axis(GATHER_AXIS)
            wide = replace(tp, ranges={**tp.ranges, GATHER_AXIS: tp.sizes[g.dim] - 1})
            return global_read(wide, tuple(at), lambda a: f"({index_c})" if a == GATHER_AXIS else var_global(a),
                               expr.pad_value, d)

        typed = TypedC(expr, d, lambda r: read_exprs[(r.tensor, r.index)],
                       (lambda a: f"(rl_s_{a} + rl_l_{a})") if staged else var_global, gathered)
        body = typed.body()
    else:
        body = render_body(expr.body, d, lambda r: read_exprs[(r.tensor, r.index)], axis=axis_c)
    # The epilogue runs where a point is stored, inside the store's guard: its reads index output axes within
    # their extents, so they need neither staging nor bounds tests.
    inside = {ax.name: ax.extent - 1 for ax in spatial}
    epilogue_inputs = []
    for t in expr.epilogue_inputs:
        tp = tensor_plan(t, d)
        tp.ranges = inside
        epilogue_inputs.append(tp)
    epilogue = render_epilogue(expr, d, epilogue_inputs, "rl_r", lambda tp, idx: global_read(
        tp, idx, var_global, expr.pad_value, d))
    out = tensor_plan(expr.output, d)
    out_index = [affine_c(i, var_global) for i in expr.out_index]
    init = {"max": f"(-{d.infinity})", "min": d.infinity}.get(expr.reduce_op or "", c_float(0.0, d))
    combine = combine_stmt(expr.reduce_op, d)
    if typed is not None:
        init, combine = typed.acc_init(), typed.combine()
    guard = " && ".join(f"rl_s_{ax.name} + rl_l_{ax.name} < {ax.extent_c or ax.extent}" for ax in reduce
                        if ax.extent_c or ax.extent % ax.block) or ""
    params = [(t.name, d.ctype[t.dtype], False) for t in expr.inputs] + \
             [(expr.output.name, d.ctype[expr.output.dtype], True)]
    red_div = 1
    reduce_decode: list[tuple[str, int, int]] = []
    for ax in reversed(reduce):
        reduce_decode.insert(0, (ax.name, red_div, ax.extent))
        red_div *= ax.extent
    out.ranges = ranges
    rform, vform = vectorise(prog, expr, spatial, inputs, out, d, blocked, staged, streaming)
    rvec = reduce_vec_plan(expr, spatial, reduce, inputs, d, *rform) if rform is not None else None
    vec = vec_plan(expr, spatial, inputs, epilogue_inputs, out, d, vform) if vform is not None else None
    if vform is not None and vform.stream:
        decode(spatial, read_axis(expr, spatial))
    loops = reduce_loops(reduce, window=unshared(expr))
    stream = None
    if prog.vector > 1:
        if prog.runtime:
            raise InputError(f"{expr.name}: a vector program's loops run to its extent; it takes none at launch",
                             field="vector")
        # the thread tile holds whole vectors (construction/stream.py): its extent / width of them a thread
        stream = stream_plan(expr, inputs, out, d, prog.vector, max(1, t_tile[0] // prog.vector), prog.block,
                             prog.grid)
    return KernelPlan(
        name=name, grid=prog.grid, block=prog.block, acc_ctype=acc_ctype, out_ctype=d.ctype[expr.output.dtype],
        out_vstore=d.vstore_format(d.ctype[expr.output.dtype]),
        reduce_points=red_div, reduce_decode=reduce_decode,
        spatial=spatial, reduce=reduce, inputs=inputs, output=out, staged=staged,
        reduce_loops=loops, window_inner=window_inner(loops, vec is not None),
        n_rtiles=math.prod(ax.blocks for ax in reduce) if reduce else 1,
        n_rtiles_c=" * ".join(ax.blocks_c or str(ax.blocks) for ax in reduce) if any(ax.blocks_c for ax in reduce)
        else "", runtime=list(prog.runtime), real=d.real,
        rstep_points=math.prod(ax.block for ax in reduce) if reduce else 1,
        thread_points=math.prod(ax.thread for ax in spatial) if spatial else 1,
        reduce_op=expr.reduce_op, acc_init=init, combine=combine,
        vcombine=combine_stmt(expr.reduce_op, d, True) if vec else "",
        body=body, out_index=out_index, epilogue=epilogue, epilogue_inputs=epilogue_inputs,
        pad_value=c_float(expr.pad_value, d), reduce_guard=guard, smem_bytes=smem_total, params=params,
        blocked=blocked, vec=vec, rvec=rvec, typed_store=typed.store if typed is not None else None,
        helpers=typed.helper_code() if typed is not None else "", stream=stream,
        smem_align=prog.shared_vector * expr.body_inputs[0].itemsize if staged and prog.shared_vector > 1 else 0,
        warp_tid=warp_order(spatial, d.warp_lanes) if staged and not blocked else "")
