"""How many staged reduction steps a program keeps in flight (``RProgram.stages``): a decision from the
description, not a constant of the template.

A step's copies from the device layer take ``latency_ns`` to land; the block computes one step in ``t_step``
(its tile's FLOPs at its share of the unit's matrix throughput). With copies issued ``S - 1`` steps ahead, the
latency hides behind compute when ``(S - 1) * t_step >= latency``, i.e. ``S >= 1 + ceil(latency / t_step)``. The
ring of ``S`` staged tiles must fit what one block may hold (the opt-in capacity where the description names
one) and, times the blocks that share a unit, the unit's capacity, so that the occupancy the model predicted
holds. ``max_stages`` caps it: 1 where the layer has no asynchronous copies (or to disable the ring for an
A/B comparison).
"""
from __future__ import annotations

import dataclasses
import math

from roller.construction.matrix import FAMILIES, scratch_bytes
from roller.hw import HardwareDesc
from roller.perf.traffic import TileGeometry
from roller.program import RProgram

#: bytes one asynchronous copy moves (cp.async's widest): staged rows must be made of whole such vectors
COPY_BYTES = 16
#: bytes each ring buffer may lose to alignment (a backend may start each slot on 128 bytes)
SLOT_ALIGN = 128


def step_seconds(prog: RProgram, hw: HardwareDesc) -> float | None:
    """Seconds one block computes one staged step at its share of a unit's throughput: the matrix peak for a
    matrix program, the vector peak for a scalar one (None where the description has no such peak for the
    program's input type)."""
    if not prog.expr.inputs:
        return None
    entry = hw.compute.get(prog.expr.inputs[0].dtype)
    peak = None if entry is None else entry.matrix if prog.use_matrix else entry.vector
    if peak is None:
        return None
    sharing = prog.prediction.blocks_per_unit if prog.prediction is not None else 1
    per_unit = peak.effective_tflops * 1e12 / hw.parallelism.compute_units
    return 2.0 * math.prod(prog.block_tile.shape) * max(1, sharing) / per_unit


def copies_whole_vectors(prog: RProgram) -> bool:
    """Whether every staged tile of ``prog`` is rows of whole COPY_BYTES vectors, each vector wholly inside
    or wholly outside its tensor and aligned in global and block memory: what an asynchronous copy can move.
    The C-family plan stages exactly these tiles with 16-byte loads (c_family/plan/schedule.py ``stage_width``;
    a backend test holds the two to agreeing): a plain (or reshaped) tensor read through
    one access whose last index moves by whole vectors from tile to tile, rows and tile rows of whole vectors,
    shared rows (padding included) of whole vectors, and zero outside the tensor."""
    expr = prog.expr
    if expr.pad_value != 0.0:
        return False
    block = prog.block_tile.as_dict(expr)
    pads = dict(prog.block_tile.storage_padding)
    for t in expr.body_inputs:
        accs = expr.accesses(t.name)
        v = COPY_BYTES // t.itemsize
        if (t.view is not None and not t.view.is_reshape()) or len(accs) != 1 or not t.shape or v < 2:
            return False
        last = accs[0][-1]
        lo, hi = last.span(block)
        ext = hi - lo + 1
        if t.shape[-1] % v or ext % v or lo % v or any(c * block[a] % v for a, c in last.terms):
            return False
        if len(t.shape) > 1 and (ext + pads.get(t.name, 0)) * t.itemsize % COPY_BYTES:
            return False
    return True


def choose_stages(prog: RProgram, hw: HardwareDesc) -> int:
    """The ring depth for ``prog`` on ``hw`` (1: stage, then compute). Programs whose staged tiles are whole
    16-byte vectors only: matrix programs, and scalar ones that read their tiles in vectors (a scalar tile
    otherwise pads its rows by one element against bank conflicts, construction/shared_vector.py)."""
    if (prog.matrix is None and prog.shared_vector <= 1) or prog.reduce_threads != 1 or \
            not copies_whole_vectors(prog):
        return 1
    layer = hw.memory[prog.block_level + 1]
    latency = hw.memory[0].latency_ns
    if layer.scope != "block" or layer.max_stages <= 1 or latency is None:
        return 1
    steps = math.prod(-(-a.extent // s) for a, s in zip(prog.expr.axes, prog.block_tile.shape) if a.reduce)
    t_step = step_seconds(prog, hw)
    if steps < 2 or t_step is None:
        return 1
    want = 1 + math.ceil(latency * 1e-9 / t_step)
    geo = TileGeometry(prog.expr)
    padding = dict(prog.block_tile.storage_padding)
    ring_step = geo.footprint(prog.block_tile.shape, padding) + SLOT_ALIGN * len(prog.expr.inputs)
    fixed = SLOT_ALIGN
    if prog.matrix is not None:
        fam = FAMILIES[prog.matrix.family]
        fixed += scratch_bytes(fam, prog.matrix.shape, prog.block // fam.lanes)
    per_block = layer.capacity_per_block_optin_bytes or layer.capacity_per_block_bytes or 0
    sharing = max(1, prog.prediction.blocks_per_unit if prog.prediction is not None else 1)
    per_unit = (layer.capacity_per_unit_bytes or per_block) // sharing
    fit = (min(per_block, per_unit) - fixed) // ring_step
    return max(1, min(want, layer.max_stages, fit, steps))


def exposed_latency_s(prog: RProgram, hw: HardwareDesc) -> float:
    """Seconds of the device layer's latency that ``prog``'s ring leaves uncovered per step,
    ``max(0, latency - (stages - 1) * t_step)`` (0 where the description gives no latency or no peak for the
    program's type). Construction breaks the model's ties with it: the model prices a step's traffic, not
    when it arrives, so it ties a 16-deep and a 32-deep reduction step that move the same bytes, while only
    the deeper one's ring covers the latency within the stages that fit."""
    latency = hw.memory[0].latency_ns
    t_step = step_seconds(prog, hw) if latency is not None else None
    if latency is None or t_step is None:
        return 0.0
    return max(0.0, latency * 1e-9 - (prog.stages - 1) * t_step)


def with_stages(prog: RProgram, hw: HardwareDesc) -> RProgram:
    """``prog`` with the ring depth ``choose_stages`` decides."""
    stages = choose_stages(prog, hw)
    return prog if stages == prog.stages else dataclasses.replace(prog, stages=stages)
