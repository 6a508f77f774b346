"""EnlargeTile (paper Fig. 8): grow aligned tiles by data-reuse score, level by level.

Construction starts at the innermost level (a thread's register tile) with the smallest aligned tile, and at
each step tries the enlargements in order of the reuse score S_i = (Q(T) - Q(T'_i)) / (F(T'_i) - F(T)),
Q = traffic from the layer above, F = footprint in this layer. A tile whose enlargement would exceed the layer's
capacity, or whose memory time already falls below its compute time (it saturates compute) and is aligned to
the parallelism of the unit, is recorded and construction continues one level out with it as the unit of
the next tile. A visited set keeps every tile from being expanded twice.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from roller.construction.align import (
    block_sizes,
    padding_ok,
    storage_padding,
    thread_sizes,
    transaction_alignment,
    warp_multiple,
)
from roller.construction.exchange import exchange_fed, on_device, resident_input_bytes, unit_bytes
from roller.hw import HardwareDesc
from roller.hw.desc import TileThroughput
from roller.ir.vector import vector_width
from roller.perf.micro import register_tile, registers_per_thread
from roller.perf.traffic import TileGeometry

Tile = tuple[int, ...]
NEAR_BEST = 0.9  # a measured register tile within this fraction of the fastest one counts as saturating


@dataclass
class Candidate:
    thread: Tile
    block: Tile
    padding: dict[str, int]
    epsilon: float
    border: bool  # recorded because nothing larger fit, not because it saturated


@dataclass
class Search:
    """State of one construction: geometry, device limits and what has been found."""

    geo: TileGeometry
    hw: HardwareDesc
    block_level: int
    thread_level: int
    dtype_bytes: int
    want: int
    budget: int = 4000
    found: list[Candidate] = field(default_factory=list)
    seen_programs: set = field(default_factory=set)
    visited: set = field(default_factory=set)
    steps: int = 0

    def __post_init__(self) -> None:
        hw = self.hw
        self.smem = hw.memory[self.block_level + 1]
        self.outer = hw.memory[self.block_level]
        self.reg_layer = hw.memory[self.thread_level + 1]
        self.align = transaction_alignment(self.geo.expr, self.outer)
        # Rule (b) between the block layer and the registers too: on a CPU that layer is a cache whose
        # 64-byte lines are also the SIMD width, so a thread's innermost run fills whole vectors.
        self.thread_align = transaction_alignment(self.geo.expr, self.smem)
        # A hardware-managed layer (scope 'cache', e.g. PoCL's local memory, which is plain cached RAM) is
        # not staged into: threads read through it, so a block walks the whole reduction in one step.
        self.cached = self.smem.scope == "cache"
        # A unit fed only by an exchange (IPU tiles) receives all data of its outputs before computing: its
        # block tile spans the reduction, and its memory holds its tensor share and output tiles as well.
        self.exchange_fed = exchange_fed(hw, self.block_level)
        self.resident = (resident_input_bytes(self.geo, hw) if self.exchange_fed
                         and on_device(self.geo, hw, self.block_level) else None)
        self.peak = _peak(hw, self.geo.expr)
        self.bw_outer = hw.bandwidth(self.block_level)
        self.bw_smem = hw.bandwidth(self.thread_level)
        self.warp_multiple = warp_multiple(hw)
        par = hw.parallelism
        self.reg_budget = min(par.register_tile_budget,
                              (self.reg_layer.capacity_per_thread_bytes or 1 << 30) // self.dtype_bytes)
        # With a probe's measured register tiles, a thread holds as many accumulators as the fastest of them
        # (its inputs need only fit the register file), and a thread tile saturates only when it contains
        # one of them: the rule of thumb's budget kept PoCL's tiles at 8x8 and smaller (77 GFLOP/s
        # measured) while 16x16 ran 225 (issue 23).
        self.measured = _measured_tiles(hw, self.geo)
        self.near_best: tuple[TileThroughput, ...] = ()
        self.acc_budget = 0
        if self.measured:
            best = max(t.gflops for t in self.measured)
            self.near_best = tuple(t for t in self.measured if t.gflops >= NEAR_BEST * best)
            self.acc_budget = max(t.rows * t.cols for t in self.near_best)
            self.reg_budget = max(self.reg_budget, (self.reg_layer.capacity_per_thread_bytes or 1 << 30)
                                  // self.dtype_bytes)

    def done(self) -> bool:
        return len(self.found) >= self.want or self.steps >= self.budget

    # ---- thread level -------------------------------------------------------------------------------
    def thread_ok(self, t: Tile) -> bool:
        geo = self.geo
        step = tuple(1 if r else s for s, r in zip(t, geo.reduce_mask))
        elems = geo.output_elems(t) + sum(math.prod(geo.region(x, step)) for x in geo.inputs)
        if elems > self.reg_budget or (self.acc_budget and geo.output_elems(t) > self.acc_budget):
            return False
        return registers_per_thread(geo, t) <= self.hw.parallelism.max_registers_per_thread

    def thread_saturated(self, t: Tile) -> bool:
        geo = self.geo
        if self.measured:
            # Contain a near-best measured tile, rather than be nearest to one: 12x16 sits nearest to the
            # measured 16x16 but runs at about 8x16's speed.
            rows, cols = register_tile(geo, t)
            return any(m.rows <= rows and m.cols <= cols for m in self.near_best)
        compute = geo.tile_flops(t) / self.peak
        memory = geo.tile_traffic(t, self.smem.transaction_bytes, epilogue=False) / self.bw_smem
        return geo.output_elems(t) >= 2 and compute >= memory

    def thread_footprint(self, t: Tile) -> float:
        return registers_per_thread(self.geo, t)

    def enlarge_thread(self, t: Tile, eps: float, sizes: list[list[int]]) -> None:
        if self.done() or ("t", t) in self.visited:
            return
        self.visited.add(("t", t))
        self.steps += 1
        ranked = self._ranked(t, sizes, self.smem.transaction_bytes, self.thread_footprint, self.thread_ok,
                              with_scores=True)
        # A register tile only grows where that saves traffic; with no reuse to gain (elementwise, plain
        # reductions) the paper builds the block tile alone and threads keep one output each.
        nexts = [n for score, n in ranked if score > 0]
        if self.thread_saturated(t) or not nexts:
            self.start_block(t, eps, border=not self.thread_saturated(t))
        for n in nexts:
            if self.done():
                return
            self.enlarge_thread(n, eps, sizes)

    # ---- block level --------------------------------------------------------------------------------
    def start_block(self, thread: Tile, eps: float, border: bool) -> None:
        geo = self.geo
        sizes: list[list[int]] = []
        for i, (name, ext, red) in enumerate(zip(geo.axis_names, geo.extents, geo.reduce_mask)):
            if red and (self.cached or self.exchange_fed):
                sizes.append([ext])
            elif red:
                sizes.append(block_sizes(ext, 1, self.align.get(name, 1), eps))
            else:
                sizes.append(block_sizes(ext, thread[i], self.align.get(name, 1), eps))
        if any(not s for s in sizes):
            return
        # The reduction step starts at one cache line of the innermost input (the artifact's x4 of the
        # transaction): a shorter step only adds barriers, and its traffic is the same.
        line = max(1, self.outer.line_bytes // self.dtype_bytes)
        start = tuple((next((v for v in s if v >= line), s[-1]) if red else s[0])
                      for s, red in zip(sizes, geo.reduce_mask))
        self.enlarge_block(thread, start, eps, sizes, border)

    def padding_for(self, block: Tile) -> dict[str, int]:
        pads: dict[str, int] = {}
        if self.smem.scope != "block" or self.exchange_fed:  # the exchange lays regions out densely
            return pads
        for x in self.geo.inputs:
            reg = self.geo.region(x, block)
            if len(reg) > 1:
                p = storage_padding(reg[-1], x.itemsize, self.smem)
                if p:
                    pads[x.name] = p
        return pads

    def threads(self, thread: Tile, block: Tile) -> int:
        return math.prod(b // t for b, t, r in zip(block, thread, self.geo.reduce_mask) if not r)

    def block_ok(self, thread: Tile, block: Tile) -> bool:
        par = self.hw.parallelism
        n = self.threads(thread, block)
        if n > par.max_threads_per_block:
            return False
        if self.exchange_fed:
            if unit_bytes(self.geo, self.hw, block, self.resident) > (self.smem.capacity_per_block_bytes or 0):
                return False
        elif self.smem.scope == "block":
            cap = self.smem.capacity_per_block_bytes or 0
            if self.geo.footprint(block, self.padding_for(block)) > cap:
                return False
        elif self.cached and self.threads(thread, block) > 1:
            # What a block touches over its whole reduction should stay resident in its unit's share of the
            # cache. A cache never refuses data, so a one-thread block is always allowed (it only misses).
            cap = self.smem.capacity_per_unit_bytes or (self.smem.capacity_bytes or 0) // par.compute_units
            if self.geo.footprint(self.geo.full_reduce(block)) > cap:
                return False
        regs = registers_per_thread(self.geo, thread)
        return regs * n <= par.registers_per_unit

    def block_saturated(self, thread: Tile, block: Tile) -> bool:
        geo = self.geo
        if self.threads(thread, block) % self.warp_multiple:
            return False
        compute = geo.tile_flops(block) / self.peak
        memory = geo.tile_traffic(block, self.outer.transaction_bytes, epilogue=False) / self.bw_outer
        return compute >= memory

    def enlarge_block(self, thread: Tile, block: Tile, eps: float, sizes: list[list[int]], border: bool) -> None:
        key = ("b", thread, block)
        if self.done() or key in self.visited:
            return
        self.visited.add(key)
        self.steps += 1
        if not self.block_ok(thread, block):
            return
        nexts = self._ranked(block, sizes, self.outer.transaction_bytes,
                             lambda b: self.geo.footprint(b), lambda b: self.block_ok(thread, b))
        saturated = self.block_saturated(thread, block)
        aligned = self.threads(thread, block) % self.warp_multiple == 0
        if saturated or not nexts:
            self.record(thread, block, eps, border or not saturated)
        elif aligned and border:
            self.record(thread, block, eps, True)
        for n in nexts:
            if self.done():
                return
            self.enlarge_block(thread, n, eps, sizes, border)

    def record(self, thread: Tile, block: Tile, eps: float, border: bool) -> None:
        key = (thread, block)
        if key in self.seen_programs:
            return
        self.seen_programs.add(key)
        self.found.append(Candidate(thread, block, self.padding_for(block), eps, border))

    # ---- shared -------------------------------------------------------------------------------------
    def _ranked(self, tile: Tile, sizes: list[list[int]], transaction: int, footprint, ok,
                with_scores: bool = False) -> list:
        """Enlargements of ``tile`` by one aligned step on one axis, best data-reuse score first."""
        geo = self.geo
        q0 = geo.total_traffic(tile, transaction, epilogue=False)
        f0 = footprint(tile)
        scored = []
        for i, s in enumerate(tile):
            bigger = [v for v in sizes[i] if v > s]
            if not bigger:
                continue
            new = tile[:i] + (bigger[0],) + tile[i + 1:]
            if not ok(new):
                continue
            q1 = geo.total_traffic(new, transaction, epilogue=False)
            f1 = footprint(new)
            score = 0.0 if f1 == f0 else (q0 - q1) / (f1 - f0)
            scored.append((-score, 0, i, new))
        # At equal reuse (none, in a transpose), the enlargement that moves fewer, longer runs first.
        ties = Counter(x[0] for x in scored)
        scored = [(x[0], geo.row_runs(x[3]) if ties[x[0]] > 1 else 0, x[2], x[3]) for x in scored]
        scored.sort(key=lambda x: x[:3])
        if with_scores:
            return [(-x[0], x[3]) for x in scored]
        return [x[3] for x in scored]


def thread_start_sizes(geo: TileGeometry, eps: float, align: dict[str, int] | None = None) -> list[list[int]]:
    """Register-tile sizes per axis; an axis aligned to the block layer's transactions (rule b) gets
    multiples of that alignment (when the axis is long enough for one)."""
    out = []
    for name, e, r in zip(geo.axis_names, geo.extents, geo.reduce_mask):
        a = (align or {}).get(name, 1)
        if r:
            out.append([1])
        elif a > 1 and e >= a:
            sizes = [a * m for m in (1, 2, 3, 4) if padding_ok(a * m, e, eps)] or [a]
            # A run covering the axis needs no alignment (as a block tile covering it): 56 columns as seven
            # 8-wide vectors, where runs of 16 or 64 leave a vector across the end that gathers its lanes
            # (a 3x3 average pool's kernel: 0.8-1.1x the copy kernel's bandwidth against 0.2x).
            if e % a and e < 4 * a and vector_width(e) >= 8:
                sizes = sorted(set(sizes + [e]))
            out.append(sizes)
        else:
            out.append(thread_sizes(e, eps))
    return out


def _peak(hw: HardwareDesc, expr) -> float:
    dtype = expr.inputs[0].dtype if expr.inputs else expr.output.dtype
    if dtype not in hw.compute:
        dtype = "float32"
    return hw.peak_flops(dtype)


def _measured_tiles(hw: HardwareDesc, geo: TileGeometry) -> tuple[TileThroughput, ...]:
    """The probe's register-tile table, where it describes this op's inner loop: vector kernels (a CPU's
    ``cols`` are a vector run along the last spatial axis) of ops that reuse data in registers."""
    cal = hw.calibration
    if cal is None or not cal.register_tiles or geo.vector_axis is None or not geo.reduce_mask.count(True):
        return ()
    return cal.register_tiles
