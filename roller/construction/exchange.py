"""Devices whose outer memory is only the units' own memories together (the IPU's tiles and their exchange).

On such a device a thread cannot read the layer above its unit: "remote" memory is the other tiles' SRAM, and
data reaches a tile only through the bulk-synchronous exchange, which copies every region a compute step reads
into the tile before it starts. So a block tile spans its whole reduction (there is no staging loop to step
through it), and the unit's memory holds, at once, its share of every tensor that lives on the device, the
output tiles it computes, and the input regions copied in for the current step. Everything here is derived
from the description's numbers; no backend is named.
"""
from __future__ import annotations

import math

from roller.hw import HardwareDesc
from roller.perf.traffic import TileGeometry


def exchange_fed(hw: HardwareDesc, block_level: int) -> bool:
    """True when the layer above the block's layer has no storage beyond the units' block-scope memories: its
    capacity is at most units x per-unit capacity (IPU: remote = 1472 x 624 KiB; a GPU's HBM is far larger)."""
    outer, inner = hw.memory[block_level], hw.memory[block_level + 1]
    per_unit = inner.capacity_per_unit_bytes
    return (outer.scope == "device" and inner.scope == "block" and bool(per_unit)
            and outer.capacity_bytes is not None
            and outer.capacity_bytes <= per_unit * hw.parallelism.compute_units)  # type: ignore[operator]


def on_device(geo: TileGeometry, hw: HardwareDesc, block_level: int) -> bool:
    """True when the op can live on the device: its tensors fit in the device's memory and, next to its share
    of the inputs, a tile still holds the working set of a one-output block. An op that cannot needs memory
    off the device (IPU streaming memory), which is not modelled: only one round's working set is then kept
    in a unit."""
    outer = hw.memory[block_level]
    if outer.capacity_bytes is not None and geo.expr.bytes > outer.capacity_bytes:
        return False
    unit = geo.full_reduce(tuple(1 for _ in geo.extents))
    cap = hw.memory[block_level + 1].capacity_per_block_bytes or 0
    return unit_bytes(geo, hw, unit, resident_input_bytes(geo, hw)) <= cap


def resident_input_bytes(geo: TileGeometry, hw: HardwareDesc) -> int:
    """Bytes of the inputs the busiest unit stores when every input is spread over the units in contiguous
    chunks of ceil(size / units) elements."""
    units = hw.parallelism.compute_units
    return sum(-(-math.prod(t.storage_shape) // units) * t.itemsize for t in geo.expr.inputs)


def unit_bytes(geo: TileGeometry, hw: HardwareDesc, block: tuple[int, ...], resident_inputs: int | None) -> int:
    """What one unit holds while it computes a block tile (spanning the whole reduction): the input regions the
    exchange copies in and the output tiles the unit keeps (one per round of blocks it runs), plus, when the op
    lives on the device (``resident_inputs`` not None), its share of the inputs."""
    out_tile = math.prod(geo.region(geo.output, block)) * geo.output.itemsize
    if resident_inputs is None:
        return out_tile + geo.footprint(block)
    rounds = -(-geo.num_tiles(block) // hw.parallelism.compute_units)
    return resident_inputs + rounds * out_tile + geo.footprint(block)
