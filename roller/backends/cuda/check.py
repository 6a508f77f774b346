"""The compile check of a suite for an NVIDIA description: every op built, compiled, and its ptxas report
held against the description's limits and the model's estimate.

One compile unit per (suite, description) holds every op's kernel (the suite's float32 ops plus float16
copies of its matmul, batch matmul and convolution ops, which take the tensor-core path); one compiler
process compiles it, and ``parse_ptxas`` splits the report per kernel.

Agreement with the model (roller/perf/micro.py ``resources``), measured over both suites and the four
NVIDIA descriptions (docs/cuda.md has the figures):
* shared memory: ptxas' static shared memory equals the model's estimate exactly (the kernel declares the
  staged tiles the model counts, storage padding included, plus the matrix path's per-warp scratch); a
  pipelined kernel's dynamic allocation is ``stages`` times the staged tiles plus the scratch, each buffer
  rounded up to DYN_ALIGN bytes, within the opt-in capacity;
* registers: ptxas / model within ``REG_RANGE`` for the scalar path and ``REG_RANGE_MATRIX`` for the wmma path,
  give or take ``REG_SLACK`` registers. The scalar model counts accumulators, one reduction step of inputs and
  a fixed overhead; ptxas also keeps decoded indices and addresses live (implicit-GEMM gathers: up to 3.1x)
  and folds pooling windows into fewer registers than the model counts (down to 0.33x). Measured: scalar
  0.33-3.08 (median 1.1-1.4), wmma 0.91-1.65 (median 1.07-1.20).
* spills: allowed up to ``SPILL_LIMIT`` bytes (a kernel whose block size caps its registers, via
  __launch_bounds__, below what it needs spills a little; more means the register model is badly off).
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roller.backends.cuda import BACKEND, DYN_ALIGN, STATIC_SMEM_LIMIT
from roller.backends.cuda.toolchain import UnitResult, Usage, compile_units
from roller.construction import construct
from roller.hw import HardwareDesc
from roller.ir import load_ops

NVIDIA_DESCRIPTIONS = ("v100", "a100", "h100", "h200")
SUITES = ("scaled", "roller119", "fused")
MATRIX_KINDS = ("matmul", "batch_matmul", "conv2d")
REG_RANGE = (0.25, 3.5)
REG_RANGE_MATRIX = (0.75, 2.0)
REG_SLACK = 8
SPILL_LIMIT = 256


@dataclass
class Entry:
    """One kernel of a unit and what the model said about it."""

    kernel: str
    line: str
    use_matrix: bool
    block: int
    model_registers: int
    model_smem: int
    launch_smem: int
    stages: int = 1  # the ring depth rendered (launch "stages"); its tiles sit in dynamic shared memory
    slack: int = 0   # bytes the dynamic layout may add to the model's figure (each buffer starts on DYN_ALIGN)


@dataclass
class Unit:
    name: str
    hw: HardwareDesc
    source: str
    entries: list[Entry] = field(default_factory=list)


def suite_ops(path: Path) -> list:
    """The suite's ops, plus a float16 copy (``<name>_f16``) of every matmul, batch matmul and convolution."""
    doc = json.loads(Path(path).read_text())
    ops = list(doc["ops"])
    extra = []
    for o in ops:
        if o.get("op") in MATRIX_KINDS:
            h = copy.deepcopy(o)
            h["dtype"] = "float16"
            h["name"] = f"{o['name']}_f16"
            extra.append(h)
    return load_ops({"ops": ops + extra})


def build_unit(name: str, ops: list, hw: HardwareDesc) -> Unit:
    """Construct (top-1), render and concatenate every op's kernel for ``hw``."""
    unit = Unit(name, hw, "")
    sources = []
    for op in ops:
        prog = construct(op, hw, top_k=1, matrix=BACKEND.matrix_support, vectors=BACKEND.vector_programs)[0]
        art = BACKEND.render(prog, hw)
        sources.append(art.source)
        pred = prog.prediction
        assert pred is not None
        stages = int(art.launch.get("stages", 1))
        unit.entries.append(Entry(art.kernel_name, prog.line(), prog.use_matrix, prog.block,
                                  pred.registers_per_thread, _model_smem(prog, stages), art.launch["shared_bytes"],
                                  stages, _ring_slack(len(prog.expr.inputs), stages)))
    unit.source = "\n".join(sources)
    return unit


def _model_smem(prog: Any, stages: int = 1) -> int:
    """The model's shared memory of the chosen program (what ``resources`` gave construction), its staged
    tiles times the ring's ``stages``."""
    from roller.construction.matrix import FAMILIES, scratch_bytes
    from roller.perf.traffic import TileGeometry

    geo = TileGeometry(prog.expr)
    if prog.scopes[prog.block_level + 1] != "block" or not prog.expr.reduce_axes:
        return 0
    smem = stages * geo.footprint(prog.block_tile.shape, dict(prog.block_tile.storage_padding))
    if prog.matrix is not None:
        warps = prog.block // _hw(prog.hw_name).parallelism.warp_size
        smem += scratch_bytes(FAMILIES[prog.matrix.family], prog.matrix.shape, warps)
    return smem


def _hw(name: str) -> HardwareDesc:
    from roller.hw import load

    return load(name)


def compile_all(units: list[Unit], jobs: int = 2) -> list[UnitResult]:
    return compile_units([(u.name, u.source, u.hw.target) for u in units], jobs=jobs)


def problems(unit: Unit, result: UnitResult) -> list[str]:
    """Everything wrong with one compiled unit: kernels missing from the report, limits exceeded, spills,
    shared memory different from the model's, registers outside the margin."""
    par = unit.hw.parallelism
    smem_cap = _smem_cap(unit.hw)
    out = []
    for e in unit.entries:
        u: Usage | None = result.usage.get(e.kernel)
        where = f"{unit.name} {e.kernel} ({e.line}{' | wmma' if e.use_matrix else ''})"
        if u is None:
            out.append(f"{where}: not in ptxas' report")
            continue
        if u.registers > par.max_registers_per_thread:
            out.append(f"{where}: {u.registers} registers > {par.max_registers_per_thread}")
        if u.registers * e.block > par.registers_per_unit:
            out.append(f"{where}: {u.registers} registers x {e.block} threads > {par.registers_per_unit} per unit")
        if max(u.spill_stores, u.spill_loads) > SPILL_LIMIT:
            out.append(f"{where}: spills ({u.spill_stores} B stored, {u.spill_loads} B loaded, "
                       f"{u.stack_bytes} B stack)")
        smem = shared_bytes(e, u)
        cap = smem_cap if e.stages == 1 else _smem_cap(unit.hw, optin=True)
        if smem > cap:
            out.append(f"{where}: {smem} B shared memory > {cap} B")
        if e.stages > 1 and u.smem_bytes:
            out.append(f"{where}: a ring of {e.stages} stages declares {u.smem_bytes} B of static shared memory")
        if not smem_agrees(unit, e, u):
            out.append(f"{where}: ptxas {smem} B shared memory, model {e.model_smem} B"
                       + (f" (+{e.slack} B of alignment allowed)" if e.slack else ""))
        lo_f, hi_f = REG_RANGE_MATRIX if e.use_matrix else REG_RANGE
        lo = math.floor(e.model_registers * lo_f) - REG_SLACK
        hi = math.ceil(e.model_registers * hi_f) + REG_SLACK
        if not lo <= u.registers <= hi:
            out.append(f"{where}: ptxas {u.registers} registers, model {e.model_registers} (allowed {lo}..{hi})")
    return out


def shared_bytes(e: Entry, u: Usage) -> int:
    """The kernel's shared memory: ptxas' static figure, or the dynamic allocation launch.json asks for."""
    return u.smem_bytes if e.launch_smem <= STATIC_SMEM_LIMIT and e.stages == 1 else e.launch_smem


def smem_agrees(unit: Unit, e: Entry, u: Usage) -> bool:
    """Whether the kernel's shared memory is the model's: exactly, or for a ring up to its alignment slack.
    In a unit where some kernel declares dynamic shared memory (aligned to DYN_ALIGN), ptxas reports every
    kernel's static shared memory rounded up to that alignment, where the dynamic window would begin."""
    smem = shared_bytes(e, u)
    if e.stages > 1:
        return 0 <= smem - e.model_smem <= e.slack
    dynamic = any(x.stages > 1 or x.launch_smem > STATIC_SMEM_LIMIT for x in unit.entries)
    return smem == e.model_smem or (dynamic and smem == -(-e.model_smem // DYN_ALIGN) * DYN_ALIGN)


def _ring_slack(inputs: int, stages: int) -> int:
    """Bytes a ring's dynamic layout may exceed the model's figure by: each slot rounded up to DYN_ALIGN, each
    ring and the scratch buffer started on it."""
    return DYN_ALIGN * (stages * inputs + inputs + 1) if stages > 1 else 0


def _smem_cap(hw: HardwareDesc, optin: bool = False) -> int:
    layer = next(m for m in hw.memory if m.scope == "block")
    if optin and layer.capacity_per_block_optin_bytes:
        return layer.capacity_per_block_optin_bytes
    return layer.capacity_per_block_bytes or 0


def agreement(units: list[Unit], results: list[UnitResult]) -> dict[str, Any]:
    """Figures for docs/cuda.md: ratio of ptxas registers to the model's, smem agreement, spills."""
    ratios = []
    diffs = []
    smem_exact = smem_total = spills = 0
    for unit, res in zip(units, results):
        for e in unit.entries:
            u = res.usage.get(e.kernel)
            if u is None:
                continue
            ratios.append(u.registers / e.model_registers)
            diffs.append(u.registers - e.model_registers)
            smem = u.smem_bytes if e.launch_smem <= STATIC_SMEM_LIMIT else e.launch_smem
            smem_total += 1
            smem_exact += smem == e.model_smem
            spills += bool(u.spill_stores or u.spill_loads)
    ratios.sort()
    diffs.sort()

    def q(xs: list[float], f: float) -> float:
        return xs[min(len(xs) - 1, int(f * len(xs)))] if xs else math.nan

    return {"kernels": len(ratios), "reg_ratio_min": ratios[0] if ratios else math.nan,
            "reg_ratio_median": q(ratios, 0.5), "reg_ratio_p90": q(ratios, 0.9),
            "reg_ratio_max": ratios[-1] if ratios else math.nan,
            "reg_diff_min": diffs[0] if diffs else 0, "reg_diff_max": diffs[-1] if diffs else 0,
            "smem_exact": smem_exact, "smem_total": smem_total, "spilling_kernels": spills,
            "compile_s": sum(r.seconds for r in results), "cached_units": sum(r.cached for r in results)}
