"""The numbers behind a construction decision: per device (what its description imposes on tiles) and per
chosen rProgram (how close it sits to each limit). ``roller.compare.why`` turns them into sentences.

Everything here is computed from the description and the rProgram with the same rules construction uses
(``roller.construction.align``), so an explanation names the rule that actually applied.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from roller.construction.align import transaction_alignment, warp_multiple
from roller.perf.traffic import TileGeometry

if TYPE_CHECKING:
    from roller.hw import HardwareDesc
    from roller.program import RProgram


def device_facts(hw: HardwareDesc) -> dict[str, Any]:
    """What the description imposes on tiles: warp and scheduling unit, transaction size of the layer blocks
    load from, the block layer's capacity, register limits, units, and the compute/bandwidth balance."""
    from roller.construction import levels

    block_level, thread_level = levels(hw)
    outer = hw.memory[block_level]
    staged = hw.memory[block_level + 1]
    par = hw.parallelism
    peak = hw.peak_flops("float32")
    matrix = hw.peak_flops("float32", matrix=True) if hw.has_matrix("float32") else None
    bw = hw.bandwidth(0)
    return {
        "name": hw.name, "vendor": hw.vendor, "backend": hw.backend, "target": hw.target,
        "layers": [m.name for m in hw.memory], "scopes": [m.scope for m in hw.memory],
        "block_level": block_level, "thread_level": thread_level,
        "outer_layer": outer.name, "staged_layer": staged.name, "staged_scope": staged.scope,
        "transaction_bytes": outer.transaction_bytes, "line_bytes": outer.line_bytes,
        "block_capacity_bytes": staged.capacity_per_block_bytes if staged.scope == "block" else None,
        "unit_capacity_bytes": staged.capacity_per_unit_bytes,
        "warp_size": par.warp_size, "sub_partitions": par.sub_partitions, "warp_multiple": warp_multiple(hw),
        "max_threads_per_block": par.max_threads_per_block, "compute_units": par.compute_units,
        "register_tile_budget": par.register_tile_budget, "max_registers_per_thread": par.max_registers_per_thread,
        "fp32_tflops": peak / 1e12, "fp32_matrix_tflops": matrix / 1e12 if matrix else None,
        "global_gbps": bw / 1e9,
        # FLOP per byte of the outermost layer at which compute and memory take equal time: a tile grows
        # (EnlargeTile) until its own ratio passes this, so a higher ridge asks for bigger tiles.
        "ridge_flop_per_byte": peak / bw,
    }


def program_facts(prog: RProgram, hw: HardwareDesc) -> dict[str, Any]:
    """How the chosen rProgram sits against each limit of ``hw``."""
    expr = prog.expr
    geo = TileGeometry(expr)
    block = prog.block_tile.shape
    thread = prog.thread_tile.shape
    outer = hw.memory[prog.block_level]
    staged = hw.memory[prog.block_level + 1]
    align = transaction_alignment(expr, outer)
    padding = dict(prog.block_tile.storage_padding)
    footprint = geo.footprint(block, padding)
    step = tuple(1 if a.reduce else t for a, t in zip(expr.axes, thread))
    reg_elems = geo.output_elems(thread) + sum(math.prod(geo.region(x, step)) for x in geo.inputs)
    return {
        "axes": [a.name for a in expr.axes],
        "reduce_axes": [a.name for a in expr.axes if a.reduce],
        "extents": [a.extent for a in expr.axes],
        "block_tile": list(block), "thread_tile": list(thread),
        # element count each axis's size is a multiple of (rule b), from the outer layer's transactions
        "alignment": {a: n for a, n in align.items() if n > 1},
        "itemsize": expr.output.itemsize,
        "footprint_bytes": footprint if staged.scope == "block" else None,
        "register_elems": reg_elems,
        "threads": prog.block,
        "grid": prog.grid,
        "waves": prog.prediction.waves if prog.prediction else None,
        "registers_per_thread": prog.prediction.registers_per_thread if prog.prediction else None,
    }


def tile_grid(facts: dict[str, Any], block: list[int]) -> int:
    """Number of blocks ``block`` would give on the op these facts describe (reduction axes excluded)."""
    return math.prod(-(-e // b) for e, b, a in zip(facts["extents"], block, facts["axes"])
                     if a not in facts["reduce_axes"])
