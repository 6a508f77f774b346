"""The paper's alignment rules (section 2.2), as candidate tile sizes per axis and storage padding.

(a) parallelism: threads per block a multiple of warp size x sub-partitions (checked in ``enlarge``);
(b) memory transaction: an axis that is the innermost index of a tensor gets sizes that are multiples of
    transaction_bytes / element size, unless the tile covers the whole dimension;
(c) banks: storage padding so the next level's column reads hit distinct banks;
(d) tensor shape: a size S on an axis of extent N may pad it only if (S - N mod S) / N <= epsilon.
"""
from __future__ import annotations

import math

from roller.hw import HardwareDesc, MemoryLayer
from roller.ir.tensor_expr import TensorExpr

# Multipliers of the aligned base for block-level sizes: smooth numbers, so that irregular extents (96, 48,
# 192...) are reachable without enumerating every multiple.
SMOOTH = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
THREAD_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
EPSILONS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def padding_ok(size: int, extent: int, eps: float) -> bool:
    """Rule (d): the padding waste of tiling ``extent`` by ``size`` is at most ``eps``."""
    rem = extent % size
    if size >= extent:
        return (size - extent) / extent <= eps + 1e-9
    return rem == 0 or (size - rem) / extent <= eps + 1e-9


def transaction_alignment(expr: TensorExpr, layer: MemoryLayer) -> dict[str, int]:
    """Rule (b): per axis, the element count its size must be a multiple of (1 where unconstrained)."""
    align: dict[str, int] = {}
    # An epilogue's reads (a bias B[f]) happen once per output point: they constrain no tile.
    for t in expr.body_inputs + (expr.output,):
        for idx in expr.accesses(t.name):
            if not idx:
                continue
            a = idx[-1].plain_axis()
            if a is None:
                continue
            elems = max(1, layer.transaction_bytes // t.itemsize)
            align[a] = math.lcm(align.get(a, 1), elems)
    return align


def block_sizes(extent: int, base: int, align: int, eps: float) -> list[int]:
    """Candidate block-level sizes: multiples of lcm(base, align) (rule b) within the padding rule (d),
    and the whole extent when it is a multiple of ``base`` (a tile covering a dimension needs no alignment)."""
    step = math.lcm(base, align)
    out = []
    for m in SMOOTH:
        s = step * m
        if s > extent and s - step >= extent:
            break
        if padding_ok(s, extent, eps):
            out.append(s)
    # A tile covering a dimension needs no alignment: the whole extent, or (when the thread's run does not
    # divide it) the thread's run rounded up past it within the padding rule: a 7-wide axis with runs of 4
    # is one block of 8, where the alignment would allow none.
    cover = -(-extent // base) * base
    if extent >= base and cover not in out and (cover == extent or padding_ok(cover, extent, eps)):
        out.append(cover)
    return sorted(set(out))


def thread_sizes(extent: int, eps: float) -> list[int]:
    out = [s for s in THREAD_SIZES if padding_ok(s, extent, eps) and s <= max(extent, 1)]
    return out or [1]


def storage_padding(inner_extent: int, itemsize: int, layer: MemoryLayer) -> int:
    """Rule (c): extra elements per row so that the row stride, counted in bank words, is coprime with the bank
    count; then a column walked by consecutive threads touches every bank once. Zero when the layer has no
    banks (a CPU's local memory) or a single row."""
    if not layer.banks or not layer.bank_width_bytes or inner_extent <= 1:
        return 0
    per_word = max(1, layer.bank_width_bytes // itemsize)
    for pad in range(layer.banks * per_word + 1):
        words = -(-(inner_extent + pad) // per_word)
        if (inner_extent + pad) % per_word == 0 and math.gcd(words, layer.banks) == 1:
            return pad
    return 0


def warp_multiple(hw: HardwareDesc) -> int:
    """Rule (a): the thread count that fills every scheduler of a unit with whole warps."""
    par = hw.parallelism
    return min(par.warp_size * par.sub_partitions, par.max_threads_per_block)
