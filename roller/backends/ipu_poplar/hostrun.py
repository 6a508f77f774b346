"""Host-run check of generated Poplar codelets, for machines without the Poplar SDK.

The codelets are compiled by the host's g++ against ``standin/poplar_standin.h`` (a test stand-in for the
few Poplar vertex types they use, not an emulator) together with each op's ``graph_plan.hpp`` and a driver
(``standin/host_run.cpp.j2``) that executes the graph plan vertex by vertex: it copies every slice a vertex
connects out of the input tensors, runs the six workers' ``compute(w)`` one after another, and copies the
output slice back while counting the writes of every output element. Many ops share one driver, so a suite
costs a couple of compiler runs (in parallel, ``jobs`` at most).
"""
from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import numpy as np

from roller.backends import Artifact
from roller.backends.ipu_poplar.codegen import fields
from roller.backends.ipu_poplar.plan import GraphPlan
from roller.errors import CompileError, ToolchainError

STANDIN = Path(__file__).parent / "standin"
CXXFLAGS = ("-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-unused-variable")


@dataclass
class HostRun:
    """What the driver produced for one op."""

    output: np.ndarray  # in the output's storage shape
    writes: np.ndarray  # per output element (flat): how many vertices wrote it
    table: np.ndarray  # one row per vertex: block tile round origin... then begin... end... per tensor


@dataclass
class Timing:
    compile_s: list[float] = field(default_factory=list)  # wall time of each g++ run (they overlap)
    compile_wall_s: float = 0.0
    run_s: float = 0.0


def _driver(plans: list[tuple[GraphPlan, Path]]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(STANDIN)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    ops = [{"p": p, "dir": d.resolve().as_posix(), "ns": f"rl_{p.op}", "fields": fields(p)} for p, d in plans]
    return env.get_template("host_run.cpp.j2").render(ops=ops)


def host_run(cases: list[tuple[Artifact, dict[str, np.ndarray]]], workdir: Path, jobs: int = 2,
             cxx: str = "g++") -> tuple[dict[str, HostRun], Timing]:
    """Compiles and runs the codelets of every ``(artifact, inputs)`` case on the host; results by op name."""
    if shutil.which(cxx) is None:
        raise ToolchainError(f"{cxx} is not installed: apt-get install g++")
    workdir = Path(workdir)
    include = workdir / "include" / "poplar"
    include.mkdir(parents=True, exist_ok=True)
    (include / "Vertex.hpp").write_text('#include "poplar_standin.h"\n', encoding="utf-8")
    plans: list[tuple[GraphPlan, Path]] = []
    for art, inputs in cases:
        p: GraphPlan = art.extra["plan"]
        d = workdir / p.op
        d.mkdir(parents=True, exist_ok=True)
        for name, text in art.files.items():
            (d / name).write_text(text, encoding="utf-8")
        for t in p.inputs:
            np.ascontiguousarray(inputs[t.name], dtype=np.float32).tofile(d / f"{t.name}.bin")
        plans.append((p, d))
    groups = [plans[i::jobs] for i in range(min(jobs, len(plans)))]
    timing = Timing()
    procs = []
    start = time.perf_counter()
    for i, group in enumerate(groups):
        src = workdir / f"driver{i}.cpp"
        src.write_text(_driver(group), encoding="utf-8")
        cmd = [cxx, *CXXFLAGS, f"-I{workdir / 'include'}", f"-I{STANDIN}", src.name, "-o", f"driver{i}"]
        procs.append((cmd, time.perf_counter(), subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE,
                                                                 stderr=subprocess.STDOUT, text=True)))
    failures = []
    for cmd, t0, proc in procs:
        log, _ = proc.communicate()
        timing.compile_s.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            failures.append(f"{' '.join(cmd)} (in {workdir}):\n{log[-6000:]}")
    timing.compile_wall_s = time.perf_counter() - start
    if failures:
        raise CompileError("g++ failed on the host-run driver of the Poplar codelets\n" + "\n".join(failures))
    start = time.perf_counter()
    for i in range(len(groups)):
        run = subprocess.run([f"./driver{i}", str(workdir)], cwd=workdir, capture_output=True, text=True,
                             check=False)
        if run.returncode != 0:
            raise CompileError(f"host-run driver{i} failed (exit {run.returncode}) in {workdir}:\n"
                               f"{(run.stderr or run.stdout)[-4000:]}\nrepro: cd {workdir} && ./driver{i} .")
    timing.run_s = time.perf_counter() - start
    results = {}
    for p, d in plans:
        out = np.fromfile(d / f"{p.output.name}.bin", dtype=np.float32)
        writes = np.fromfile(d / "writes.bin", dtype=np.uint8)
        rows = np.loadtxt(d / "vertices.txt", dtype=np.int64, ndmin=2)
        results[p.op] = HostRun(out.reshape(p.output.storage_shape), writes, rows)
    return results, timing


def plan_rows(p: GraphPlan) -> np.ndarray:
    """The vertex table the driver writes, computed from the Python plan (to compare with the C++ header)."""
    rows = []
    for v in p.all_vertices():
        row = [v.block, v.tile, v.round, *(v.origin or (0,))]
        for t in p.tensors:
            b, e = v.slices[t.name]
            row += [*b, *e]
        rows.append(row)
    return np.array(rows, dtype=np.int64).reshape(len(rows), -1)
