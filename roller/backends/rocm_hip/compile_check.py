"""Compile check of whole suites for AMD descriptions: every op's best rProgram, rendered as HIP, compiled by
hipcc for the description's target, with its resource usage held against the description's limits and the
model's register estimate.

One hipcc call per (suite, description), at most two at once, cached by source hash (``hipcc.py``).
``python -m roller.backends.rocm_hip.compile_check`` prints the table and the totals (used for docs/hip.md).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roller.backends import Artifact
from roller.backends.rocm_hip import BACKEND
from roller.backends.rocm_hip.hipcc import Unit, check_units, compile_target, limits_report
from roller.construction import construct, matrix_candidates
from roller.hw import HardwareDesc, load
from roller.ir import load_ops
from roller.ir.tensor_expr import TensorExpr
from roller.program import RProgram

AMD_DESCRIPTIONS = ("mi50", "mi100", "mi250x", "mi300x")
GEMM_KINDS = ("matmul", "batch_matmul", "conv2d")


@dataclass
class KernelCheck:
    op: str
    hw: str
    target: str  # what hipcc compiled for (gfx940 for gfx942)
    line: str
    block: int
    matrix: str | None  # the MFMA instruction, when the kernel uses one
    usage: dict[str, Any]
    model_registers: int  # roller.perf.micro's estimate for the program
    plan_lds_bytes: int
    mfma_count: int | None = None  # v_mfma instructions in the device assembly
    problems: list[str] = field(default_factory=list)
    desc: HardwareDesc | None = field(default=None, repr=False, compare=False)

    @property
    def registers(self) -> int:
        """Vector registers per lane: VGPRs plus AGPRs (accumulation registers of MFMA)."""
        return self.usage["vgprs"] + self.usage.get("agprs", 0)


def best_program(op: TensorExpr, hw: HardwareDesc) -> RProgram | None:
    """What ``roller build`` renders: construction's top-1."""
    return construct(op, hw, top_k=1, matrix=BACKEND.matrix_support)[0]


def best_mfma_program(op: TensorExpr, hw: HardwareDesc) -> RProgram | None:
    """The best MFMA-aligned program, or None where MFMA does not apply (no matrix cores, not GEMM-shaped)."""
    progs = matrix_candidates(op, hw, BACKEND.matrix_support, want=1)
    return progs[0] if progs else None


def float16_gemms(ops: Sequence[TensorExpr]) -> list[TensorExpr]:
    """The GEMM-shaped ops of a suite (matmul, batch matmul, conv2d) in float16: the matrix path's inputs."""
    out = []
    for op in ops:
        if op.kind in GEMM_KINDS:
            out.append(load_ops({**dict(op.params), "op": op.kind, "name": op.name, "dtype": "float16"})[0])
    return out


def check(suites: Mapping[str, Sequence[TensorExpr]], descriptions: Sequence[str | HardwareDesc], workdir: Path,
          jobs: int = 2, programs: Callable[[TensorExpr, HardwareDesc], RProgram | None] = best_program
          ) -> list[KernelCheck]:
    """Render every op of every suite for every description (the program ``programs`` picks; ops it gives
    None are left out), compile each (suite, description) as one hipcc unit; one row per kernel. A kernel
    has MFMA instructions in its device assembly if and only if it was rendered from a matrix program."""
    units: list[Unit] = []
    meta: list[list[tuple[TensorExpr, RProgram, Artifact, HardwareDesc]]] = []
    for d in descriptions:
        hw = load(d) if isinstance(d, str) else d
        for suite, ops in suites.items():
            arts, rows = [], []
            for op in ops:
                prog = programs(op, hw)
                if prog is None:
                    continue
                art = BACKEND.render(prog, hw)
                arts.append(art)
                rows.append((op, prog, art, hw))
            if arts:
                units.append(Unit(f"{suite}-{hw.name}", arts, hw, workdir))
                meta.append(rows)
    results = check_units(units, jobs=jobs)
    out = []
    for rows, usage_by_name in zip(meta, results):
        for op, prog, art, hw in rows:
            usage = usage_by_name[art.kernel_name]
            plan = art.extra["plan"]
            kc = KernelCheck(op.name, hw.name, compile_target(hw), prog.line(), prog.block,
                             art.launch.get("matrix_instruction"), usage,
                             prog.prediction.registers_per_thread if prog.prediction else 0, plan.smem_bytes,
                             usage.get("mfma"), desc=hw)
            kc.problems = limits_report(usage, hw, prog.block, plan.smem_bytes,
                                        len(plan.inputs) if plan.staged else 0)
            if art.launch.get("matrix_instruction") and not kc.mfma_count:
                kc.problems.append("a matrix kernel without v_mfma instructions in its device assembly")
            elif not art.launch.get("matrix_instruction") and kc.mfma_count:
                kc.problems.append(f"{kc.mfma_count} v_mfma instructions in a kernel without a matrix program")
            out.append(kc)
    return out


def summary(rows: Sequence[KernelCheck]) -> list[str]:
    """Per description: kernels, worst registers and LDS against the limits, model estimate vs compiler."""
    lines = []
    for name in dict.fromkeys(r.hw for r in rows):
        rs = [r for r in rows if r.hw == name]
        hw = rs[0].desc or load(name)
        cap = next((m.capacity_per_block_bytes for m in hw.memory if m.scope == "block"), 0)
        ratio = [r.registers / r.model_registers for r in rs if r.model_registers]
        over = sum(1 for r in rs if r.registers > r.model_registers)
        lines.append(
            f"{name} ({rs[0].target}): {len(rs)} kernels, {sum(1 for r in rs if r.problems)} over a limit; "
            f"max VGPR+AGPR {max(r.registers for r in rs)} / {hw.parallelism.max_registers_per_thread}, "
            f"max SGPR {max(r.usage['sgprs'] for r in rs)}, max LDS {max(r.usage['lds_bytes'] for r in rs)} / {cap} B; "
            f"compiler/model registers: median {statistics.median(ratio):.2f}, min {min(ratio):.2f}, "
            f"max {max(ratio):.2f} ({over} above the model)")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m roller.backends.rocm_hip.compile_check",
                                 description="Compile every op of the suites for AMD descriptions with hipcc and "
                                             "check resource usage against the descriptions' limits.")
    ap.add_argument("--suite", action="append", default=None, help="op file (default: the scaled and 119 suites)")
    ap.add_argument("--hw", action="append", default=None, help=f"description (default: {', '.join(AMD_DESCRIPTIONS)})")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--rows", action="store_true", help="print one row per kernel")
    ap.add_argument("--matrix", action="store_true",
                    help="the suites' matmul, batch matmul and conv ops in float16, as MFMA programs")
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[3]
    files = args.suite or [str(root / "bench/suites/scaled.json"), str(root / "bench/suites/roller119.json")]
    suites = {Path(f).stem: load_ops(f) for f in files}
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="roller-hip-check-"))
    t = time.perf_counter()
    if args.matrix:
        suites = {f"{k}-float16": float16_gemms(v) for k, v in suites.items()}
        rows = check(suites, args.hw or AMD_DESCRIPTIONS, workdir, jobs=args.jobs, programs=best_mfma_program)
    else:
        rows = check(suites, args.hw or AMD_DESCRIPTIONS, workdir, jobs=args.jobs)
    secs = time.perf_counter() - t
    if args.rows:
        for r in rows:
            print(f"{r.hw:8} {r.op:32} vgpr {r.usage['vgprs']:3} agpr {r.usage.get('agprs', 0):3} "
                  f"sgpr {r.usage['sgprs']:3} lds {r.usage['lds_bytes']:6} model {r.model_registers:3} "
                  f"{r.matrix or '':24} {r.mfma_count if r.mfma_count is not None else '':4} {'; '.join(r.problems)}")
    for line in summary(rows):
        print(line)
    bad = [r for r in rows if r.problems]
    for r in bad:
        print(f"OVER LIMIT {r.hw} {r.op}: {'; '.join(r.problems)}", file=sys.stderr)
    print(f"{len(rows)} kernels in {secs:.1f} s (kernels in {workdir})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
