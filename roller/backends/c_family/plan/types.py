"""The kernel plan's data: what an rProgram is lowered to for every C-family kernel (OpenCL, CUDA, HIP).

Plain dataclasses that hold decode divisors, tile extents, and index expressions as one-line C expressions,
and nothing that computes them: the shared Jinja2 template (``templates/kernel.j2``) and the dialect templates
print these, the CUDA matrix path and the launch description read them, and a test compares two backends'
plans field by field. Kept apart from the lowering (``lowering.py`` and the modules it uses) so that what a
kernel is made of can be read, and imported, without the code that decides and builds it.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace


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
    # GPU dialects: whole vectors of an op with no reuse (RProgram.vector) load and store as aligned structs of
    # this many bytes at most (plan/vector.py, stream_plan); 0: such programs are not rendered
    stream_bytes: int = 0
    # a store of one whole vector past the caches ({v}: the vector, {vtype}: its type, {ptr}: where, aligned to
    # the vector's size), for outputs larger than the caches (schedule.streamed); "": none
    streaming_store: str = ""
    # 64-bit integer types, for index arithmetic that 32 bits cannot hold (see cexpr.index_types)
    wide_int: str = "long long"
    wide_uint: str = "unsigned long long"
    # every tensor index in 64 bits: on a CPU a 32-bit index is summed, then sign-extended before each load
    # (lea + movslq per broadcast in a convolution's inner loop: PoCL's 3x3 convolutions ran 1.0-2.2x faster
    # with 64-bit indices, none slower, in one process)
    wide_index: bool = False
    # storage ctype -> (to_acc, from_acc) where a plain cast does not convert (OpenCL keeps float16 as the bits
    # in a ushort: without cl_khr_fp16 there is no half arithmetic, and helpers convert the bits)
    conversions: dict[str, tuple[str, str]] = field(default_factory=dict)
    # storage ctype -> (vector load, vector store) where vloadN/vstoreN do not convert: {w} the width, {ptr} the
    # first element's address, {v} the vector stored (OpenCL converts vectors of float16 bits to and from floatN,
    # rounding to nearest even as its scalar rl_f2h does: float16 kernels vectorise like float32 ones)
    vector_io: dict[str, tuple[str, str]] = field(default_factory=dict)
    language: str = "C"  # for messages
    warp_lanes: int = 0  # threads that issue as one (a CUDA warp); 0: none the plan arranges for
    # staging threads walk a gathered view along its longest contiguous run (schedule.stage_order); off: along
    # its last dimension. Off for HIP: hipcc kept more registers live (an 896-thread convolution on mi100
    # went from 64 VGPRs, the cap at that block size, to 68), and no AMD GPU has measured the gain
    coalesce_gathers: bool = False
    # the unsigned type of each integer element type (typed bodies wrap through it, plan/typed.py)
    unsigned: dict[str, str] = field(default_factory=dict)
    helper_qual: str = "inline"  # how a helper function is declared (typed bodies' conversions, divisions)
    real: str = "float"  # the C type a float body computes in: double in a kernel that holds a float64 tensor

    def for_float64(self) -> Dialect:
        """This dialect for a kernel that computes in float64 (``roller.ir.types``): the same spellings with
        ``double`` where float32 ones say ``float``, literals without the float suffix (``0.1f`` is not 0.1 in
        double), and conversions through float32 (float16's helpers take and give float32)."""
        wide = self.ctype["float64"]
        # The C library's float functions (expf, CUDA's and HIP's spelling) by their double names.
        funcs = {k: re.sub(r"\b(exp|log|sqrt|rsqrt|tanh|erf|fabs|cos|sin|rint|pow|fmod)f\(", r"\1(", v)
                 for k, v in self.funcs.items()}
        return replace(self, real=wide, float_suffix="", to_acc=f"({wide})({{x}})", funcs=funcs,
                       conversions={c: (f"(({wide}){load})", store.replace("{x}", "(float)({x})"))
                                    for c, (load, store) in self.conversions.items()},
                       vector_io={})

    def load(self, ctype: str, x: str) -> str:
        """Element ``x`` of storage type ``ctype`` as the accumulator type."""
        return self.conversions.get(ctype, (self.to_acc, ""))[0].format(x=x)

    def store(self, ctype: str, x: str) -> str:
        """Accumulator value ``x`` as storage type ``ctype``."""
        return self.conversions.get(ctype, ("", self.from_acc))[1].format(ctype=ctype, x=x)

    def vector_type_ok(self, ctype: str, acc: str) -> bool:
        """Whether elements of ``ctype`` load and store as vectors of ``acc`` (the same type, or converted)."""
        return ctype == acc or ctype in self.vector_io

    def vload(self, ctype: str, width: int, ptr: str) -> str:
        """``width`` elements of storage type ``ctype`` from ``ptr`` as one accumulator vector."""
        return self.vector_io.get(ctype, ("vload{w}(0, {ptr})", ""))[0].format(w=width, ptr=ptr)

    def vstore_format(self, ctype: str) -> str:
        """How an accumulator vector ``{v}`` of width ``{w}`` is stored at ``{ptr}`` as ``ctype``."""
        return self.vector_io.get(ctype, ("", "vstore{w}({v}, 0, {ptr})"))[1]


@dataclass
class DimPlan:
    extent: int
    div: int  # decode divisor of a linear index over this tile
    origin: str = "0"  # C expression: first tensor index of the tile in this dimension
    itype: str = "int"  # C type of the tensor index in this dimension (64 bits where 32 cannot hold it)
    utype: str = "unsigned"  # its unsigned type, for the one-comparison bounds test
    # the dimension the staging threads walk fastest, whose extent divides the block: each thread stages the
    # same coordinate of it throughout, decoded from the thread id once (its gather decode then leaves the loop)
    per_thread: bool = False


@dataclass
class ViewPlan:
    """Decode of a virtual index into sub-axes (innermost first) and the source index they give."""

    subs: list[list[tuple[str, int]]]  # per virtual dim, sub-axes innermost first
    src_index: list[str]  # C expression per source dimension, over the sub-axis variables
    src_sizes: list[int]
    src_strides: list[int]
    virtual_sizes: list[int]
    src_itypes: list[str] = field(default_factory=list)  # C type of each source index (see cexpr.index_types)
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
    # stay inside the tensor: schedule.interior)
    lows: dict[str, int] = field(default_factory=dict)
    # an integer or bool tensor: read as it is stored (a typed body converts it where it is used, plan/typed.py)
    raw: bool = False


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
    # spatial, threads interleaved (not ``KernelPlan.blocked``): points a thread owns contiguously, runs
    # ``threads`` x ``run`` apart (RProgram.shared_vector: a staged row read in vectors); 1: point by point
    run: int = 1


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
    # {ptr}, aligned: schedule.streamed); "": vstoreN
    stream: str = ""


@dataclass
class StreamPlan:
    """An op with no reuse in vectors along its one contiguous axis (RProgram.vector): ``per_thread`` vectors of
    ``width`` elements a thread, loaded before the first is used, the ``extent`` // ``width`` whole vectors in
    chunks of block x ``per_thread`` walked by a grid-stride loop, and a scalar grid-stride loop over the rest
    (the tail past the last whole vector, or everything when a buffer is not aligned to the vector)."""

    width: int
    per_thread: int
    extent: int
    itype: str                          # "int", or a 64-bit type where the indices pass 2^31
    structs: list[tuple[str, str, int]]  # (struct name, element ctype, bytes) of the vector types
    vtypes: dict[str, str]              # tensor -> its vector struct
    guard: bool                         # the last chunk is partial: each vector tests that it is whole
    body: str                           # a lane's value, from rl_x_<tensor>[rl_u].v[rl_k]
    scalar_body: str                    # an element's value, from <tensor>[rl_i]
    uses_axis: bool                     # the body reads the axis's value (rl_e, rl_i)

    @property
    def vectors(self) -> int:
        return self.extent // self.width


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
    real: str = "float"  # the C type float values compute in (Dialect.real: double where float64 is held)
    # typed bodies: how the accumulator's value is stored (plan/typed.py), and the helper functions they call
    typed_store: Callable[[str, str], str] | None = None
    helpers: str = ""
    stream: StreamPlan | None = None
    n_rtiles_c: str = ""  # the staged reduction's tile count where a reduced axis's extent is an argument
    out_vstore: str = "vstore{w}({v}, 0, {ptr})"  # how a vector of results is stored (Dialect.vstore_format)
    # bytes each staged buffer is aligned to: 16 where its rows are read in 16-byte vectors (RProgram.shared_vector),
    # which the compiler merges into one load only where it can prove the alignment; 0: the element's own
    smem_align: int = 0
    # the thread index the spatial decode reads in place of the thread id (schedule.warp_order); "": the id
    warp_tid: str = ""

    @property
    def scalars(self) -> list[str]:
        """The kernel's scalar (int) parameters, after its pointers."""
        return [RUNTIME_ARG] if self.runtime else []


#: the kernel parameter that carries the symbol's value to a kernel with runtime extents (RProgram.runtime)
RUNTIME_ARG = "rl_n"
