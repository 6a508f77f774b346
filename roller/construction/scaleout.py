"""Scale-out: spreading block tiles over the compute units, and the paper's small-operator shrinking.

When an operator yields fewer block tiles than the device has units, some units idle; the paper shrinks the
rTiles along the axis with the lowest reuse score until there are enough tiles (section 2.6).
"""
from __future__ import annotations

from roller.construction.enlarge import Candidate, Search
from roller.hw import HardwareDesc
from roller.perf.traffic import TileGeometry


def shrink_for_parallelism(geo: TileGeometry, hw: HardwareDesc, cands: list[Candidate],
                           search: Search) -> list[Candidate]:
    """Shrunk variants of the candidates whose grid is smaller than the number of units: each halves the block
    tile along the axis of lowest reuse until the grid fills the units, once keeping the thread tile (fewer
    threads per block) and once halving it with the block (the paper's shrink, "every level": the threads per
    block stay). On an H200 the unshrunk 128x1000x4032 matmul ran 8-16 blocks on 132 units at a third of the
    model's figure (0.62-0.81 ms, cuBLAS 0.059): a block of few threads per unit hides no latency."""
    units = hw.parallelism.compute_units
    out: list[Candidate] = []
    seen = {(c.thread, c.block) for c in cands}
    for c in cands:
        if geo.num_tiles(c.block) >= units:
            continue
        for halve_thread in (False, True):
            thread, block = list(c.thread), list(c.block)
            while geo.num_tiles(tuple(block)) < units:
                axis = _lowest_reuse_axis(geo, tuple(block), search.outer.transaction_bytes, search.align)
                if axis is None:
                    break
                block[axis] = _half(block[axis], search.align.get(geo.axis_names[axis], 1))
                cap = max(1, thread[axis] // 2) if halve_thread else thread[axis]
                if block[axis] < cap or block[axis] % cap or cap < thread[axis]:
                    thread[axis] = _largest_divisor_at_most(block[axis], cap)
            new = Candidate(tuple(thread), tuple(block), search.padding_for(tuple(block)), c.epsilon, True)
            if (new.thread, new.block) not in seen:
                seen.add((new.thread, new.block))
                out.append(new)
    return out


def _half(size: int, align: int) -> int:
    """About half of ``size``, kept a multiple of the transaction alignment (rule b) while it can be."""
    half = max(1, size // 2)
    if align > 1 and half >= align:
        half -= half % align
    return half


def _lowest_reuse_axis(geo: TileGeometry, block: tuple[int, ...], transaction: int,
                       align: dict[str, int]) -> int | None:
    """The spatial axis whose halving costs the least extra traffic (the lowest reuse score)."""
    q0 = geo.total_traffic(block, transaction, epilogue=False)
    best: tuple[float, int] | None = None
    for i, (s, r) in enumerate(zip(block, geo.reduce_mask)):
        a = align.get(geo.axis_names[i], 1)
        # Rule (b) still holds after shrinking: an aligned axis is not cut below its alignment.
        if r or s <= 1 or (a > 1 and s // 2 < a):
            continue
        half = block[:i] + (_half(s, a),) + block[i + 1:]
        cost = geo.total_traffic(half, transaction, epilogue=False) - q0
        if best is None or cost < best[0]:
            best = (cost, i)
    return None if best is None else best[1]


def _largest_divisor_at_most(n: int, cap: int) -> int:
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1
