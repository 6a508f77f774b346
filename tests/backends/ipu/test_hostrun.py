"""Host-run check of the generated Poplar codelets (no Poplar SDK here): g++ compiles each op's codelets.cpp
and graph_plan.hpp against the test stand-in header, a driver executes the graph plan vertex by vertex, and
the result must match roller.reference on every op of the scaled suite, for both IPU descriptions. The vertex
table the C++ header produced must equal the Python plan's (the one graph_plan.json lists), and every output
element must be written by exactly one vertex. Negative controls show that the check catches a wrong codelet,
a slice too small for what the codelet reads, and overlapping output slices."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import roller
from roller.backends import Artifact, get
from roller.backends.ipu_poplar.hostrun import host_run, plan_rows
from roller.compiler.check import check_against
from roller.construction import construct
from roller.errors import CompileError
from roller.hw import load
from roller.ir import load_ops
from roller.ir.reference import random_inputs

ROOT = Path(__file__).resolve().parents[3]
SCALED = load_ops(ROOT / "bench/suites/scaled.json")
BACKEND = get("poplar")
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (apt-get install g++)")


def cases(hw_name: str, ops: list) -> tuple[list, dict]:  # type: ignore[type-arg]
    hw = load(hw_name)
    out, refs = [], {}
    for op in ops:
        art = BACKEND.render(construct(op, hw, top_k=1)[0], hw)
        x = random_inputs(op, seed=3)
        out.append((art, x))
        refs[op.name] = (np.asarray(roller.reference(op, x)), art)
    return out, refs


@pytest.mark.slow
@pytest.mark.parametrize("hw_name", ["ipu-gc2", "ipu-gc200"])
def test_scaled_suite_host_run_matches_reference(tmp_path: Path, hw_name: str) -> None:
    arts, refs = cases(hw_name, SCALED)
    results, timing = host_run(arts, tmp_path, jobs=2)
    assert len(timing.compile_s) == 2
    print(f"{hw_name}: {len(arts)} ops, g++ {timing.compile_wall_s:.1f} s wall (2 parallel runs: "
          f"{', '.join(f'{t:.1f}' for t in timing.compile_s)} s), driver {timing.run_s:.2f} s")
    inputs = {op.name: (op, x) for op, (_, x) in zip(SCALED, arts)}
    for name, (ref, art) in refs.items():
        r = results[name]
        assert r.output.size == ref.size
        op, x = inputs[name]
        check_against(f"{name} on {hw_name}: {art.launch['rprogram']}", op, x, r.output.reshape(ref.shape))
        assert (r.writes == 1).all(), name
        assert np.array_equal(r.table, plan_rows(art.extra["plan"])), name
        listed = json.loads(art.files["graph_plan.json"])["tile_vertices"]
        assert sum(len(t["vertices"]) for t in listed) == len(r.table)


def _one(tmp_path: Path, name: str, edit) -> tuple:  # type: ignore[no-untyped-def]
    op = next(o for o in SCALED if o.name == name)
    [(art, x)], refs = cases("ipu-gc200", [op])
    files = dict(art.files)
    edit(files)
    bad = Artifact(art.kernel_name, files, art.launch, art.main_file, art.extra)
    results, _ = host_run([(bad, x)], tmp_path, jobs=1)
    return results[name], refs[name][0]


def test_negative_control_wrong_codelet_is_caught(tmp_path: Path) -> None:
    def double(files: dict) -> None:
        assert "rl_acc[rl_j] += rl_v;" in files["codelets.cpp"]
        files["codelets.cpp"] = files["codelets.cpp"].replace("rl_acc[rl_j] += rl_v;", "rl_acc[rl_j] += 2 * rl_v;")

    r, ref = _one(tmp_path, "s_matmul_prime", double)
    assert not np.allclose(r.output, ref, rtol=1e-4, atol=1e-5)


def test_negative_control_short_slice_is_caught(tmp_path: Path) -> None:
    """A slice one element short in the plan: the codelet reads past it and the stand-in stops the run."""
    def shorten(files: dict) -> None:
        text = files["graph_plan.hpp"]
        text, n = re.subn(r"(rl_v\.box_X\.set\(1, rl_lo_c, rl_hi_c)", r"\1 - 1", text)
        assert n == 1
        files["graph_plan.hpp"] = text

    with pytest.raises(CompileError, match="stand-in: element"):
        _one(tmp_path, "s_conv3x3_same", shorten)


def test_negative_control_overlapping_outputs_are_caught(tmp_path: Path) -> None:
    """Output slices one element longer overlap their neighbours: some elements are written twice."""
    def widen(files: dict) -> None:
        text = files["graph_plan.hpp"]
        text, n = re.subn(r"(rl_v\.box_Y\.set\(0, rl_lo_i0, rl_hi_i0)", r"\1 + 1", text)
        assert n == 1
        files["graph_plan.hpp"] = text

    r, _ = _one(tmp_path, "s_relu_1d_prime", widen)
    assert (r.writes > 1).any()


def test_rank0_output_and_unit_extents(tmp_path: Path) -> None:
    """A full reduction to a scalar and a matmul with extent-1 axes: shapes the suite does not cover."""
    ops = load_ops({"ops": [{"name": "total", "op": "reduce", "kind": "max", "shape": [5, 7], "axes": [0, 1]},
                            {"name": "dotp", "op": "matmul", "M": 1, "N": 1, "K": 9}]})
    arts, refs = cases("ipu-gc2", ops)
    results, _ = host_run(arts, tmp_path, jobs=1)
    for op, (_, x) in zip(ops, arts):
        ref = refs[op.name][0]
        check_against(op.name, op, x, results[op.name].output.reshape(ref.shape))
        assert (results[op.name].writes == 1).all()
