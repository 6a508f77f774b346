"""Kernel plan: an rProgram lowered to what every C-family kernel (OpenCL, CUDA, HIP) needs.

The plan is plain data: decode divisors, tile extents, and index expressions as one-line C expressions. The
shared Jinja2 template (``templates/kernel.j2``) lays the kernel out from it; each backend's dialect template
only says how its language spells qualifiers, barriers and thread indices. So the kernels of one rProgram in
every language come from the same plan (and a test compares the plans).

Kernel shape: one work-group/block per block tile, threads cyclically over the block tile (thread ``t`` of an
axis with ``n`` threads owns local coordinates t, t+n, ...: adjacent threads touch adjacent elements); every
reduction step stages each input's data tile (a bounding box in the tensor, or a gathered tile for views) into
shared memory with bounds guards and the pad value, then each thread accumulates its register tile.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from roller.errors import InputError
from roller.ir.expr import Affine, AxisValue, BinOp, Call, Const, Expr, Neg, Read, map_reads
from roller.ir.tensor_expr import Axis, TensorDecl, TensorExpr
from roller.ir.vector import VECTOR_WIDTHS, flat_step, reduction_vector, vector_width
from roller.program import RProgram


@dataclass(frozen=True)
class Dialect:
    """How a language spells scalar types and math; used when rendering the body expression."""

    ctype: dict[str, str]  # dtype -> C type
    funcs: dict[str, str]  # roller function -> C function (one argument or two)
    float_suffix: str = "f"
    infinity: str = "INFINITY"
    to_acc: str = "(float)({x})"  # converting a loaded element to the accumulator type
    from_acc: str = "({ctype})({x})"
    vector_loads: bool = False  # OpenCL C's floatN, vloadN/vstoreN: CPU kernels vectorise inside a work-item
    # a 16-byte type whose loads and stores stage a tile's contiguous rows (CUDA's uint4); "": element by element
    stage_vector: str = ""
    # a store of one whole vector past the caches ({v}: the vector, {vtype}: its type, {ptr}: where, aligned to
    # the vector's size), for outputs larger than the caches (lower's ``streaming``); "": none
    streaming_store: str = ""
    # 64-bit integer types, for index arithmetic that 32 bits cannot hold (see index_types)
    wide_int: str = "long long"
    wide_uint: str = "unsigned long long"
    # every tensor index in 64 bits: on a CPU a 32-bit index is summed, then sign-extended before each load
    # (lea + movslq per broadcast in a convolution's inner loop: PoCL's 3x3 convolutions ran 1.0-2.2x faster
    # with 64-bit indices, none slower, in one process)
    wide_index: bool = False
    # storage ctype -> (to_acc, from_acc) where a plain cast does not convert (OpenCL keeps float16 as the bits
    # in a ushort: without cl_khr_fp16 a half can only be read and written through vload_half/vstore_half)
    conversions: dict[str, tuple[str, str]] = field(default_factory=dict)
    language: str = "C"  # for messages

    def load(self, ctype: str, x: str) -> str:
        """Element ``x`` of storage type ``ctype`` as the accumulator type."""
        return self.conversions.get(ctype, (self.to_acc, ""))[0].format(x=x)

    def store(self, ctype: str, x: str) -> str:
        """Accumulator value ``x`` as storage type ``ctype``."""
        return self.conversions.get(ctype, ("", self.from_acc))[1].format(ctype=ctype, x=x)


@dataclass
class DimPlan:
    extent: int
    div: int  # decode divisor of a linear index over this tile
    origin: str = "0"  # C expression: first tensor index of the tile in this dimension
    itype: str = "int"  # C type of the tensor index in this dimension (64 bits where 32 cannot hold it)
    utype: str = "unsigned"  # its unsigned type, for the one-comparison bounds test


@dataclass
class ViewPlan:
    """Decode of a virtual index into sub-axes (innermost first) and the source index they give."""

    subs: list[list[tuple[str, int]]]  # per virtual dim, sub-axes innermost first
    src_index: list[str]  # C expression per source dimension, over the sub-axis variables
    src_sizes: list[int]
    src_strides: list[int]
    virtual_sizes: list[int]
    src_itypes: list[str] = field(default_factory=list)  # C type of each source index (see index_types)
    src_utypes: list[str] = field(default_factory=list)


@dataclass
class TensorPlan:
    name: str
    ctype: str
    sizes: list[int]  # dimensions the kernel indexes (virtual for views, fused for reshapes)
    strides: list[int]  # row-major strides for those dimensions (plain tensors)
    view: ViewPlan | None = None
    # staged inputs only:
    smem: str = ""
    dims: list[DimPlan] = field(default_factory=list)
    row_pad: int = 0
    smem_elems: int = 0
    smem_strides: list[int] = field(default_factory=list)
    tile_elems: int = 0
    stage_vec: int = 0  # elements per 16-byte load when the tile's rows stage as vectors (0: element by element)
    stage_divs: list[int] = field(default_factory=list)  # decode divisors over the tile's vectors
    # unstaged reads: the largest value of every axis variable an index of this tensor is computed from
    ranges: dict[str, int] = field(default_factory=dict)
    # the smallest value of an axis variable where it is not 0 (a kernel version for the threads whose windows
    # stay inside the tensor: _interior)
    lows: dict[str, int] = field(default_factory=dict)


@dataclass
class AxisPlan:
    name: str  # C variable suffix
    extent: int
    block: int  # block tile (spatial) or reduction step (reduce)
    thread: int  # thread tile (spatial)
    threads: int  # threads along this axis
    blocks: int  # blocks along the axis (spatial) or reduction tiles (reduce)
    bdiv: int  # decode divisor in the block id (spatial) or reduction-tile index (reduce)
    tdiv: int  # decode divisor in the thread id (spatial) or step point (reduce)
    jdiv: int  # decode divisor in the register-tile point index (spatial)
    # an axis whose extent is a kernel argument (RProgram.runtime): C expressions of its extent and block
    # count, and of the decode divisor of any axis outside such an axis; "" where the constant holds
    extent_c: str = ""
    blocks_c: str = ""
    bdiv_c: str = ""


@dataclass
class VecFlavor:
    """One version of the vector path: ``cond`` picks it (the last one has none), ``body`` is the vector C
    expression of ``width`` points starting at rl_g_<axis>. The result is stored with one vector store at
    ``store_offset`` where that is set and ``store_test`` holds, else (with ``lanes``) lane by lane, each lane
    where ``lane_guard`` holds. ``run_start``, when set, is the thread's run along the axis as a constant
    (the one run across the axis's end), which lets the compiler fold the lane tests; ``skip`` is a version
    that has nothing to compute (runs wholly past the end)."""

    cond: str
    body: str
    store_offset: str
    store_test: str
    lanes: bool
    lane_guard: str
    run_start: int | None = None
    skip: bool = False
    epilogue: str = "rl_vr0"  # the vector stored, over the vector of reduced values rl_vr0


@dataclass
class VecPlan:
    """A work-item's register tile as ``width``-wide vectors along the last spatial axis (CPU kernels only).

    PoCL otherwise vectorises the loop over a work-group's items, or the unrolled loop inside one, as its
    cost model decides, and identical per-thread code then runs 2-6x apart from one work-group shape to the
    next (docs/model.md). Explicit vectors make the SIMD use a property of the thread tile, which the model
    and the probe see. Tiles inside the axis load contiguous runs with one vector load; a tile that crosses
    the axis's end gathers its lanes with clamped indices and stores them one by one."""

    width: int
    axis: str  # the last spatial axis: its register points are adjacent in rl_j
    vtype: str  # e.g. float16
    flavors: list[VecFlavor]
    # how the whole vectors inside the axis are stored past the caches (the dialect's streaming store of rl_vr at
    # {ptr}, aligned: lower's ``streaming``); "": vstoreN
    stream: str = ""


@dataclass
class StagePlan:
    """One stage of a row kernel: ``var`` starts at ``init`` and folds ``body`` (a C expression of one column
    point) with ``combine`` over the row's columns."""

    var: str
    init: str
    combine: str
    body: str


@dataclass
class RowVecPlan:
    """A CPU row kernel's column walks as ``width``-wide vectors along its one column axis (partial results per
    lane, folded across the lanes after the walk, then a scalar tail): the same SIMD use as the separate
    kernels it replaces, which PoCL vectorises and a scalar row walk does not."""

    width: int
    vtype: str
    axis: str
    extent: int | str  # a C expression where the axis's extent is a kernel argument
    stage_bodies: list[str]  # vector C expression of each stage's body
    vcombine: list[str]  # vector fold of each stage
    body: str  # the last walk's vector expression
    store_offset: str  # flat offset of the first lane's output (contiguous along the axis), or "" (lane by lane)


@dataclass
class ReduceVecPlan:
    """A CPU reduction walked in ``width``-wide vectors along its innermost axis ``axis`` (roller.ir.vector.
    reduction_vector): per output point, the outer reduction loops run as usual, the innermost one in vectors
    of partial results (``body``, folded with ``vcombine``) and a scalar tail; the lanes are folded after the
    walk. ``guard`` skips the tile's points past the spatial axes' ends."""

    width: int
    vtype: str
    axis: str
    extent: int | str
    body: str
    vcombine: str
    outer_loops: list[tuple[str, int | str, int]]
    guard: str


@dataclass
class KernelPlan:
    name: str
    grid: int
    block: int
    acc_ctype: str
    out_ctype: str
    spatial: list[AxisPlan]
    reduce: list[AxisPlan]
    inputs: list[TensorPlan]
    output: TensorPlan
    staged: bool
    n_rtiles: int
    rstep_points: int
    thread_points: int
    reduce_op: str | None
    acc_init: str
    combine: str  # C statement template with {acc} and {val}
    body: str  # C expression of one point
    out_index: list[str]  # output tensor index per dimension (plain outputs)
    pad_value: str
    reduce_guard: str  # C condition: the step point is inside the reduction
    smem_bytes: int
    params: list[tuple[str, str, bool]]  # (name, ctype, is_output)
    blocked: bool = False  # threads own contiguous runs (CPU SIMD within a thread) instead of strided ones
    reduce_points: int = 1  # unstaged reductions: every point of the reduction, walked by each thread
    reduce_decode: list[tuple[str, int, int]] = field(default_factory=list)  # (axis, divisor, extent)
    # unstaged reductions as nested loops, outermost first: (axis, extent, unroll: 0 none, -1 full, else N); the
    # extent is a C expression where it is a kernel argument
    reduce_loops: list[tuple[str, int | str, int]] = field(default_factory=list)
    vec: VecPlan | None = None
    notes: list[str] = field(default_factory=list)
    vcombine: str = ""  # combine over vectors (the vector path's accumulators)
    epilogue: str = "rl_r"  # C expression of the value stored, over the reduced value rl_r
    epilogue_inputs: list[TensorPlan] = field(default_factory=list)  # read by the epilogue only, unstaged
    # a row kernel (TensorExpr.stages): threads own rows (``spatial``), ``reduce_loops`` walk the columns once per
    # stage and once more to store
    stages: list[StagePlan] = field(default_factory=list)
    row_vec: RowVecPlan | None = None
    rvec: ReduceVecPlan | None = None
    # the vector path's register tile outside a whole unrolled window (reduce_loops): each output's window is
    # summed before the next output's, with one vector of partial sums live instead of the tile's 28 (a 3x3
    # average pool on PoCL, 7 alternating rounds: 0.84x of a copy kernel against 0.80x; by hand 0.79-1.1x
    # against 0.65-0.76x)
    window_inner: bool = False
    # extents given at launch (RProgram.runtime): (axis, factor) of each axis that runs to factor * RUNTIME_ARG
    runtime: list[tuple[str, int]] = field(default_factory=list)
    n_rtiles_c: str = ""  # the staged reduction's tile count where a reduced axis's extent is an argument

    @property
    def scalars(self) -> list[str]:
        """The kernel's scalar (int) parameters, after its pointers."""
        return [RUNTIME_ARG] if self.runtime else []


def _c_float(v: float, d: Dialect) -> str:
    if math.isinf(v):
        return d.infinity if v > 0 else f"(-{d.infinity})"
    if math.isnan(v):
        return "NAN"
    text = repr(float(v))
    if "e" not in text and "." not in text:
        text += ".0"
    return f"{text}{d.float_suffix}" if d.float_suffix else text


INT32_MAX = 2**31 - 1
#: the kernel parameter that carries the symbol's value to a kernel with runtime extents (RProgram.runtime)
RUNTIME_ARG = "rl_n"


def _runtime_axes(axes: list[AxisPlan], runtime: dict[str, int]) -> None:
    """Give the axes whose extent is a kernel argument their C expressions (extent, block count), and every
    axis outside one of them its decode divisor as an expression (the product of the inner axes' block
    counts, some known only at launch). ``axes`` are in decode order, the last varying fastest."""
    const = 1
    inner: list[str] = []
    for ax in reversed(axes):
        if inner:
            ax.bdiv_c = " * ".join(inner + ([str(const)] if const != 1 else []))
        if ax.name in runtime:
            ax.extent_c = f"rl_e_{ax.name}"
            ax.blocks_c = f"rl_nb_{ax.name}"
            inner.append(ax.blocks_c)
        else:
            const *= ax.blocks


def reach(a: Affine, ranges: dict[str, int]) -> int:
    """A bound on the magnitude of an index and of every partial sum C computes it through, for axis values in
    [0, ranges[axis]]."""
    return abs(a.const) + sum(abs(c) * max(ranges.get(ax, 0), 0) for ax, c in a.terms)


def index_types(a: Affine, ranges: dict[str, int], d: Dialect) -> tuple[str, str]:
    """(signed, unsigned) C types an index is computed in: ``int`` where every value it and its partial sums take
    is proven to fit 32 bits (the shapes, coefficients and tile extents are all known here), else the dialect's
    64-bit types. With 32 bits, ``X[4294967296*i+1]`` would wrap to a small index that passes the bounds test
    while the load used all 64 bits of the product (the IR bounds every index by 2^62, so 64 bits always hold)."""
    if reach(a, ranges) <= INT32_MAX and not d.wide_index:
        return "int", "unsigned"
    return d.wide_int, d.wide_uint


def _affine_c(a: Affine, var: Callable[[str], str], wide: str = "") -> str:
    """``a`` as C over the axis variables ``var(axis)``; ``wide`` (a 64-bit type) converts each variable first,
    so that the products and sums are computed in 64 bits."""
    parts = []
    for ax, c in a.terms:
        v = f"({wide}){var(ax)}" if wide else var(ax)
        parts.append(v if c == 1 else f"{c} * {v}")
    if a.const or not parts:
        parts.append(str(a.const))
    return " + ".join(parts).replace("+ -", "- ")


def _strides(sizes: list[int] | tuple[int, ...]) -> list[int]:
    out = [1] * len(sizes)
    for i in range(len(sizes) - 2, -1, -1):
        out[i] = out[i + 1] * sizes[i + 1]
    return out


def render_body(e: Expr, d: Dialect, read: Callable[[Read], str], vtype: str = "",
                axis: Callable[[str], str] | None = None) -> str:
    """The body as a C expression; ``axis(name)`` renders an axis's value. With ``vtype`` (a vector type, CPU
    kernels) reads are vectors and a call's arguments are converted to ``vtype`` (a scalar constant broadcast):
    the generated helpers (rl_max_v ...) take vectors only. Function templates name them through ``{v}``."""
    if isinstance(e, Const):
        return _c_float(e.value, d)
    if isinstance(e, Read):
        return read(e)
    if isinstance(e, AxisValue):
        if axis is None:
            raise TypeError(f"no rendering for the value of axis {e.axis}")
        return axis(e.axis)
    if isinstance(e, Neg):
        return f"(-{render_body(e.x, d, read, vtype, axis)})"
    if isinstance(e, BinOp):
        return f"({render_body(e.lhs, d, read, vtype, axis)} {e.op} {render_body(e.rhs, d, read, vtype, axis)})"
    if isinstance(e, Call):
        args = [render_body(a, d, read, vtype, axis) for a in e.args]
        if vtype:
            args = [f"(({vtype})({a}))" for a in args]
        return d.funcs[e.fn].format(*args, zero=_c_float(0.0, d), one=_c_float(1.0, d), v="_v" if vtype else "")
    raise TypeError(e)


def render_epilogue(expr: TensorExpr, d: Dialect, plans: list[TensorPlan], value: str,
                    read: Callable[[TensorPlan, tuple[Affine, ...]], str], vtype: str = "") -> str:
    """The epilogue as a C expression over ``value`` (the reduced value, or a vector of them); ``value`` itself
    where there is none."""
    if expr.epilogue is None:
        return value
    by_name = {tp.name: tp for tp in plans}
    return render_body(expr.epilogue, d, lambda r: value if r.tensor == expr.output.name else
                       read(by_name[r.tensor], r.index), vtype)


def combine_stmt(reduce_op: str | None, d: Dialect, vector: bool = False) -> str:
    """The statement folding ``{val}`` into ``{acc}`` (a template for str.format)."""
    if reduce_op == "sum":
        return "{acc} += {val};"
    if reduce_op in ("max", "min"):
        fold = d.funcs[reduce_op].format("{acc}", "{val}", zero="", one="", v="_v" if vector else "")
        return "{acc} = " + fold + ";"
    return "{acc} = {val};"


def lower(prog: RProgram, d: Dialect, kernel_name: str | None = None, blocked: bool | None = None,
          streaming: Streaming | None = None) -> KernelPlan:
    """The kernel plan of ``prog``. With ``streaming``, an output that large stores its whole, aligned vectors
    with the dialect's streaming store (``_streamed``).

    When the block's layer is a scratchpad (scope 'block': shared memory, LDS) each reduction step is staged
    into it; when it is a cache (scope 'cache': a CPU's L2 under PoCL) threads read through it directly, and
    each thread owns a contiguous run of every axis (``blocked``), which is what a CPU compiler turns into
    SIMD inside one work-item; on GPUs threads own strided runs, which is what coalesces a warp."""
    expr = prog.expr
    if expr.stages:
        return _lower_rows(prog, d, kernel_name)
    for t in expr.tensors:
        if t.dtype not in d.ctype:
            # Checked here for every C-family backend: a dtype without a type of its own must not be rendered as
            # another (OpenCL once ran bfloat16 as float32) nor end as a KeyError.
            raise InputError(f"{expr.name}: tensor {t.name} is {t.dtype}, which {d.language} has no type for here; "
                             f"use {' or '.join(d.ctype)}", field="dtype")
    expr = hoist_divisor(expr)
    b_tile, t_tile = prog.block_tile.shape, prog.thread_tile.shape
    name = kernel_name or expr.name
    scratchpad = prog.scopes[prog.block_level + 1] == "block"
    staged = bool(expr.reduce_axes) and scratchpad
    if blocked is None:
        blocked = not scratchpad

    spatial: list[AxisPlan] = []
    reduce: list[AxisPlan] = []
    for i, a in enumerate(expr.axes):
        if a.reduce:
            reduce.append(AxisPlan(a.name, a.extent, b_tile[i], 1, 1, -(-a.extent // b_tile[i]), 0, 0, 0))
        else:
            spatial.append(AxisPlan(a.name, a.extent, b_tile[i], t_tile[i], b_tile[i] // t_tile[i],
                                    -(-a.extent // b_tile[i]), 0, 0, 0))
    _decode(spatial)
    div_r = div_k = 1
    for ax in reversed(reduce):
        ax.bdiv, ax.tdiv = div_r, div_k
        div_r *= ax.blocks
        div_k *= ax.block
    runtime = dict(prog.runtime)
    _runtime_axes(spatial, runtime)
    _runtime_axes(reduce, runtime)

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
        tp = _tensor_plan(t, d)
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
                origin = _affine_c(Affine(starts.terms, lo), var_start, "" if itype == "int" else itype)
                dims.append(DimPlan(hi - lo + 1, 0, origin, itype, utype))
            ext = [dp.extent for dp in dims]
            div = 1
            for dp in reversed(dims):
                dp.div = div
                div *= dp.extent
            tp.dims = dims
            tp.tile_elems = math.prod(ext)
            tp.row_pad = pads.get(t.name, 0) if len(ext) > 1 else 0
            storage = ext[:-1] + [ext[-1] + tp.row_pad] if ext else []
            tp.smem_strides = _strides(storage)
            tp.smem_elems = max(1, math.prod(storage))
            smem_total += tp.smem_elems * t.itemsize
            tp.stage_vec = _stage_vector(tp, accs, block_shape, lows[-1] if lows else 0, t.itemsize,
                                         expr.pad_value, d)
            if tp.stage_vec:
                vext = ext[:-1] + [ext[-1] // tp.stage_vec]
                tp.stage_divs = [math.prod(vext[i + 1:]) for i in range(len(vext))]
            for idx in accs:
                terms = []
                for dim, aff in enumerate(idx):
                    local = Affine(aff.terms, aff.const - lows[dim])
                    expr_c = _affine_c(local, var_local)
                    if tp.smem_strides[dim] != 1:
                        expr_c = f"({expr_c}) * {tp.smem_strides[dim]}"
                    terms.append(expr_c)
                read_exprs[(t.name, idx)] = d.load(tp.ctype, f"{tp.smem}[{' + '.join(terms) or '0'}]")
        else:
            # Without staging, padded points of a partial block would read past a tensor's end through a
            # plain spatial index: clamp those (their results are never stored), guard the rest.
            clamp = {a.name: a.extent for a in expr.spatial_axes} if expr.reduce_axes else {}
            tp.ranges = ranges
            for idx in accs:
                read_exprs[(t.name, idx)] = _global_read(tp, idx, var_global, expr.pad_value, d, clamp)
        inputs.append(tp)

    # An axis's value: its global coordinate (tile start + local coordinate in a staged kernel).
    axis_c = (lambda a: f"((float)(rl_s_{a} + rl_l_{a}))") if staged else (lambda a: f"((float){var_global(a)})")
    body = render_body(expr.body, d, lambda r: read_exprs[(r.tensor, r.index)], axis=axis_c)
    # The epilogue runs where a point is stored, inside the store's guard: its reads index output axes within
    # their extents, so they need neither staging nor bounds tests.
    inside = {ax.name: ax.extent - 1 for ax in spatial}
    epilogue_inputs = []
    for t in expr.epilogue_inputs:
        tp = _tensor_plan(t, d)
        tp.ranges = inside
        epilogue_inputs.append(tp)
    epilogue = render_epilogue(expr, d, epilogue_inputs, "rl_r", lambda tp, idx: _global_read(
        tp, idx, var_global, expr.pad_value, d))
    out = _tensor_plan(expr.output, d)
    out_index = [_affine_c(i, var_global) for i in expr.out_index]
    init = {"max": f"(-{d.infinity})", "min": d.infinity}.get(expr.reduce_op or "", _c_float(0.0, d))
    combine = combine_stmt(expr.reduce_op, d)
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
    cpu_vectors = blocked and not staged and d.vector_loads
    rvec = _reduce_vec_plan(expr, spatial, reduce, inputs, d) if cpu_vectors else None
    vec = _vec_plan(expr, spatial, inputs, epilogue_inputs, out, d, None if prog.runtime else streaming) \
        if cpu_vectors and rvec is None else None
    if vec is not None and vec.stream:
        _decode(spatial, _read_axis(expr, spatial))
    loops = reduce_loops(reduce, window=_unshared(expr))
    return KernelPlan(
        name=name, grid=prog.grid, block=prog.block, acc_ctype=acc_ctype, out_ctype=d.ctype[expr.output.dtype],
        reduce_points=red_div, reduce_decode=reduce_decode,
        spatial=spatial, reduce=reduce, inputs=inputs, output=out, staged=staged,
        reduce_loops=loops, window_inner=vec is not None and bool(loops) and all(u == -1 for _, _, u in loops),
        n_rtiles=math.prod(ax.blocks for ax in reduce) if reduce else 1,
        n_rtiles_c=" * ".join(ax.blocks_c or str(ax.blocks) for ax in reduce) if any(ax.blocks_c for ax in reduce)
        else "", runtime=list(prog.runtime),
        rstep_points=math.prod(ax.block for ax in reduce) if reduce else 1,
        thread_points=math.prod(ax.thread for ax in spatial) if spatial else 1,
        reduce_op=expr.reduce_op, acc_init=init, combine=combine,
        vcombine=combine_stmt(expr.reduce_op, d, True) if vec else "",
        body=body, out_index=out_index, epilogue=epilogue, epilogue_inputs=epilogue_inputs,
        pad_value=_c_float(expr.pad_value, d), reduce_guard=guard, smem_bytes=smem_total, params=params,
        blocked=blocked, vec=vec, rvec=rvec)


def _reduce_vec_plan(expr: TensorExpr, spatial: list[AxisPlan], reduce: list[AxisPlan], inputs: list[TensorPlan],
                     d: Dialect) -> ReduceVecPlan | None:
    """The vector walk along the innermost reduction axis, where roller.ir.vector.reduction_vector picks it."""
    form = reduction_vector(expr)
    if form is None:
        return None
    axis, width = form
    vtype = f"{d.ctype[expr.acc_dtype]}{width}"
    extent = expr.axis(axis).extent
    loop_extent = {ax.name: ax.extent_c or ax.extent for ax in reduce}
    reads = {(tp.name, idx): _vector_read(tp, idx, axis, extent, width, vtype, expr.pad_value, d, {})
             for tp in inputs for idx in expr.accesses(tp.name)}
    body = render_body(expr.body, d, lambda r: reads[(r.tensor, r.index)], vtype,
                       lambda a: f"(({vtype})((float){var_global(a)}) + ({vtype})"
                                 f"({', '.join(f'{k}.0f' for k in range(width))}))" if a == axis
                       else f"(({vtype})((float){var_global(a)}))")
    outer: list[tuple[str, int | str, int]] = [(a.name, loop_extent[a.name], 0) for a in expr.reduce_axes
                                               if a.name != axis]
    guard = " && ".join(f"{var_global(ax.name)} < {ax.extent}" for ax in spatial if ax.extent % ax.block)
    return ReduceVecPlan(width, vtype, axis, loop_extent[axis], body, combine_stmt(expr.reduce_op, d, True), outer,
                         guard)


def hoist_divisor(expr: TensorExpr) -> TensorExpr:
    """A sum of ``x / c`` (c a constant: an average pool's K*K, a mean's count) as the sum of ``x`` divided
    by ``c`` once, in the epilogue: one division per output instead of one per point. A 3x3 average pool on
    PoCL divided every window point, and vector divisions, not memory, set its time."""
    body = expr.body
    if expr.reduce_op != "sum" or not expr.reduce_axes or not isinstance(body, BinOp) or body.op != "/" \
            or not isinstance(body.rhs, Const):
        return expr
    c = body.rhs
    if expr.epilogue is None:
        return replace(expr, body=body.lhs, epilogue=BinOp("/", Read(expr.output.name, expr.out_index), c))
    # A fused epilogue reads the reduced value as the output: it reads the sum divided instead.
    return replace(expr, body=body.lhs, epilogue=map_reads(
        expr.epilogue, lambda r: BinOp("/", r, c) if r.tensor == expr.output.name else r))


def _decode(spatial: list[AxisPlan], fastest: str | None = None) -> None:
    """Set the spatial axes' decode divisors. The last axis varies fastest (in block ids, thread ids and register
    points alike), so that adjacent threads work on adjacent output elements of the innermost dimension; with
    ``fastest``, that axis varies fastest in thread ids instead (a streamed output: ``_read_axis``)."""
    div_b = div_j = 1
    for ax in reversed(spatial):
        ax.bdiv, ax.jdiv = div_b, div_j
        div_b *= ax.blocks
        div_j *= ax.thread
    div_t = 1
    inner_first = spatial[::-1]
    for ax in [a for a in inner_first if a.name == fastest] + [a for a in inner_first if a.name != fastest]:
        ax.tdiv = div_t
        div_t *= ax.threads


@dataclass(frozen=True)
class Streaming:
    """When a CPU kernel stores past the caches: outputs of at least ``min_bytes`` (more than the caches hold),
    in vectors of whole transactions (``whole_bytes``: a streaming store of part of a line writes the line in
    pieces)."""

    min_bytes: int
    whole_bytes: int


def _streamed(expr: TensorExpr, ax: AxisPlan, width: int, out: TensorPlan, d: Dialect,
              streaming: Streaming) -> bool:
    """Whether a CPU kernel's output, stored in ``width``-wide vectors along ``ax``, streams past the caches: the
    dialect has a streaming store, the output is large enough (a store that fills the cache first would only
    evict, and for a line not yet cached read it from memory for nothing), and every vector the kernel stores
    whole is whole transactions and aligned to its size, which a streaming store needs: the vector axis is the
    output's contiguous one, its tiles start at multiples of the width, and every other axis and the index's
    constant move the offset by whole vectors (buffers start at CL_DEVICE_MEM_BASE_ADDR_ALIGN, 128 bytes or
    more). A transpose whose rows of vectors land 16 KiB apart wrote 0.26x of a copy kernel's bandwidth through
    the caches, 0.77x streamed (docs/opencl.md, "Streaming stores")."""
    nbytes = expr.output.size * expr.output.itemsize
    if not d.streaming_store or out.view is not None or nbytes < streaming.min_bytes or ax.block % width or \
            width * expr.output.itemsize % streaming.whole_bytes:
        return False
    if _flat_coef(expr.out_index, out.strides, ax.name) != 1:
        return False
    const = sum(i.const * s for i, s in zip(expr.out_index, out.strides))
    others = {a for i in expr.out_index for a, _ in i.terms if a != ax.name}
    return not const % width and all(not _flat_coef(expr.out_index, out.strides, a) % width for a in others)


def _read_axis(expr: TensorExpr, spatial: list[AxisPlan]) -> str | None:
    """With its stores streamed, a kernel's adjacent threads should read adjacent data, for the prefetchers: the
    spatial axis other than the vector axis along which the largest input is contiguous (a transpose's input
    rows), or None where the vector axis is that axis too. Threads ordered along the output instead read the
    transpose's input 16 rows at a time, 16 KiB apart, at 0.26-0.37x of a copy kernel even with streamed stores;
    along the input, 0.75-0.83x."""
    if len(spatial) < 2:
        return None
    names = [a.name for a in spatial[:-1]]
    for t in sorted((t for t in expr.inputs if t.view is None), key=lambda t: -t.size * t.itemsize):
        for idx in expr.accesses(t.name):
            for a in names:
                if flat_step(t.shape, idx, a) == 1:
                    return a
    return None


def _lower_rows(prog: RProgram, d: Dialect, kernel_name: str | None) -> KernelPlan:
    """The plan of a row kernel: the program's tiles over the row axes (``RProgram`` of its first stage as a
    reduction); each thread point is a row, whose columns every stage walks in nested loops, the last walk
    storing. Reads are straight from global memory: a row's columns stay in the thread's cache between walks."""
    expr = prog.expr
    for t in expr.tensors:
        if t.dtype not in d.ctype:
            raise InputError(f"{expr.name}: tensor {t.name} is {t.dtype}, which {d.language} has no type for here; "
                             f"use {' or '.join(d.ctype)}", field="dtype")
    rows = set(expr.row_axes)
    b_tile, t_tile = prog.block_tile.shape, prog.thread_tile.shape
    spatial = [AxisPlan(a.name, a.extent, b_tile[i], t_tile[i], b_tile[i] // t_tile[i], -(-a.extent // b_tile[i]),
                        0, 0, 0) for i, a in enumerate(expr.axes) if a.name in rows]
    _decode(spatial)
    runtime = dict(prog.runtime)
    _runtime_axes(spatial, runtime)

    def col_extent(a: Axis) -> int | str:
        return f"rl_e_{a.name}" if a.name in runtime else a.extent

    # Rows are tested against their extents before any read, and columns run exactly their extents.
    exact = {a.name: a.extent - 1 for a in expr.axes}
    plans = []
    for t in expr.inputs:
        tp = _tensor_plan(t, d)
        tp.ranges = exact
        plans.append(tp)
    by_name = {tp.name: tp for tp in plans}
    names = {st.name: f"rl_st_{st.name}" for st in expr.stages}

    def read(r: Read) -> str:
        if r.tensor in names:
            return names[r.tensor]
        return _global_read(by_name[r.tensor], r.index, var_global, expr.pad_value, d)

    init = {"max": f"(-{d.infinity})", "min": d.infinity}
    stages = [StagePlan(names[st.name], init.get(st.reduce_op, _c_float(0.0, d)), combine_stmt(st.reduce_op, d),
                        render_body(st.body, d, read)) for st in expr.stages]
    out = _tensor_plan(expr.output, d)
    out.ranges = exact
    scratchpad = prog.scopes[prog.block_level + 1] == "block"
    cols = [a for a in expr.axes if a.name not in rows]
    row_vec = None
    width = next((w for w in VECTOR_WIDTHS if w <= cols[-1].extent), 0) if cols else 0
    acc = d.ctype[expr.acc_dtype]
    if d.vector_loads and not scratchpad and len(cols) == 1 and width and \
            all(d.ctype[t.dtype] == acc for t in expr.tensors):
        col = cols[0]
        vtype = f"{acc}{width}"

        def vread(r: Read) -> str:
            if r.tensor in names:
                return f"(({vtype})({names[r.tensor]}))"
            return _vector_read(by_name[r.tensor], r.index, col.name, col.extent, width, vtype, expr.pad_value, d, {})

        contiguous = _flat_coef(expr.out_index, out.strides, col.name) == 1
        offset = " + ".join(f"({_affine_c(i, var_global)}) * {st}" if st != 1 else f"({_affine_c(i, var_global)})"
                            for i, st in zip(expr.out_index, out.strides)) if contiguous else ""
        row_vec = RowVecPlan(width, vtype, col.name, col_extent(col),
                             [render_body(st.body, d, vread, vtype) for st in expr.stages],
                             [combine_stmt(st.reduce_op, d, True) for st in expr.stages],
                             render_body(expr.body, d, vread, vtype), offset)
    return KernelPlan(
        name=kernel_name or expr.name, grid=prog.grid, block=prog.block, acc_ctype=d.ctype[expr.acc_dtype],
        out_ctype=d.ctype[expr.output.dtype], spatial=spatial, reduce=[], inputs=plans, output=out, staged=False,
        n_rtiles=1, rstep_points=1, thread_points=math.prod(ax.thread for ax in spatial) if spatial else 1,
        reduce_op=None, acc_init=_c_float(0.0, d), combine="", body=render_body(expr.body, d, read),
        out_index=[_affine_c(i, var_global) for i in expr.out_index], pad_value=_c_float(expr.pad_value, d),
        reduce_guard="", smem_bytes=0, params=[(t.name, d.ctype[t.dtype], False) for t in expr.inputs] +
        [(expr.output.name, d.ctype[expr.output.dtype], True)], blocked=not scratchpad,
        reduce_loops=_unrolled([(a.name, col_extent(a), 0) for a in cols]), stages=stages, row_vec=row_vec,
        runtime=list(prog.runtime))


def _unrolled(loops: list[tuple[str, int | str, int]]) -> list[tuple[str, int | str, int]]:
    """``loops`` with the innermost unrolled as an unstaged reduction's is (whole when short, else by
    UNROLL_STEP; an extent known only at launch by UNROLL_STEP): left to itself, nvcc unrolled a 100-column
    layer norm into 128 registers."""
    if loops:
        name, ext, _ = loops[-1]
        loops[-1] = (name, ext, -1 if isinstance(ext, int) and ext <= UNROLL_WHOLE else UNROLL_STEP)
    return loops


#: an unstaged reduction's innermost loop is unrolled whole up to this many points (a 3x3 window's 3), else by
#: UNROLL_STEP; outer loops are not unrolled
UNROLL_WHOLE = 8
UNROLL_STEP = 8


def _unshared(expr: TensorExpr) -> bool:
    """Whether every input of the body moves with every spatial axis (a pooling window, not a convolution's
    shared weights)."""
    spatial = {a.name for a in expr.spatial_axes}
    return all(spatial <= set(expr.axes_of(t.name)) for t in expr.body_inputs)


def reduce_loops(reduce: list[AxisPlan], window: bool = False) -> list[tuple[str, int | str, int]]:
    """The loop nest that walks an unstaged reduction, one loop per reduction axis, outermost first. Nested
    loops with constant trip counts, not one flat loop that decodes each point: the compiler then moves each
    address's outer terms out of the inner loops (a 3x3 convolution on PoCL: 200 GFLOP/s nested, 92-135 flat
    with the same tile). A pooling window (``window``: no read shared between outputs, at most UNROLL_WINDOW
    points) is unrolled whole: the rows a thread's tile shares between its outputs are then loaded once (a 3x3
    average pool 2-2.5x faster; a depthwise convolution, whose weights are shared, ran 0.8-1.0x as fast so)."""
    loops: list[tuple[str, int | str, int]] = [(ax.name, ax.extent_c or ax.extent, 0) for ax in reduce]
    if window and loops and all(isinstance(e, int) for _, e, _ in loops) and \
            math.prod(int(e) for _, e, _ in loops) <= UNROLL_WINDOW:
        return [(n, e, -1) for n, e, _ in loops]
    return _unrolled(loops)


#: a pooling window of at most this many points is unrolled whole (reduce_loops)
UNROLL_WINDOW = 16


def _vec_plan(expr: TensorExpr, spatial: list[AxisPlan], inputs: list[TensorPlan],
              epilogue_inputs: list[TensorPlan], out: TensorPlan, d: Dialect,
              streaming: Streaming | None = None) -> VecPlan | None:
    """The vector form of a CPU kernel's register tile, or None where it does not apply: no spatial axis, a
    last-axis thread run that no vector width divides, or a tensor that is not the accumulator's type (the
    vector path would need conversions). With ``streaming``, its whole vectors may store past the caches
    (``_streamed``)."""
    if not spatial:
        return None
    ax = spatial[-1]
    width = vector_width(ax.thread)
    acc = d.ctype[expr.acc_dtype]
    if not width or any(d.ctype[t.dtype] != acc for t in (*expr.inputs, expr.output)):
        return None
    vtype = f"{acc}{width}"
    partial = {a.name: a.extent for a in spatial if a.extent % a.block}
    contiguous = out.view is None and _flat_coef(expr.out_index, out.strides, ax.name) == 1

    # Spatial axes along which a read gathered along the vector axis can load whole vectors instead (a
    # transpose): their thread runs are whole vectors and no tile is partial along them or the vector axis.
    across = {a.name: a.jdiv for a in spatial[:-1] if a.thread % width == 0 and not a.extent % a.block} \
        if not ax.extent % ax.block else {}

    def body(clamp: dict[str, int], plans: list[TensorPlan] = inputs) -> str:
        reads = {}
        for tp in plans:   # the unstaged plans lower() made, in expr.inputs order
            for idx in expr.accesses(tp.name):
                reads[(tp.name, idx)] = _vector_read(tp, idx, ax.name, ax.extent, width, vtype, expr.pad_value, d,
                                                     clamp, across, aligned=not ax.block % width)
        def axis_v(a: str) -> str:
            lanes = f" + ({vtype})({', '.join(f'{k}.0f' for k in range(width))})" if a == ax.name else ""
            return f"(({vtype})((float){var_global(a)}){lanes})"

        return render_body(expr.body, d, lambda r: reads[(r.tensor, r.index)], vtype, axis_v)

    def epilogue(clamp: dict[str, int]) -> str:
        return render_epilogue(expr, d, epilogue_inputs, "rl_vr0", lambda tp, idx: _vector_read(
            tp, idx, ax.name, ax.extent, width, vtype, expr.pad_value, d, clamp), vtype)

    def guard(axes: dict[str, int]) -> str:
        return " && ".join(f"rl_g_{a} < {n}" for a, n in axes.items())

    rows = {a: n for a, n in partial.items() if a != ax.name}
    offset = ""
    if contiguous:
        offset = " + ".join(f"({_affine_c(i, var_global)}) * {s}" if s != 1 else f"({_affine_c(i, var_global)})"
                            for i, s in zip(expr.out_index, out.strides))
    inside = VecFlavor("", body(rows), offset, guard(rows), not offset, guard(rows), epilogue=epilogue(rows))
    flavors = [inside]
    if ax.name in partial:
        start = f"rl_s_{ax.name} + rl_t_{ax.name} * {ax.thread}"
        inside.cond = f"{start} + {ax.thread} <= {ax.extent}"
        # Runs start at multiples of the thread's run, so at most one crosses the end, and at a position known
        # here: given as a constant, its lane tests fold away. With a run-time start they stayed, and the
        # crossing threads gathered and stored lane by lane: 8x16 tiles of a 97x31x13 matmul ran 1.8x slower
        # than 4x32 ones, whose single run's start was a constant anyway (docs/opencl.md).
        cross = ax.extent // ax.thread * ax.thread
        if ax.extent % ax.thread:
            if ax.blocks * ax.block // ax.thread > cross // ax.thread + 1:
                flavors.append(VecFlavor(f"{start} >= {ax.extent}", "", "", "", False, "", skip=True))
            # Across the axis's end, the vectors wholly inside are still stored as one.
            whole = " && ".join(filter(None, [guard(rows), f"rl_g_{ax.name} + {width - 1} < {ax.extent}"]))
            flavors.append(VecFlavor("", body(partial), offset, whole, True, guard(partial), run_start=cross,
                                     epilogue=epilogue(partial)))
    bounds = _interior(expr, spatial, inputs, rows)
    if bounds:
        # First, the threads whose windows stay inside the tensors read without bounds tests.
        narrowed = [replace(tp, ranges={**tp.ranges, **{a: hi for a, (_, hi) in bounds.items()}},
                            lows={a: lo for a, (lo, _) in bounds.items()}) for tp in inputs]
        runs = {a.name: (f"rl_s_{a.name} + rl_t_{a.name} * {a.thread}", a.thread) for a in spatial}
        tests = [f"{runs[a][0]} >= {lo}" for a, (lo, _) in bounds.items() if lo > 0] + \
                [f"{runs[a][0]} + {runs[a][1] - 1} <= {hi}" for a, (_, hi) in bounds.items()]
        flavors.insert(0, replace(inside, cond=" && ".join(filter(None, [*tests, inside.cond])),
                                  body=body(rows, narrowed)))
    stream = offset and streaming is not None and _streamed(expr, ax, width, out, d, streaming)
    return VecPlan(width, ax.name, vtype, flavors,
                   stream=d.streaming_store.format(v="rl_vr", vtype=vtype, ptr="{ptr}") if stream else "")


def _interior(expr: TensorExpr, spatial: list[AxisPlan], inputs: list[TensorPlan],
              clamp: dict[str, int]) -> dict[str, tuple[int, int]]:
    """The range of each spatial axis inside which a window read needs no bounds test (a pooling window's
    ``h + r - 1`` for every ``r``), where some thread's run lies wholly inside it: ``{axis: (lo, hi)}``. Only
    dimensions indexed by one spatial axis (with a positive step) and reduction axes count. A 3x3 average pool
    read its input unpadded with a bounds test on each of its nine loads per output vector, at 0.40x of a copy
    kernel; a kernel reading a padded copy without them ran at 0.6-0.96x (docs/opencl.md)."""
    names = {a.name: a for a in spatial}
    bounds: dict[str, tuple[int, int]] = {}
    for tp in inputs:
        if tp.view is not None:
            continue
        maxes = _maxes(tp, clamp)
        for idx in expr.accesses(tp.name):
            for dim, i in enumerate(idx):
                moving = [(a, c) for a, c in i.terms if a in names]
                if len(moving) != 1 or moving[0][1] <= 0 or not _guarded(tp, dim, i, maxes):
                    continue
                a, c = moving[0]
                low, high = _span(Affine(tuple((r, cr) for r, cr in i.terms if r != a), i.const), tp.lows, maxes)
                lo = -(low // c)   # the ceiling of -low / c
                hi = (tp.sizes[dim] - 1 - high) // c
                was = bounds.get(a, (lo, hi))
                bounds[a] = (max(was[0], lo), min(was[1], hi))
    return {a: (lo, hi) for a, (lo, hi) in bounds.items()
            if names[a].thread <= hi - lo + 1 and (lo > 0 or hi < names[a].extent - 1)}


def _flat_coef(idx: tuple[Affine, ...] | list[Affine], strides: list[int], axis: str) -> int:
    """How far one step along ``axis`` moves the flat (row-major) offset of a plain tensor index."""
    return sum(i.coefs.get(axis, 0) * s for i, s in zip(idx, strides))


def _vector_read(tp: TensorPlan, idx: tuple[Affine, ...], axis: str, axis_extent: int, width: int, vtype: str,
                 pad: float, d: Dialect, clamp: dict[str, int], across: dict[str, int] | None = None,
                 aligned: bool = False) -> str:
    """``width`` adjacent points of one read along ``axis``: one broadcast element, one vector load, or (a
    view, a stride, a guard that differs from lane to lane, a run across the axis's end) the lanes' scalar
    reads gathered into a vector. Plain indices of the axes in ``clamp`` are clamped into range, as in the
    scalar path. ``aligned``: the runs along ``axis`` start at multiples of ``width``, so that a window's
    vectors across the tensor's edge load whole (_border_vector)."""
    def lane(k: int) -> Callable[[str], str]:
        return lambda a: f"({var_global(a)} + {k})" if a == axis and k else var_global(a)

    if not any(i.coefs.get(axis, 0) for i in idx):
        step: int | None = 0  # the same element for every lane, through a view or not
    else:
        step = _flat_coef(idx, tp.strides, axis) if tp.view is None else None
    if step == 0:
        return f"(({vtype})({_global_read(tp, idx, var_global, pad, d, clamp)}))"
    def gathered() -> str:
        return f"({vtype})({', '.join(_global_read(tp, idx, lane(k), pad, d, clamp) for k in range(width))})"

    if step == 2 and width > 1 and tp.view is None:
        return _stride2_read(tp, idx, axis, axis_extent, width, vtype, d, clamp, lane, gathered)
    if step != 1:
        return (_transposed_read(tp, idx, axis, width, vtype, across, d) if across and step is not None else None) \
            or gathered()
    # In a run that crosses the axis's end (``axis`` in ``clamp``) the vectors wholly inside it still load
    # as one: the address is not clamped along the axis, and a test that the last lane is inside picks the
    # load; the vector across the end gathers its lanes clamped.
    rows = {a: n for a, n in clamp.items() if a != axis}
    # Inside the run (or a run wholly inside the axis) the lanes stay inside the axis's extent.
    inside = {axis: axis_extent}
    conds, offs = _global_address(tp, idx, var_global, rows, d, inside)
    load = f"vload{width}(0, {tp.name} + {offs})"
    ends = [f"{var_global(axis)} + {width - 1} < {clamp[axis]}"] if axis in clamp and any(
        i.plain_axis() == axis for i in idx) else []
    # A window that moves with the lanes (a convolution's w + s - 1): the lanes' indices are affine, so the
    # first and last lane inside the tensor means all are, and the run is one load; at a border, gather.
    maxes = _maxes(tp, rows, inside)
    moving = any(_guarded(tp, dim, i, maxes) and i.coefs.get(axis, 0) for dim, i in enumerate(idx))
    if moving:
        ends += _global_address(tp, idx, lane(width - 1), rows, d, inside)[0]
        border = None if axis in clamp or not aligned else \
            _border_vector(tp, idx, axis, width, vtype, pad, d, rows, inside, conds)
        if border is not None:
            return f"({' && '.join(dict.fromkeys(conds + ends))} ? {load} : {border(gathered())})"
    if ends:
        return f"({' && '.join(dict.fromkeys(conds + ends))} ? {load} : {gathered()})"
    if conds:
        return f"({' && '.join(conds)} ? {load} : ({vtype})({_c_float(pad, d)}))"
    return load


def _border_vector(tp: TensorPlan, idx: tuple[Affine, ...], axis: str, width: int, vtype: str, pad: float,
                   d: Dialect, rows: dict[str, int], inside: dict[str, int],
                   conds: list[str]) -> Callable[[str], str] | None:
    """A window's vector across a tensor's edge (``w + s - 1`` for the run's first or last vector) as one load
    of the vector at the edge and its lanes moved over, the pad value in the lanes outside, instead of its lanes
    gathered one by one: for each number of lanes outside that the window can reach, a test of the first
    lane's index picks the version. The result takes the gathered vector as the last resort (``None`` where this
    does not apply: the lanes move along a dimension that is not contiguous, or along more than one). A 3x3
    average pool's border vectors gathered eight lanes each, one of nine loads for every row's first and last
    vector, and ran at 0.60x of a copy kernel; without them 0.95x (docs/opencl.md)."""
    maxes = _maxes(tp, rows, inside)
    guarded = [dim for dim, i in enumerate(idx) if _guarded(tp, dim, i, maxes)]
    moving = [dim for dim in guarded if idx[dim].coefs.get(axis, 0)]
    if tp.view is not None or len(moving) != 1 or len(conds) != len(guarded):
        return None
    dm = moving[0]
    i = idx[dm]
    size = tp.sizes[dm]
    if i.coefs[axis] != 1 or tp.strides[dm] != 1 or size < width or any(a in rows for a, _ in i.terms) or \
            any(j.coefs.get(axis, 0) for dim, j in enumerate(idx) if dim != dm):
        return None
    # The vector's first lane sits at a multiple of the width (aligned runs), its last inside the axis.
    low, high = _span(Affine(tuple((a, c) for a, c in i.terms if a != axis), i.const), tp.lows, maxes)
    low += -(-tp.lows.get(axis, 0) // width) * width
    high += (maxes[axis] - width + 1) // width * width
    left, right = min(width - 1, -low), min(width - 1, high + width - size)
    if left <= 0 and right <= 0:
        return None
    q0 = f"({_affine_c(i, var_global, d.wide_int)})"
    fill = _c_float(pad, d)

    def at(first: int) -> str:
        moved = tuple(Affine((), first) if dim == dm else j for dim, j in enumerate(idx))
        return f"vload{width}(0, {tp.name} + {_global_address(tp, moved, var_global, rows, d, inside)[1]})"

    versions = [(f"{q0} == -{k}", f"({vtype})({', '.join([fill] * k + _lanes(at(0), range(width - k)))})")
                for k in range(1, left + 1)]
    versions += [(f"{q0} == {size - width + k}",
                  f"({vtype})({', '.join(_lanes(at(size - width), range(k, width)) + [fill] * k)})")
                 for k in range(1, right + 1)]
    others = [c for dim, c in zip(guarded, conds) if dim != dm]

    # Where the versions cover every first lane the window reaches outside the tensor, the last needs no test
    # and nothing is gathered: the gathered lanes' code, folded away only after unrolling, kept PoCL from
    # unrolling the register tile's loop at all.
    covered = -low < width and high + width - size < width

    def chain(fallback: str) -> str:
        out = versions[-1][1] if covered else fallback
        for test, vec in reversed(versions[:-1] if covered else versions):
            out = f"({test} ? {vec} : {out})"
        return f"({' && '.join(others)} ? {out} : ({vtype})({fill}))" if others else out

    return chain


def _lanes(vector: str, ks: range) -> list[str]:
    """Lanes ``ks`` (consecutive) of an OpenCL vector expression, as component selections of at most four."""
    out, ks_list = [], list(ks)
    for n in range(0, len(ks_list), 4):
        part = ks_list[n:n + 4]
        out.append(f"{vector}.s{''.join(format(k, 'x') for k in part)}")
    return out


def _stride2_read(tp: TensorPlan, idx: tuple[Affine, ...], axis: str, axis_extent: int, width: int, vtype: str,
                  d: Dialect, clamp: dict[str, int], lane: Callable[[int], Callable[[str], str]],
                  gathered: Callable[[], str]) -> str:
    """A run that moves by two elements per lane (a stride-2 window, ``2w + s``) as two contiguous loads of
    ``width`` and their even and odd lanes: the first load holds lanes 0..width/2-1 at its even positions,
    the second, one element short of the first's end, the rest at its odd ones, so the two span exactly the
    lanes' elements and stay inside the tensor wherever the lanes do. Only where no lane needs a bounds test
    (an input read from its padded copy): with a test per read, PoCL kept both the loads and the gathered
    lanes, and took 75-95 s to compile 7x7 stride-2 convolutions. A depthwise 3x3 stride-2 convolution
    gathered its 16 lanes one by one at 0.16-0.21x onnxruntime."""
    rows = {a: n for a, n in clamp.items() if a != axis}
    inside = {axis: axis_extent}
    conds, offs = _global_address(tp, idx, var_global, rows, d, inside)
    if conds or _global_address(tp, idx, lane(width - 1), rows, d, inside)[0]:
        return gathered()
    first = f"vload{width}(0, {tp.name} + {offs})"
    second = f"vload{width}(0, {tp.name} + {offs} + {width - 1})"
    load = f"(({vtype})({first}.even, {second}.odd))"
    if axis in clamp:
        # the vector across the end of a clamped run gathers its lanes clamped; the test folds where the run's
        # start is a constant (the edge version, VecFlavor.run_start)
        return f"({var_global(axis)} + {width - 1} < {clamp[axis]} ? {load} : {gathered()})"
    return load


def _transposed_read(tp: TensorPlan, idx: tuple[Affine, ...], axis: str, width: int, vtype: str,
                     across: dict[str, int], d: Dialect) -> str | None:
    """A read strided along the vector axis and contiguous along another spatial axis of the thread tile (a
    transpose's ``X[i0,i1]`` for lanes along ``i0``), as ``width`` vector loads along that other axis, each
    giving one lane: the same loads serve the ``width`` vectors of the tile that lie along it, which the
    compiler shares (one vector load per lane instead of one scalar load per lane and vector). ``across``:
    the spatial axes whose thread runs are whole vectors and whose tiles are never partial, each with its
    decode divisor in the register-tile point index. None where no such axis is contiguous in the tensor."""
    for other, jdiv in across.items():
        if _flat_coef(idx, tp.strides, other) != 1 or _global_address(tp, idx, var_global, None, d)[0]:
            continue
        at = f"((rl_j / {jdiv}) % {width})"   # a constant once the register tile's loop is unrolled

        def lane(k: int, other: str = other, at: str = at) -> Callable[[str], str]:
            return lambda a: (f"({var_global(a)} + {k})" if a == axis else
                              f"({var_global(a)} - {at})" if a == other else var_global(a))

        loads = [f"vload{width}(0, {tp.name} + {_global_address(tp, idx, lane(k), None, d)[1]})[{at}]"
                 for k in range(width)]
        return f"({vtype})({', '.join(loads)})"
    return None


def var_global(ax: str) -> str:
    return f"rl_g_{ax}"


def _stage_vector(tp: TensorPlan, accs: list, block: Mapping[str, int], low: int, itemsize: int,
                  pad_value: float, d: Dialect) -> int:
    """Elements per 16-byte load with which ``tp``'s tile can be staged, or 0. Each vector must be whole inside or
    whole outside the tensor and aligned in global and shared memory: a plain row-major tensor read through one
    access whose last index moves by whole vectors from tile to tile (every term's coefficient times its block
    extent, and the lowest offset, multiples of the vector), a row length and a tile row that are multiples of
    it, shared rows (padding included) of whole 16-byte units, and zero for the points outside (a max-pool's
    -inf padding stages element by element). On an H200 the float16 tensor-core GEMMs staged 2-byte elements one
    by one and ran at 48-58 TFLOP/s against cuBLAS's 380-400 (BENCHMARKS.md, GPU)."""
    if not d.stage_vector or tp.view is not None or len(accs) != 1 or not tp.dims or pad_value != 0.0:
        return 0
    v = 16 // itemsize
    if v < 2 or tp.strides[-1] != 1 or len(tp.sizes) != len(tp.dims):
        return 0
    last = accs[0][-1]
    if tp.sizes[-1] % v or tp.dims[-1].extent % v or low % v:
        return 0
    if any(c * block[a] % v for a, c in last.terms):
        return 0
    if len(tp.smem_strides) > 1 and tp.smem_strides[-2] * itemsize % 16:
        return 0
    return v


def _tensor_plan(t: TensorDecl, d: Dialect) -> TensorPlan:
    # A view that is a plain row-major reshape (the weight of an implicit GEMM) needs no decode.
    if t.view is not None and not t.view.is_reshape():
        v = t.view
        subs = [list(reversed(dim)) for dim in v.dims]
        # Sub-axis values come from decoding a virtual index: each lies in [0, its extent).
        sub_ranges = {name: ext - 1 for dim in v.dims for name, ext in dim}
        types = [index_types(i, sub_ranges, d) for i in v.index]
        src = [_affine_c(i, lambda a: f"rl_v_{a}", "" if it == "int" else it) for i, (it, _) in zip(v.index, types)]
        vp = ViewPlan(subs, src, list(v.source_shape), _strides(v.source_shape), list(t.shape),
                      [it for it, _ in types], [ut for _, ut in types])
        return TensorPlan(t.name, d.ctype[t.dtype], list(t.shape), _strides(t.shape), vp)
    return TensorPlan(t.name, d.ctype[t.dtype], list(t.shape), _strides(t.shape))


def _maxes(tp: TensorPlan, clamp: dict[str, int] | None, exact: dict[str, int] | None = None) -> dict[str, int]:
    """The largest value each axis variable takes in a read: an axis in ``clamp`` is clamped to its extent
    (points past the end compute values that are never stored), an axis in ``exact`` stays inside its extent
    on its own (a vector run wholly inside), others run to the end of their tiles (``tp.ranges``)."""
    out = dict(tp.ranges)
    for ax, n in {**(clamp or {}), **(exact or {})}.items():
        out[ax] = min(out.get(ax, n - 1), n - 1)
    return out


def _guarded(tp: TensorPlan, dim: int, i: Affine, maxes: dict[str, int]) -> bool:
    """Whether an index can leave the tensor for axis values in [0, ``maxes``] (a window over padding, an
    offset, a stride past the end): it is tested, and outside reads give the pad value. An input read from a
    padded copy (``RProgram.pads``) never leaves it, so its windows need no test."""
    lo, hi = _span(i, tp.lows, maxes)
    return lo < 0 or hi >= tp.sizes[dim]


def _span(i: Affine, lows: Mapping[str, int], maxes: Mapping[str, int]) -> tuple[int, int]:
    """The least and greatest value of ``i`` for each axis in [``lows`` (default 0), ``maxes``]."""
    lo = hi = i.const
    for ax, c in i.terms:
        ends = (c * lows.get(ax, 0), c * max(maxes.get(ax, 0), 0))
        lo += min(ends)
        hi += max(ends)
    return lo, hi


def _global_address(tp: TensorPlan, idx: tuple[Affine, ...], var: Callable[[str], str],
                    clamp: dict[str, int] | None, d: Dialect,
                    exact: dict[str, int] | None = None) -> tuple[list[str], str]:
    """(bounds tests, flat offset) of a plain tensor's read. Axis variables in ``clamp`` are clamped into
    their extent wherever they appear (an overhanging tile's reads stay where the tile's last point reads)."""
    conds = []
    offs = []
    maxes = _maxes(tp, clamp, exact)
    clamped = (lambda ax: f"min({var(ax)}, {clamp[ax] - 1})" if ax in clamp else var(ax)) if clamp else var
    for dim, i in enumerate(idx):
        itype, utype = index_types(i, tp.ranges, d)
        plain = i.plain_axis()
        wide = "" if itype == "int" else itype
        c = (f"({wide}){clamped(plain)}" if wide else clamped(plain)) if plain is not None else \
            _affine_c(i, clamped, wide)
        if _guarded(tp, dim, i, maxes):
            conds.append(f"({utype})({c}) < {tp.sizes[dim]}u")
        offs.append(f"({c}) * {tp.strides[dim]}" if tp.strides[dim] != 1 else f"({c})")
    return conds, " + ".join(offs) or "0"


def _global_read(tp: TensorPlan, idx: tuple[Affine, ...], var: Callable[[str], str], pad: float,
                 d: Dialect, clamp: dict[str, int] | None = None) -> str:
    """A read straight from global memory: plain indices of clamped axes are clamped into range, other
    indices that can leave the tensor are guarded and read as the pad value."""
    if tp.view is not None:
        return _view_read(tp, idx, var, pad, d, clamp)
    conds, off = _global_address(tp, idx, var, clamp, d)
    load = d.load(tp.ctype, f"{tp.name}[{off}]")
    if not conds:
        return load
    return f"({' && '.join(conds)} ? {load} : {_c_float(pad, d)})"


def _view_read(tp: TensorPlan, idx: tuple[Affine, ...], var: Callable[[str], str], pad: float, d: Dialect,
               clamp: dict[str, int] | None) -> str:
    """A gathered read (an im2col view) as one expression: the virtual index is decoded into sub-axes inline
    (the compiler shares the repeated divisions), then the source index is guarded against the pad region."""
    assert tp.view is not None
    v = tp.view
    subs: dict[str, str] = {}
    for dim, (i, parts) in enumerate(zip(idx, v.subs)):
        plain = i.plain_axis()
        itype, _ = index_types(i, tp.ranges, d)
        virt = f"min({var(plain)}, {clamp[plain] - 1})" if plain and clamp and plain in clamp else \
            _affine_c(i, var, "" if itype == "int" else itype)
        div = 1
        for name, ext in parts:
            subs[name] = f"((({virt}) / {div}) % {ext})" if div > 1 else f"(({virt}) % {ext})"
            div *= ext
    conds, offs = [], []
    for dim, e in enumerate(v.src_index):
        c = e
        for name, text in sorted(subs.items(), key=lambda kv: -len(kv[0])):
            c = c.replace(f"rl_v_{name}", text)
        conds.append(f"({v.src_utypes[dim]})({c}) < {v.src_sizes[dim]}u")
        offs.append(f"({c}) * {v.src_strides[dim]}" if v.src_strides[dim] != 1 else f"({c})")
    load = d.load(tp.ctype, f"{tp.name}[{' + '.join(offs)}]")
    return f"({' && '.join(conds)} ? {load} : {_c_float(pad, d)})"
