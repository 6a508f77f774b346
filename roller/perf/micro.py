"""Micro-performance model: predicted time of an rProgram from its tiles and the hardware description.

The device is modelled as ``units`` identical compute units, each with an equal share of the effective compute
peak and of every memory layer's effective bandwidth (the paper's even split). Each formula is written where it
is used; the model is pure and needs no device.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from roller.hw import HardwareDesc
from roller.ir.vector import vector_width
from roller.perf.traffic import TileGeometry
from roller.program import Prediction

# A scheduler (sub-partition) hides latency by switching between resident warps; with fewer than this many
# warps per scheduler it idles while loads are in flight. Two is the least that lets one warp compute while
# another waits.
WARPS_PER_SCHEDULER = 2
# Registers a thread needs beyond its tile: indices, loop counters, addresses.
REGISTER_OVERHEAD = 16


@dataclass(frozen=True)
class Resources:
    smem_bytes: int  # per block, storage padding included
    registers_per_thread: int
    blocks_per_unit: int  # resident blocks per unit (occupancy); 0 when the block does not fit


def registers_per_thread(geo: TileGeometry, thread_tile: tuple[int, ...], acc_bytes: int = 4) -> int:
    """32-bit registers: the output accumulators, one reduction step of every input fragment, overhead."""
    step = tuple(1 if r else t for t, r in zip(thread_tile, geo.reduce_mask))
    acc = geo.output_elems(thread_tile) * acc_bytes
    frags = sum(math.prod(geo.region(t, step)) * t.itemsize for t in geo.inputs)
    return -(-(acc + frags) // 4) + REGISTER_OVERHEAD


def matrix_registers_per_thread(geo: TileGeometry, warp_tile: tuple[int, ...], shape: tuple[int, int, int],
                                lanes: int) -> int:
    """32-bit registers per lane of a warp that holds ``warp_tile``'s float32 accumulators and one k-step
    (the instruction's k, ``shape[2]``) of every input's fragments, each spread evenly over the lanes."""
    step = tuple(shape[2] if r else s for s, r in zip(warp_tile, geo.reduce_mask))
    acc = -(-geo.output_elems(warp_tile) // lanes)
    frags = sum(-(-math.prod(geo.region(t, step)) * t.itemsize // (4 * lanes)) for t in geo.inputs)
    return acc + frags + REGISTER_OVERHEAD


def register_cap(threads: int, hw: HardwareDesc) -> int:
    """32-bit registers one thread may use when a block of ``threads`` is resident: the block's warps share the
    schedulers (SIMDs) of one unit, each scheduler's register file split among its warps, and no more than a
    thread can address."""
    par = hw.parallelism
    subs = max(1, par.sub_partitions)
    warps = -(-threads // par.warp_size)
    warps_per_sub = -(-warps // subs)
    share = par.registers_per_unit // subs // par.warp_size
    return min(share // warps_per_sub, par.max_registers_per_thread)


def resources(geo: TileGeometry, hw: HardwareDesc, tiles: tuple[tuple[int, ...], ...], block_level: int,
              thread_level: int, block: int, padding: dict[str, int], registers: int | None = None,
              smem_bytes: int | None = None) -> Resources:
    """Shared memory, registers and occupancy of one block. ``registers`` and ``smem_bytes`` replace the
    scalar estimates where a program's register tile is not one thread's (the matrix path's warp tiles)."""
    par = hw.parallelism
    staged = hw.memory[block_level + 1]
    smem = geo.footprint(tiles[block_level], padding) if staged.scope == "block" else 0
    if smem_bytes is not None:
        smem = smem_bytes
    regs = registers_per_thread(geo, tiles[thread_level]) if registers is None else registers
    limits = [par.max_blocks_per_unit, par.max_threads_per_unit // max(block, 1)]
    per_unit = staged.capacity_per_unit_bytes if staged.scope == "block" else None
    if smem and per_unit:
        limits.append(per_unit // smem)
    if par.registers_per_unit:
        limits.append(par.registers_per_unit // max(1, regs * block))
    return Resources(smem, regs, max(0, min(limits)))


def predict(geo: TileGeometry, hw: HardwareDesc, tiles: tuple[tuple[int, ...], ...], block_level: int,
            thread_level: int, grid: int, block: int, res: Resources, use_matrix: bool = False,
            dtype: str = "float32") -> Prediction:
    par = hw.parallelism
    units = par.compute_units
    bpu = max(1, res.blocks_per_unit)
    # The busiest unit runs ceil(grid / units) blocks one after another (or interleaved: the same total).
    rounds = -(-grid // units)
    resident = min(bpu, rounds)
    waves = -(-grid // (bpu * units))
    # Latency hiding: resident warps per unit against what the schedulers need to stay busy.
    warps = resident * -(-block // par.warp_size)
    needed = WARPS_PER_SCHEDULER * par.sub_partitions
    # Lanes of a partly filled warp idle for compute and for memory alike (a 1-thread block uses 1/32).
    lane_eff = block / (-(-block // par.warp_size) * par.warp_size)
    latency_eff = min(1.0, warps / needed) * lane_eff
    if par.warp_size == 1 and par.hardware_threads_per_unit is None:
        # A CPU core (PoCL) runs one work-item at a time to completion, out of order: there are no other warps
        # to switch to, and none are needed. On PoCL's measured candidates the median Spearman went from 0.05 to
        # 0.16 with the warp rule dropped here (docs/model.md).
        latency_eff = 1.0

    device_peak = peak = _peak(hw, dtype, use_matrix)
    edge_slowdown = 1.0
    cal = hw.calibration
    if cal is not None and not use_matrix:
        # What the generated inner loop reaches with this register tile, measured by the probe, replaces the
        # peak: on PoCL it is 5-225 GFLOP/s by tile shape against the description's 468 GFLOP/s peak. Guarded reads
        # and reads gathered lane by lane take the gathered table (docs/model.md: on the measured candidates
        # of the vector kernels, either test alone scored 59% top-1 within 10%, both together 61%).
        rows, cols = register_tile(geo, tiles[thread_level])
        gathered = geo.guarded_reads or geo.lane_gathers
        peak = cal.tile_flops(rows, cols, gathered) or peak
        edge = _edge_share(geo, tiles[block_level], tiles[thread_level])
        slow = cal.tile_flops(rows, cols, True) if edge and not gathered else None
        if slow:
            # Threads at the vector axis's end (one of several runs along it) take the kernels' edge version,
            # which gathers and stores the vector across the end lane by lane: their share runs at the gathered
            # table's speed, in loads and stores alike (docs/model.md, "Threads at the vector axis's end").
            edge_slowdown = (1.0 - edge) + edge * peak / slow
            peak /= edge_slowdown
    compute_block = geo.tile_flops(tiles[block_level]) / (peak / units)
    if cal is not None and not use_matrix and geo.scattered_store:
        # Each output lane is a store of its own, to another row: on PoCL a 1x1 convolution of 16 channels to
        # 96 with the output channels as the vector axis stored 1.2M lanes in 0.3 ms more than the same op
        # vectorised along the output's rows (0.26 ns a lane on 2 cores: about two vector FMAs' issue slots).
        compute_block += geo.output_elems(tiles[block_level]) * SCATTERED_STORE_FLOPS / (device_peak / units)
    layer_times: list[tuple[str, float]] = []
    for i, tile in enumerate(tiles):
        layer = hw.memory[i]
        if i < block_level:
            # Levels above the block (a cache layer): their tile spans several blocks; share per block.
            per_block = geo.total_traffic(tile, layer.transaction_bytes) / grid
        elif i == block_level:
            per_block = geo.tile_traffic(tile, layer.transaction_bytes)
        else:   # an epilogue's reads come from the outer layer, not through the block's
            per_block = geo.total_traffic(tile, layer.transaction_bytes, epilogue=False) / grid
        bandwidth = _served_bandwidth(geo, hw, i)
        if i == 0 and i == block_level and layer.latency_ns and bandwidth == hw.bandwidth(0):
            bandwidth = min(bandwidth, inflight_bandwidth(geo, hw, tile, resident))
        t = rounds * per_block / (bandwidth / units) / latency_eff
        if i > block_level:
            t *= edge_slowdown   # a thread's own loads and stores, lane by lane at the edge
        layer_times.append((layer.name, t))
    compute_time = rounds * compute_block / latency_eff
    time = max([compute_time] + [t for _, t in layer_times])
    exposed = unhidden_staging(geo, hw, block_level, resident, bpu)
    if exposed:
        # The generated GPU kernels stage a block's tiles, wait at a barrier, then compute: only the other
        # resident blocks' compute overlaps a block's loads. A grid that leaves the units fewer blocks than they
        # could hold (fewer tiles than units x resident blocks: M6 at 128 blocks on 132 SMs ran 0.13x cuBLAS)
        # pays that share of its staging and compute one after the other; split-K programs fill those slots.
        staging = max(t for _, t in layer_times[:block_level + 1])
        time += exposed * min(compute_time, staging)
    bottleneck = "compute"
    for name, t in layer_times:
        if t >= time and t > compute_time:
            bottleneck = name
    if cal is not None and cal.join_us and units > 1 and time > 0:
        # The units do not all start at launch: on PoCL the other cores take work-groups join_us after the
        # first (docs/model.md, "Units that join late"). Replay the hand-out with the time of one block.
        scale = makespan(grid, time / rounds, units, cal.join_us * 1e-6) / time
        compute_time *= scale
        layer_times = [(name, t * scale) for name, t in layer_times]
        time *= scale
    if cal is not None:
        # Fixed costs the probe measured: the launch, and per work-group setup on the busiest unit.
        time += (cal.launch_us or 0.0) * 1e-6 + rounds * (cal.per_block_us or 0.0) * 1e-6
    useful = math.prod(geo.extents) * geo.flops_per_point
    fraction = useful / time / device_peak if time > 0 else 0.0
    return Prediction(time_s=time, bottleneck=bottleneck, fraction_of_peak=fraction,
                      layer_times_s=tuple(layer_times), compute_time_s=compute_time, waves=waves,
                      blocks_per_unit=res.blocks_per_unit, registers_per_thread=res.registers_per_thread)


def inflight_bandwidth(geo: TileGeometry, hw: HardwareDesc, block_tile: tuple[int, ...], resident: int) -> float:
    """Bytes/s the device's outer memory serves a program whose ``resident`` blocks per unit each have one
    block tile's input reads (one reduction step) in flight at once: units x bytes in flight / latency (Little's
    law). One 4-byte read per thread at full occupancy is 8 KB per H200 SM, about 0.6 of what its bandwidth
    needs at ~600 ns; 16-byte vectors are four times that (shared/reference/gpu-mainloops.md, section 4)."""
    latency = hw.memory[0].latency_ns
    if not latency:
        return math.inf
    inflight = sum(math.prod(geo.region(t, block_tile)) * t.itemsize for t in geo.inputs)
    if not inflight:   # an op that reads nothing (an index computed, a constant filled) waits on no load
        return math.inf
    return hw.parallelism.compute_units * max(1, resident) * inflight / (latency * 1e-9)
def unhidden_staging(geo: TileGeometry, hw: HardwareDesc, block_level: int, resident: int,
                     blocks_per_unit: int) -> float:
    """The share of a block's staging that runs apart from compute on a GPU whose units hold ``resident`` of
    the ``blocks_per_unit`` blocks they could: 1 / ``resident`` (the other resident blocks' compute covers the
    rest), and none once every slot is filled (a grid that fills the device keeps the model's usual overlap).
    It does not depend on how many more blocks would fit: a program with room for 13 is no slower than one with
    room for 4 at the same residency (a scaled-suite convolution's ranking turned on that). 0 for
    kernels that stage nothing (no reduction, or no block-scope layer)."""
    if hw.parallelism.warp_size == 1 or hw.memory[block_level + 1].scope != "block" or not geo.expr.reduce_axes \
            or blocks_per_unit <= 1 or resident >= blocks_per_unit:
        return 0.0
    return 1.0 / resident


#: what one output lane stored on its own costs, in the device's peak FLOPs (two 16-lane vector FMAs)
SCATTERED_STORE_FLOPS = 64


def makespan(grid: int, block_s: float, units: int, join_s: float) -> float:
    """When the last of ``grid`` work-groups of ``block_s`` each ends, on ``units`` units of which the first
    starts at 0 and the others at ``join_s``, each idle unit taking ceil(remaining / units) groups at a time,
    at most 32 x units (PoCL's pthread scheduler hands out work-groups this way). With ``join_s`` 0 it is
    ceil(grid / units) x ``block_s``, the rounds the model counts everywhere else."""
    cap = 32 * units
    chunk = cap * block_s
    free = [(0.0, 0)] + [(join_s, u) for u in range(1, units)]
    heapq.heapify(free)
    remaining, end = grid, 0.0
    while remaining > 0:
        if remaining > (cap - 1) * units and max(free)[0] - min(free)[0] < chunk:
            # Every hand-out is a whole chunk until (cap - 1) x units remain, and with all units free within
            # one chunk of each other they take them in turn: hand those rounds out at once (a large grid
            # would otherwise cost a step per chunk, in every prediction).
            k = -(-(remaining - (cap - 1) * units) // cap)
            full, extra = divmod(k, units)
            turns = [(t, u, full + (i < extra)) for i, (t, u) in enumerate(sorted(free))]
            end = max([end] + [t + n * chunk for t, _, n in turns if n])
            free = [(t + n * chunk, u) for t, u, n in turns]
            heapq.heapify(free)
            remaining -= k * cap
            continue
        start, unit = heapq.heappop(free)
        take = min(-(-remaining // units), cap, remaining)
        remaining -= take
        end = max(end, start + take * block_s)
        heapq.heappush(free, (start + take * block_s, unit))
    return end


def _served_bandwidth(geo: TileGeometry, hw: HardwareDesc, i: int) -> float:
    """Bandwidth of layer ``i``, or that of the cache layer below it when the whole operator fits in that
    cache: its data is there from the launch before, as in repeated timing and in a graph whose ops pass each
    other small tensors (on PoCL the scaled suite's elementwise ops ran 2-4x faster than DRAM bandwidth
    allows; docs/model.md)."""
    below = hw.memory[i + 1] if i + 1 < len(hw.memory) else None
    if below is not None and below.scope == "cache" and below.capacity_bytes \
            and geo.total_bytes <= below.capacity_bytes:
        return hw.bandwidth(i + 1)
    return hw.bandwidth(i)


def _edge_share(geo: TileGeometry, block_tile: tuple[int, ...], thread_tile: tuple[int, ...]) -> float:
    """Share of a program's thread runs along the vector axis that take the CPU kernels' edge version: those
    that cross or lie past the axis's end, when more than one run covers the axis. A single run covering it
    measured at full speed. The runs past the end now return at once, yet counting them ranked the kernels'
    own top-10 better (docs/model.md). Runs no vector width divides are the scalar loop, with no edge version."""
    axis = geo.vector_axis
    if axis is None:
        return 0.0
    extent, cols, block = geo.extents[axis], thread_tile[axis], block_tile[axis]
    if cols >= extent or not vector_width(cols) or extent % block == 0:
        return 0.0
    runs = -(-extent // block) * (block // cols)
    return (runs - extent // cols) / runs


def register_tile(geo: TileGeometry, thread_tile: tuple[int, ...]) -> tuple[int, int]:
    """(rows, cols) of a thread's accumulators: cols is the run along the last spatial axis (what the CPU
    kernels vectorise; with the axes split from it by a blocked layout, ``TileGeometry.vector_group``), rows the
    rest."""
    if geo.reduce_vector is not None:   # each output point a vector of partial results along the reduction
        return max(1, geo.output_elems(thread_tile)), geo.reduce_vector[1]
    cols = math.prod(thread_tile[i] for i in geo.vector_group) if geo.vector_axis is not None else 1
    return max(1, geo.output_elems(thread_tile) // max(cols, 1)), max(cols, 1)


def _peak(hw: HardwareDesc, dtype: str, use_matrix: bool) -> float:
    if dtype not in hw.compute:
        dtype = "float32"
    if use_matrix and hw.has_matrix(dtype):
        return hw.peak_flops(dtype, matrix=True)
    return hw.peak_flops(dtype)
