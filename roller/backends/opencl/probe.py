"""``roller hw probe``: the paper's one-time profiling of a device, for the local OpenCL device (pyopencl).

Micro-benchmarks measure what OpenCL does not report (global-memory bandwidth with a copy kernel, local-memory
bandwidth with a kernel that reads and writes ``__local`` arrays, FP32 throughput with independent FMA chains on
vector types), then the description's ``calibration``: the launch and per-work-group time of an empty kernel,
and the throughput of the kernels' register-tile loop by tile shape, with plain and with gathered (im2col)
reads; everything else comes from device queries. Bandwidths and the FMA throughput are the median of several
timed runs (``effective``) and the best run (``peak``), so ``effective <= peak`` always holds; calibration
values take the fastest run, the one least disturbed by other processes. The result is a YAML
description that ``roller.hw.load`` accepts.
"""
from __future__ import annotations

import datetime
import functools
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roller.backends.opencl.launcher import POCL_PLATFORM
from roller.ir.vector import vector_width

_COPY_SRC = r"""
__kernel void copy(__global const float4 *restrict src, __global float4 *restrict dst) {
    size_t i = get_global_id(0);
    dst[i] = src[i];
}
"""

# A transpose's stores without its shuffles: each work-item reads 16 rows' 64-byte vectors and writes them 16 rows
# apart in the other matrix, through the caches (vstore16) or past them (STREAM: clang's non-temporal store, what
# the OpenCL backend emits on a description with streaming_stores). Stores that miss the caches in a scattered
# order wait for each line to be read first; streamed, they do not.
_ROWS_SRC = r"""
__kernel void rows(__global const float *restrict a, __global float *restrict b, int n) {
    const int t = get_global_id(0);
    const int col = (t % (n / 16)) * 16;
    const int row = (t / (n / 16)) * 16;
    for (int r = 0; r < 16; ++r) {
        const float16 v = vload16(0, a + (long)(row + r) * n + col);
#ifdef STREAM
        __builtin_nontemporal_store(v, (__global float16 *)(b + (long)(col + r) * n + row));
#else
        vstore16(v, 0, b + (long)(col + r) * n + row);
#endif
    }
}
"""

# Each work-item owns K float4 slots of a __local array (stride = work-group size), reads all of them with four
# independent accumulators and writes two rotating slots back per iteration (so nothing can be hoisted).
_LOCAL_SRC = r"""
#define K 16
__kernel void lmem(__global float *out, int iters, __local float4 *buf) {
    const int lid = get_local_id(0);
    const int n = get_local_size(0);
    for (int j = 0; j < K; ++j) buf[lid + j * n] = (float4)(lid + j);
    float4 a0 = (float4)(0.0f), a1 = a0, a2 = a0, a3 = a0;
    for (int it = 0; it < iters; ++it) {
        #pragma unroll
        for (int j = 0; j < K; j += 4) {
            a0 += buf[lid + j * n];
            a1 += buf[lid + (j + 1) * n];
            a2 += buf[lid + (j + 2) * n];
            a3 += buf[lid + (j + 3) * n];
        }
        buf[lid + (it & (K - 1)) * n] = a0 + a1;
        buf[lid + ((it + 7) & (K - 1)) * n] = a2 - a3;
    }
    const float4 acc = a0 + a1 + a2 + a3;
    out[get_global_id(0)] = acc.x + acc.y + acc.z + acc.w;
}
"""
LOCAL_BYTES_PER_ITER = 16 * 16 + 2 * 16   # K float4 reads + 2 float4 writes per work-item and iteration

# CHAINS independent FMA chains on floatW vectors, unrolled; 2 * W * CHAINS * UNROLL FLOP per iteration.
_FLOPS_SRC = r"""
#define VT float{W}
__kernel void flops(__global float *out, int iters, float s) {{
    const float g = (float)get_global_id(0) * 1e-7f;
    const VT m = (VT)(s);
    const VT c = (VT)(0.999f);
{decl}
    for (int it = 0; it < iters; ++it) {{
#pragma unroll
        for (int u = 0; u < {U}; ++u) {{
{body}
        }}
    }}
    VT r = {total};
    out[get_global_id(0)] = {reduce};
}}
"""

_EMPTY_SRC = r"""
__kernel void empty(__global float *out) {
    if (get_global_id(0) == 0xffffffffu) out[0] = 1.0f;
}
"""

# One FMA chain per work-item: time that grows with ``iters`` and nothing else (no memory traffic).
_BUSY_SRC = r"""
__kernel void busy(__global float *out, int iters) {
    float a = (float)get_global_id(0);
    for (int i = 0; i < iters; ++i) a = fma(a, 0.999f, 1e-3f);
    if (a == -1.0f) out[0] = a;
}
"""
JOIN_TARGET_S = 1e-3   # one work-group's worth of the busy loop: long enough for the others to join
JOIN_TRIALS = 5

# The C-family kernels' inner loop on a CPU (roller/backends/c_family/templates/kernel.j2, vector path): each
# work-item keeps an R x C tile of accumulators as R x C/W vectors of W floats, and per reduction step loads R
# elements of A (each broadcast over a vector) and C of B (vector loads), and does R*C multiply-adds. A tile
# whose C no vector width divides is the scalar loop. What this reaches, by tile shape, is what the model uses
# for compute. The gathered variant has the reads of a convolution as an implicit GEMM: A through the im2col
# view of a 3x3 SAME convolution over 31x31 images (each element's index decoded with divisions and guarded
# against the padding), and B strided along the lanes, so gathered element by element.
_TILE_HEAD = r"""
#ifdef GATHER
#define Y(v, k) (((v) / 31) % 31 + ((k) / 3) % 3 - 1)
#define X(v, k) ((v) % 31 + (k) % 3 - 1)
#define A_AT(v, k) (((unsigned)Y(v, k) < 31u && (unsigned)X(v, k) < 31u) \
                    ? A[((k) / 9) * 961 + Y(v, k) * 31 + X(v, k)] : 0.0f)
#define B_AT(c, k) B[(c) * K + (k)]
#else
#define A_AT(v, k) A[(k) * (64 * R) + (v)]
#define B_AT(c, k) B[(k) * CC + (c)]
#endif
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void tile(__global const float *restrict A, __global const float *restrict B, __global float *restrict C) {
    const int g = get_global_id(0);
"""
_TILE_SCALAR = r"""
    float acc[R * CC];
    #pragma unroll
    for (int j = 0; j < R * CC; ++j) acc[j] = 0.0f;
    #pragma unroll 8
    for (int k = 0; k < K; ++k) {
        #pragma unroll
        for (int j = 0; j < R * CC; ++j)
            acc[j] += A_AT((g % 64) * R + j / CC, k) * B_AT(j % CC, k);
    }
    #pragma unroll
    for (int j = 0; j < R * CC; ++j) C[g * R * CC + j] = acc[j];
}
"""
_TILE_VECTOR = r"""
    VT acc[R * CC / VW];
    #pragma unroll
    for (int i = 0; i < R * CC / VW; ++i) acc[i] = (VT)(0.0f);
    #pragma unroll 8
    for (int k = 0; k < K; ++k) {
        #pragma unroll
        for (int i = 0; i < R * CC / VW; ++i) {
            const int c = (i % (CC / VW)) * VW;
            acc[i] += (VT)(A_AT((g % 64) * R + i / (CC / VW), k)) * B_VEC(c, k);
        }
    }
    #pragma unroll
    for (int i = 0; i < R * CC / VW; ++i) VSTORE(acc[i], 0, C + g * R * CC + i * VW);
}
"""


def _tile_source(cols: int) -> tuple[str, list[str]]:
    """The probe kernel for tiles ``cols`` wide, and its build options: vectors of the width the C-family
    lowering picks (roller/ir/vector.py), or the scalar loop."""
    width = vector_width(cols)
    if not width:
        return _TILE_HEAD + _TILE_SCALAR, []
    lanes = ", ".join(f"B_AT((c) + {i}, k)" for i in range(width))
    opts = [f"-DVW={width}", f"-DVT=float{width}", f"-DVSTORE=vstore{width}"]
    head = f"#ifdef GATHER\n#define B_VEC(c, k) ((VT)({lanes}))\n#else\n" \
           f"#define B_VEC(c, k) vload{width}(0, B + (k) * CC + (c))\n#endif\n"
    return head + _TILE_HEAD + _TILE_VECTOR, opts


TILE_SHAPES = ((1, 1), (4, 1), (16, 1), (1, 4), (2, 2), (4, 4), (8, 8), (16, 4), (1, 16), (2, 16), (4, 16),
               (8, 16), (16, 16), (4, 32), (8, 32), (2, 64))
TILE_SHAPES_QUICK = ((1, 1), (4, 4), (4, 16))
GATHER_SHAPES = ((1, 1), (4, 1), (16, 1), (1, 4), (4, 4), (8, 8), (16, 4), (1, 16), (4, 16), (8, 16), (16, 16),
                 (4, 32))
GATHER_SHAPES_QUICK = ((1, 1), (4, 4))


@dataclass
class ProbeResult:
    """What the probe found; ``to_yaml()`` writes it as a hardware description."""

    platform: str
    device: str
    driver: str
    device_type: str
    compute_units: int
    clock_mhz: int
    max_work_group_size: int
    local_mem_bytes: int
    local_mem_is_global: bool
    global_mem_bytes: int
    cacheline_bytes: int
    cache_bytes: int
    vector_width: int
    warp_size: int
    vector_registers: int
    native_vector_width: int = 1
    fp32_vector_width: int = 0
    global_gbps: list[float] = field(default_factory=list)
    # GB/s of the scattered 64-byte stores through the caches and past them (None: no streaming store builds)
    rows_gbps: tuple[float, float | None] | None = None
    local_gbps: list[float] = field(default_factory=list)
    fp32_tflops: list[float] = field(default_factory=list)
    launch_us: float = 0.0
    per_block_us: float = 0.0
    join_us: float | None = None   # None with one unit: nothing joins
    tile_gflops: list[tuple[int, int, float]] = field(default_factory=list)   # (rows, cols, GFLOP/s)
    gather_gflops: list[tuple[int, int, float]] = field(default_factory=list)
    seconds: float = 0.0

    def to_yaml(self, name: str = "probed-opencl") -> str:
        return _render_yaml(self, name)


def description_name(stem: str, default: str = "probed-opencl") -> str:
    """A description name from a file's stem: what a name may hold (letters, digits, '-', '_', '.'), since it
    reaches generated sources and cache keys."""
    # ASCII only: str.isalnum() also accepts 'é', which the loader's name pattern then rejects.
    return "".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "-" for c in stem).strip("-_.") or default


def _progress(msg: str, stream: Any = None) -> None:
    print(f"roller hw probe: {msg}", file=stream or sys.stderr, flush=True)


def _time(queue: Any, launch: Callable[[], Any], runs: int, cl: Any) -> list[float]:
    """Seconds per run; event profiling when available, wall clock otherwise."""
    launch().wait()   # warm-up (compilation of the work-group function, page faults)
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        ev = launch()
        ev.wait()
        wall = time.perf_counter() - t0
        try:
            dt = (ev.profile.end - ev.profile.start) * 1e-9
        except (cl.Error, RuntimeError):  # profiling not available on this queue
            dt = 0.0
        out.append(dt if dt > 0 else wall)
    return out


def _flops_source(width: int, chains: int, unroll: int) -> str:
    decl = "\n".join(f"    VT a{i} = (VT)(g + {i}.0f);" for i in range(chains))
    body = "\n".join(f"            a{i} = fma(a{i}, m, c);" for i in range(chains))
    total = " + ".join(f"a{i}" for i in range(chains))
    comps = [f"r.s{i:x}" for i in range(width)] if width > 1 else ["r"]
    return _FLOPS_SRC.format(W=width if width > 1 else "", decl=decl, body=body, total=total,
                             reduce=" + ".join(comps), U=unroll)


def probe(quick: bool = False, device_spec: str | None = None, log: Callable[[str], None] | None = None) \
        -> ProbeResult:
    """Measure the local OpenCL device. ``quick`` uses small sizes and few runs (for tests, a few seconds)."""
    from roller.backends.opencl.launcher import import_opencl, pick_device

    cl = import_opencl()   # with the PoCL settings the generated kernels run under, so the calibration measures that
    log = log or _progress
    start = time.perf_counter()
    dev = pick_device(device_spec)
    log(f"[1/7] device: {dev.name.strip()} ({dev.platform.name.strip()})")
    ctx = cl.Context([dev])
    try:
        queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    except (cl.Error, RuntimeError):
        queue = cl.CommandQueue(ctx)
    res = _query(cl, dev)
    runs = 3 if quick else 11
    options = ["-cl-fast-relaxed-math"]

    # -- global memory: copy kernel --------------------------------------------------------------------------
    mib = 32 if quick else 256
    nbytes = min(mib * 2**20, dev.max_mem_alloc_size // 2, dev.global_mem_size // 8)
    nbytes -= nbytes % (16 * 1024)
    log(f"[2/7] global-memory bandwidth: copying {nbytes // 2**20} MiB, {runs} runs")
    prog = cl.Program(ctx, _COPY_SRC).build(options=options)
    copy = cl.Kernel(prog, "copy")
    mf = cl.mem_flags
    src = cl.Buffer(ctx, mf.READ_ONLY, nbytes)
    dst = cl.Buffer(ctx, mf.WRITE_ONLY, nbytes)
    cl.enqueue_fill_buffer(queue, src, b"\x00\x00\x80\x3f", 0, nbytes).wait()
    cl.enqueue_fill_buffer(queue, dst, b"\x00\x00\x00\x00", 0, nbytes).wait()
    copy.set_args(src, dst)
    n4 = nbytes // 16
    wg = _work_group(dev, n4)
    times = _time(queue, lambda: cl.enqueue_nd_range_kernel(queue, copy, (n4,), (wg,)), runs, cl)
    res.global_gbps = [2 * nbytes / t / 1e9 for t in times]
    log(f"      median {statistics.median(res.global_gbps):.1f} GB/s, best {max(res.global_gbps):.1f} GB/s")
    src.release()
    dst.release()
    res.rows_gbps = _probe_streaming(cl, ctx, queue, dev, nbytes, runs, options)
    if res.rows_gbps is not None:
        plain, streamed = res.rows_gbps
        log(f"      rows of vectors 16 apart: {plain:.1f} GB/s through the caches, "
            + (f"{streamed:.1f} GB/s streamed" if streamed else "no streaming store"))

    # -- local memory ----------------------------------------------------------------------------------------
    k = 16
    lwg = max(1, min(64 if res.device_type == "cpu" else 256, dev.max_work_group_size,
                     dev.local_mem_size // (k * 16 * 2) or 1))
    groups = res.compute_units * (4 if quick else 16)
    iters = 256 if quick else 16384
    log(f"[3/7] local-memory bandwidth: {groups} work-groups of {lwg}, {iters} iterations, {runs} runs")
    prog = cl.Program(ctx, _LOCAL_SRC).build(options=options)
    lmem = cl.Kernel(prog, "lmem")
    out = cl.Buffer(ctx, mf.WRITE_ONLY, groups * lwg * 4)
    lmem.set_args(out, _np_int(iters), cl.LocalMemory(lwg * k * 16))
    times = _time(queue, lambda: cl.enqueue_nd_range_kernel(queue, lmem, (groups * lwg,), (lwg,)), runs, cl)
    moved = groups * lwg * iters * LOCAL_BYTES_PER_ITER
    res.local_gbps = [moved / t / 1e9 for t in times]
    log(f"      median {statistics.median(res.local_gbps):.1f} GB/s, best {max(res.local_gbps):.1f} GB/s")

    # -- FP32 FMA chains on vector types; the best of a few vector widths ---------------------------------------
    chains, unroll = 8, 2
    fwg = max(1, min(64 if res.device_type == "cpu" else 256, dev.max_work_group_size))
    fgroups = res.compute_units * (2 if quick else 32)
    fiters = 256 if quick else 16384
    widths = sorted({w for w in (4, 8, res.vector_width, res.native_vector_width) if w in (4, 8, 16)})
    log(f"[4/7] FP32 throughput: {chains} FMA chains on float{'/float'.join(map(str, widths))}, "
        f"{fgroups} work-groups of {fwg}")
    fout = cl.Buffer(ctx, mf.WRITE_ONLY, fgroups * fwg * 4)
    best: list[float] = []
    for width in widths:
        prog = cl.Program(ctx, _flops_source(width, chains, unroll)).build(options=options)
        flops_k = cl.Kernel(prog, "flops")
        flops_k.set_args(fout, _np_int(fiters), _np_float(0.5))
        times = _time(queue, functools.partial(cl.enqueue_nd_range_kernel, queue, flops_k, (fgroups * fwg,), (fwg,)),
                      runs, cl)
        flop = fgroups * fwg * fiters * unroll * chains * width * 2
        got = [flop / t / 1e12 for t in times]
        log(f"      float{width}: median {statistics.median(got) * 1e3:.1f} GFLOP/s, "
            f"best {max(got) * 1e3:.1f} GFLOP/s")
        if not best or statistics.median(got) > statistics.median(best):
            best, res.fp32_vector_width = got, width
    res.fp32_tflops = best
    _probe_overheads(cl, ctx, queue, res, quick, log)
    _probe_tiles(cl, ctx, queue, res, quick, log)
    res.seconds = time.perf_counter() - start
    return res


def _probe_streaming(cl: Any, ctx: Any, queue: Any, dev: Any, nbytes: int, runs: int,
                     options: list[str]) -> tuple[float, float | None] | None:
    """GB/s of the scattered-store kernel (_ROWS_SRC) on a square matrix of about ``nbytes``, through the caches
    and streamed; None where the matrix would be under 64 x 64."""
    n = int((nbytes // 4) ** 0.5) // 64 * 64
    if n < 64:
        return None
    mf = cl.mem_flags
    a = cl.Buffer(ctx, mf.READ_ONLY, n * n * 4)
    b = cl.Buffer(ctx, mf.WRITE_ONLY, n * n * 4)
    cl.enqueue_fill_buffer(queue, a, b"\x00\x00\x80\x3f", 0, n * n * 4).wait()
    items = (n // 16) ** 2
    wg = _work_group(dev, items)
    gbps: list[float | None] = []
    for extra in ([], ["-DSTREAM"]):
        try:
            kernel = cl.Kernel(cl.Program(ctx, _ROWS_SRC).build(options=options + extra), "rows")
        except (cl.Error, RuntimeError):   # an OpenCL compiler without clang's builtin
            gbps.append(None)
            continue
        kernel.set_args(a, b, _np_int(n))

        def launch(k: Any = kernel) -> Any:
            return cl.enqueue_nd_range_kernel(queue, k, (items,), (wg,))

        times = _time(queue, launch, runs, cl)
        gbps.append(2 * n * n * 4 / statistics.median(times) / 1e9)
    a.release()
    b.release()
    plain, streamed = gbps
    return None if plain is None else (plain, streamed)


#: how much faster the streamed rows must be for the description to say ``streaming_stores``
STREAMING_GAIN = 1.2


def _probe_overheads(cl: Any, ctx: Any, queue: Any, res: ProbeResult, quick: bool,
                     log: Callable[[str], None]) -> None:
    """Launch time of an empty kernel, and the time each further work-group adds on a unit: the least-squares
    slope of the time against the groups per unit, over 1 to 256 single-item groups per unit. Each point is
    the fastest of its runs (a median was thrown 30x off by one burst of load in a probe run)."""
    runs = 21 if quick else 101
    units = res.compute_units
    per_unit = (1, 8, 32) if quick else (1, 8, 32, 128, 256)
    log(f"[5/7] overheads: empty kernel, 1 to {per_unit[-1]} work-groups per unit, {runs} runs each")
    kern = cl.Kernel(cl.Program(ctx, _EMPTY_SRC).build(), "empty")
    out = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, 4)
    kern.set_args(out)
    launch = min(_time(queue, lambda: cl.enqueue_nd_range_kernel(queue, kern, (1,), (1,)), runs, cl))
    times = [min(_time(queue, functools.partial(cl.enqueue_nd_range_kernel, queue, kern, (n * units,), (1,)), runs,
                       cl))
             for n in per_unit]
    mx, my = statistics.mean(per_unit), statistics.mean(times)
    slope = sum((x - mx) * (y - my) for x, y in zip(per_unit, times)) / sum((x - mx) ** 2 for x in per_unit)
    # The description holds positive numbers; a slope lost in noise is recorded as (almost) nothing.
    res.launch_us = max(launch * 1e6, 1e-3)
    res.per_block_us = max(slope * 1e6, 1e-6)
    log(f"      launch {res.launch_us:.3g} us, {res.per_block_us * 1e3:.3g} ns per work-group and unit")
    if units > 1:
        res.join_us = _probe_join(cl, ctx, queue, units, 5 if quick else 31)
        log(f"      the other units start taking work-groups {res.join_us:.3g} us after the first")


def _probe_join(cl: Any, ctx: Any, queue: Any, units: int, runs: int) -> float:
    """Microseconds after the first unit that the others start taking work-groups. W: a busy loop of about
    JOIN_TARGET_S in one work-group; T: the same loop split over 8 x ``units`` work-groups. If the others
    start ``join`` after the first, units x T = W + (units - 1) x join. Medians of runs (what a typical run
    sees; the spread is wide, docs/model.md), the median of JOIN_TRIALS such estimates, at most W."""
    kern = cl.Kernel(cl.Program(ctx, _BUSY_SRC).build(), "busy")
    out = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, 4)
    groups = 8 * units

    def median_s(grid: int, iters: int, n: int) -> float:
        kern.set_args(out, _np_int(iters))
        runs_s = _time(queue, lambda: cl.enqueue_nd_range_kernel(queue, kern, (grid,), (1,)), n, cl)
        return statistics.median(runs_s)

    probe_iters = 1 << 16
    iters = max(groups, int(probe_iters * JOIN_TARGET_S / median_s(1, probe_iters, 5)) // groups * groups)
    joins = []
    for _ in range(JOIN_TRIALS):
        whole = median_s(1, iters, runs)
        split = median_s(groups, iters // groups, runs)
        joins.append(min(whole, max(0.0, (units * split - whole) / (units - 1))))
    return max(statistics.median(joins) * 1e6, 1e-3)


def l1_set_span(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """Bytes after which addresses share a set of this machine's level-1 data cache (its capacity / ways), from
    Linux's sysfs; None where that is not there or not a power of two."""
    for index in sorted(Path(root).glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
            ways = int((index / "ways_of_associativity").read_text())
        except (OSError, ValueError):
            continue
        if level != "1" or kind not in ("Data", "Unified") or ways < 1 or not size:
            continue
        units = {"K": 1024, "M": 1024 * 1024}
        try:
            nbytes = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
        except ValueError:
            return None
        span = nbytes // ways
        return span if span > 0 and span & (span - 1) == 0 else None
    return None


def _probe_tiles(cl: Any, ctx: Any, queue: Any, res: ProbeResult, quick: bool,
                 log: Callable[[str], None]) -> None:
    """FP32 throughput of the kernels' register-tile loop for a range of tile shapes, with plain and with
    gathered reads (best of the runs: the table ranks shapes, and the best run is the least disturbed by other
    processes)."""
    tables: tuple[tuple[list[str], Any, str], ...] = (([], TILE_SHAPES_QUICK if quick else TILE_SHAPES, "plain"),
              (["-DGATHER"], GATHER_SHAPES_QUICK if quick else GATHER_SHAPES, "gathered"))
    wg = 16 if res.device_type == "cpu" else 64
    # 32 groups per unit: kernels of 0.1-30 ms; with 8 the 30 us ones varied 2x between probe runs.
    groups = res.compute_units * (2 if quick else 32)
    steps = 63 if quick else 144   # a multiple of 9: the gathered read walks whole 3x3 windows
    runs = 3 if quick else 15   # best of 15: with 5, two probes minutes apart differed up to 2x on a shared VM
    mf = cl.mem_flags
    shapes = tables[0][1] + tables[1][1]
    a = cl.Buffer(ctx, mf.READ_ONLY, 4 * max(steps * 64 * max(r for r, _ in shapes), 961 * (steps // 9 + 1)))
    b = cl.Buffer(ctx, mf.READ_ONLY, 4 * steps * max(c for _, c in shapes))
    cl.enqueue_fill_buffer(queue, a, b"\x00\x00\x80\x3f", 0, a.size).wait()
    cl.enqueue_fill_buffer(queue, b, b"\x00\x00\x80\x3f", 0, b.size).wait()
    out = cl.Buffer(ctx, mf.WRITE_ONLY, 4 * groups * wg * max(rows * cols for rows, cols in shapes))
    for step, (extra, table, what) in enumerate(tables, 6):
        log(f"[{step}/7] register tiles, {what} reads: {len(table)} shapes, {groups} work-groups of {wg}, "
            f"{steps} steps")
        got = []
        for rows, cols in table:
            src, vec = _tile_source(cols)
            opts = [f"-DR={rows}", f"-DCC={cols}", f"-DK={steps}", f"-DWG={wg}"] + extra + vec
            kern = cl.Kernel(cl.Program(ctx, src).build(options=opts), "tile")
            kern.set_args(a, b, out)
            t = min(_time(queue, functools.partial(cl.enqueue_nd_range_kernel, queue, kern, (groups * wg,), (wg,)),
                          runs, cl))
            got.append((rows, cols, 2 * groups * wg * steps * rows * cols / t / 1e9))
        log("      " + ", ".join(f"{r}x{c} {g:.3g}" for r, c, g in got) + " GFLOP/s")
        if what == "plain":
            res.tile_gflops = got
        else:
            res.gather_gflops = got


def _np_int(x: int) -> Any:
    import numpy as np
    return np.int32(x)


def _np_float(x: float) -> Any:
    import numpy as np
    return np.float32(x)


def _work_group(dev: Any, n: int) -> int:
    wg = min(256, dev.max_work_group_size)
    while n % wg:
        wg //= 2
    return max(wg, 1)


def _query(cl: Any, dev: Any) -> ProbeResult:
    dtype = dev.type
    kind = "gpu" if dtype & cl.device_type.GPU else "cpu" if dtype & cl.device_type.CPU else "accelerator"
    vec = max(1, int(getattr(dev, "preferred_vector_width_float", 1) or 1))
    native = max(vec, int(getattr(dev, "native_vector_width_float", 1) or 1))
    vendor = (dev.vendor or "").lower()
    if kind == "gpu":
        warp = 32 if "nvidia" in vendor else 64 if ("amd" in vendor or "advanced micro" in vendor) else vec
        vregs = 64
    else:
        # PoCL vectorises work-items across SIMD lanes: the preferred float width is the schedulable unit.
        warp = vec
        vregs = 32 if native >= 16 else 16     # AVX-512: 32 zmm; AVX2/SSE/NEON-class: 16
    return ProbeResult(
        platform=dev.platform.name.strip(), device=dev.name.strip(), driver=str(dev.driver_version).strip(),
        device_type=kind, compute_units=int(dev.max_compute_units), clock_mhz=int(dev.max_clock_frequency or 0),
        max_work_group_size=int(dev.max_work_group_size), local_mem_bytes=int(dev.local_mem_size),
        local_mem_is_global=dev.local_mem_type == cl.device_local_mem_type.GLOBAL,
        global_mem_bytes=int(dev.global_mem_size), cacheline_bytes=int(dev.global_mem_cacheline_size or 64),
        cache_bytes=int(dev.global_mem_cache_size or 0), vector_width=vec, warp_size=warp, vector_registers=vregs,
        native_vector_width=native)


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _g(x: float) -> str:
    return f"{x:.4g}" if x < 1000 else f"{x:.0f}"


def _render_yaml(r: ProbeResult, name: str) -> str:
    from roller.hw.loader import format_size

    med = statistics.median
    gl_peak, gl_eff = max(r.global_gbps), med(r.global_gbps)
    lo_peak, lo_eff = max(r.local_gbps), med(r.local_gbps)
    fp_peak, fp_eff = max(r.fp32_tflops), med(r.fp32_tflops)
    warp = r.warp_size
    max_block = r.max_work_group_size - r.max_work_group_size % warp
    regs = r.vector_registers                      # registers per work-item (one SIMD lane of each register)
    regs_per_unit = regs * warp
    reg_bw = r.compute_units * (r.clock_mhz or 1000) * 1e6 * 2 * 3 * warp * 4 / 1e9
    line = _pow2_floor(r.cacheline_bytes)
    local = r.local_mem_bytes
    lines: list[str] = []
    w = lines.append
    today = datetime.date.today().isoformat()
    target = "pocl-cpu" if POCL_PLATFORM in r.platform and r.device_type == "cpu" else \
        re.sub(r"[^A-Za-z0-9_.+-]+", "-", f"opencl-{r.device_type}").strip("-")
    local_note = ("Local memory is ordinary cached RAM (OpenCL reports local memory type GLOBAL): a work-group's "
                  "__local buffer lives in the caches of the core that runs it, so its capacity is the driver's "
                  "local_mem_size (the per-core L2 on PoCL) and tiles sized to it stay cache-resident. "
                  if r.local_mem_is_global else "")
    w(f"# Written by `roller hw probe` on {today} in {r.seconds:.1f} s.")
    w(f"# Device: {r.device} | platform: {r.platform} | driver: {r.driver}")
    w("# 'measured' = micro-benchmark (peak = best run, effective = median); 'queried' = clGetDeviceInfo;")
    w("# 'derived' = arithmetic on queried values (formula given); 'assumed' = a heuristic, edit if you know better.")
    w(f"name: {name}")
    w("vendor: " + ("pocl" if POCL_PLATFORM in r.platform else _yaml_str(r.platform.split()[0].lower())))
    w("backend: opencl")
    w(f"target: {target}")
    w("notes: " + _yaml_str(
        f"Probed {r.device} ({r.platform}). {local_note}Bandwidth and FP32 throughput are measured; register "
        f"figures assume {regs} vector registers of {warp} float lanes per core."))
    w("memory:")
    w("  - name: global")
    w("    scope: device")
    w(f"    capacity_bytes: {r.global_mem_bytes}                # queried CL_DEVICE_GLOBAL_MEM_SIZE "
      f"({format_size(r.global_mem_bytes)})")
    w(f"    bandwidth_gbps: {{peak: {_g(gl_peak)}, effective: {_g(gl_eff)}}}   # measured: float4 copy kernel")
    w(f"    transaction_bytes: {line}                         # queried CL_DEVICE_GLOBAL_MEM_CACHELINE_SIZE")
    w(f"    line_bytes: {line}                                # queried CL_DEVICE_GLOBAL_MEM_CACHELINE_SIZE")
    if r.rows_gbps is not None and r.rows_gbps[1] is not None and r.rows_gbps[1] >= STREAMING_GAIN * r.rows_gbps[0]:
        w(f"    streaming_stores: true                            # measured: rows of 64-byte vectors 16 apart, "
          f"{_g(r.rows_gbps[1])} GB/s streamed, {_g(r.rows_gbps[0])} through the caches")
    cached = r.local_mem_is_global
    if cached:
        # Local memory is cached RAM: describe the cache it lives in (scope cache); kernels read through it
        # instead of staging copies, and each work-item holds its tile in the whole register file.
        w("  - name: l2")
        w("    scope: cache")
        w(f"    capacity_bytes: {format_size(local * r.compute_units)}             # derived {r.compute_units} "
          f"units x CL_DEVICE_LOCAL_MEM_SIZE")
        w(f"    capacity_per_unit_bytes: {format_size(local)}         # queried CL_DEVICE_LOCAL_MEM_SIZE "
          "(the per-core cache on PoCL)")
        w(f"    bandwidth_gbps: {{peak: {_g(lo_peak)}, effective: {_g(lo_eff)}}}   # measured: __local read+write "
          "kernel (local memory is this cache)")
        w(f"    transaction_bytes: {line}                         # queried cache line")
        w(f"    line_bytes: {line}                                # queried cache line")
        alias = l1_set_span()
        if alias is not None and alias >= line:
            w(f"    alias_bytes: {alias}                              # queried: this machine's L1 data cache, "
              "capacity / ways (sysfs)")
    else:
        w("  - name: local")
        w("    scope: block")
        w(f"    capacity_per_unit_bytes: {format_size(local)}         # queried CL_DEVICE_LOCAL_MEM_SIZE")
        w(f"    capacity_per_block_bytes: {format_size(local)}        # queried CL_DEVICE_LOCAL_MEM_SIZE")
        w(f"    bandwidth_gbps: {{peak: {_g(lo_peak)}, effective: {_g(lo_eff)}}}   # measured: __local read+write "
          "kernel")
        w("    transaction_bytes: 4                          # assumed")
        w("    line_bytes: 128                               # assumed: 32 banks x 4 B")
        w("    banks: 32                                     # assumed")
        w("    bank_width_bytes: 4                           # assumed")
    if cached:
        # Work-items run one after another on a core, each with the whole register file of `lanes` floats.
        lanes = max(1, r.native_vector_width)
        thread_regs = regs * lanes
        warp = 1
        max_block = min(256, r.max_work_group_size)
        regs_per_unit = thread_regs * max_block
        reg_bw = r.compute_units * (r.clock_mhz or 1000) * 1e6 * 2 * 3 * lanes * 4 / 1e9
    w("  - name: private")
    w("    scope: thread")
    if cached:
        w(f"    capacity_per_unit_bytes: {regs_per_unit * 4}              # derived 4 x registers_per_unit")
        w(f"    capacity_per_thread_bytes: {thread_regs * 4}               # derived {regs} vector registers x "
          f"{lanes} lanes x 4 B (one work-item's view)")
    else:
        w(f"    capacity_per_unit_bytes: {regs_per_unit * 4}              # derived {regs} registers x {warp} "
          "lanes x 4 B")
        w(f"    capacity_per_thread_bytes: {regs * 4}               # derived {regs} registers x 4 B per work-item")
    w(f"    bandwidth_gbps: {{peak: {_g(reg_bw)}, effective: {_g(reg_bw)}}}   # derived {r.compute_units} units x "
      f"{r.clock_mhz} MHz x 2 FMA x 3 operands x {lanes if cached else warp} lanes x 4 B")
    w("    transaction_bytes: 4")
    w("    line_bytes: 4")
    w("parallelism:")
    w(f"  compute_units: {r.compute_units}                        # queried CL_DEVICE_MAX_COMPUTE_UNITS")
    w("  sub_partitions: 1                                # assumed: one work-group per unit at a time")
    if cached:
        w("  warp_size: 1                                     # a work-item is a whole SIMD thread (lanes inside it)")
        w(f"  max_threads_per_block: {max_block}                  # assumed: practical range 64-256 (hardware.md 4)")
        w(f"  max_threads_per_unit: {max_block}                   # assumed: one work-group per unit at a time")
        w("  max_blocks_per_unit: 1                           # assumed: one work-group per unit at a time")
        w(f"  registers_per_unit: {regs_per_unit}                    # derived {thread_regs} x {max_block}: "
          "work-items run one after another, so this never binds")
        w(f"  max_registers_per_thread: {thread_regs}                  # derived {regs} registers x {lanes} lanes")
        w(f"  register_tile_budget: {max(1, thread_regs * 3 // 8)}                      # assumed 3/8 of them "
          "for the tile")
    else:
        w(f"  warp_size: {warp}                                # assumed from the vendor")
        w(f"  max_threads_per_block: {max_block}                  # queried CL_DEVICE_MAX_WORK_GROUP_SIZE")
        w(f"  max_threads_per_unit: {max_block}                   # queried CL_DEVICE_MAX_WORK_GROUP_SIZE")
        w("  max_blocks_per_unit: 1                           # assumed: one work-group per unit at a time")
        w(f"  registers_per_unit: {regs_per_unit}                    # derived {regs} x {warp} lanes")
        w(f"  max_registers_per_thread: {regs}                  # assumed ISA vector registers")
        w(f"  register_tile_budget: {max(1, regs * 3 // 4)}                      # assumed 3/4 of the registers")
    w("compute:")
    w(f"  float32: {{vector: {{peak_tflops: {fp_peak:.6g}, effective_tflops: {fp_eff:.6g}}}}}   "
      f"# measured: float{r.fp32_vector_width} FMA chains")
    w("matrix_instructions: []")
    w("calibration:                                       # measured; the model uses these when present")
    w(f"  launch_us: {_g(r.launch_us)}                                   # measured: empty kernel, fastest run")
    w(f"  per_block_us: {_g(r.per_block_us)}                            # measured: slope per work-group and unit")
    if r.join_us is not None:
        w(f"  join_us: {_g(r.join_us)}                                 # measured: the other units start this "
          "much after the first")
    w("  register_tile_gflops:                            # measured: the kernels' register-tile loop, best run")
    for rows, cols, g in r.tile_gflops:
        w(f"    - {{rows: {rows}, cols: {cols}, gflops: {_g(g)}}}")
    w("  gathered_tile_gflops:                            # measured: the same loop, A through an im2col "
      "decode, B gathered lane by lane")
    for rows, cols, g in r.gather_gflops:
        w(f"    - {{rows: {rows}, cols: {cols}, gflops: {_g(g)}}}")
    return "\n".join(lines) + "\n"


def _yaml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
