"""A model's kernels are compiled as one OpenCL program (split over processes where that pays) and the compiled
program is kept in Roller's cache (issue 39): a warm build in a new process, even with PoCL's own cache empty,
calls the device compiler zero times and gives the same answers; a damaged stored program is built again; a
kernel that fails to compile is named as it is when compiled alone."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import roller
from roller.backends import Artifact
from roller.backends.opencl import launcher, programs
from roller.errors import CompileError

ROOT = Path(__file__).resolve().parents[3]
MINI = ROOT / "examples" / "models" / "mini_resnet.onnx"

CHILD = """
import json, sys
import numpy as np
import roller
from roller.backends.opencl.programs import COUNTS
m = roller.compile_model(sys.argv[1], hw="pocl-cpu", progress=False)
y = m.run(m.random_inputs(0))
check = m.check(m.random_inputs(1))
print(json.dumps({"counts": COUNTS, "out": {k: np.asarray(v).ravel()[:64].tolist() for k, v in y.items()},
                  "ok": bool(check["ok"])}))
"""


def _build_in_child(roller_cache: Path, pocl_cache: Path) -> dict:
    env = dict(os.environ, ROLLER_CACHE_DIR=str(roller_cache), POCL_CACHE_DIR=str(pocl_cache))
    done = subprocess.run([sys.executable, "-c", CHILD, str(MINI)], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_warm_build_in_a_new_process_compiles_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "roller"
    cold = _build_in_child(cache, tmp_path / "pocl-cold")
    assert cold["ok"] and cold["counts"]["kernels_compiled"] == 9 and cold["counts"]["source_builds"] >= 1
    assert cold["counts"]["kernels_loaded"] == 0
    # PoCL's own cache empty too: what the warm build runs comes from Roller's stored programs alone
    warm = _build_in_child(cache, tmp_path / "pocl-warm")
    assert warm["counts"]["source_builds"] == 0 and warm["counts"]["kernels_compiled"] == 0
    assert warm["counts"]["kernels_loaded"] == 9 and warm["counts"]["binary_loads"] >= 1
    assert warm["ok"] and warm["out"] == cold["out"]


def test_a_damaged_stored_program_is_built_again(private_cache: Path) -> None:
    first = roller.compile_model(MINI, hw="pocl-cpu", progress=False)
    feeds = first.random_inputs(0)
    want = first.run(feeds)
    blobs = sorted((private_cache / "results" / "opencl-program").rglob("*.bin"))
    assert blobs
    for blob in blobs:
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
    before = dict(programs.COUNTS)
    again = roller.compile_model(MINI, hw="pocl-cpu", progress=False)
    got = again.run(feeds)
    assert programs.COUNTS["kernels_compiled"] - before["kernels_compiled"] == 9
    assert programs.COUNTS["kernels_loaded"] == before["kernels_loaded"]
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)


def test_child_processes_build_parts_of_the_program(private_cache: Path) -> None:
    """With two jobs, nine kernels go to two programs, one built by a child process; the answers are those of
    one program built here (and of onnxruntime, through ``check``)."""
    before = dict(programs.COUNTS)
    split = roller.compile_model(MINI, hw="pocl-cpu", jobs=2, progress=False)
    assert programs.COUNTS["source_builds"] - before["source_builds"] == 2
    assert programs.COUNTS["kernels_compiled"] - before["kernels_compiled"] == 9
    assert split.check(split.random_inputs(0))["ok"]


def _art(name: str, body: str) -> Artifact:
    source = (f"__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void {name}(__global const float* restrict x, "
              f"__global float* restrict y) {{ int i = get_global_id(0); {body} }}")
    launch = {"global_size": [4], "block": [1], "arguments": [{"name": "x", "shape": [4], "dtype": "float32", "role": "input"},
                                                               {"name": "y", "shape": [4], "dtype": "float32", "role": "output"}]}
    return Artifact(name, {"kernel.cl": source}, launch, main_file="kernel.cl")


def test_kernels_of_one_name_share_a_program_renamed(private_cache: Path) -> None:
    """The top-K candidates of one operator share its name: the second is renamed inside the program only."""
    double, triple = _art("scale", "y[i] = 2.0f * x[i];"), _art("scale", "y[i] = 3.0f * x[i];")
    assert [name for _, name in programs.entries([double, triple])] == ["scale", "scale__r1"]
    before = programs.COUNTS["source_builds"]
    runners = launcher.compile_many([double, triple, double])
    assert programs.COUNTS["source_builds"] == before + 1
    x = np.arange(4, dtype=np.float32)
    assert [r([x]).tolist() for r in runners] == [(2 * x).tolist(), (3 * x).tolist(), (2 * x).tolist()]
    # loaded back from the cache under the same names
    again = launcher.compile_many([triple, double])
    assert programs.COUNTS["source_builds"] == before + 1
    assert [r([x]).tolist() for r in again] == [(3 * x).tolist(), (2 * x).tolist()]


def test_kernels_that_do_not_compile_together_are_built_alone(private_cache: Path) -> None:
    """Two kernels that each define an unguarded helper of one name compile alone, not in one program."""
    def with_helper(name: str, factor: float) -> Artifact:
        art = _art(name, "y[i] = helper(x[i]);")
        helper = f"inline float helper(float v) {{ return {factor}f * v; }}\n"
        return Artifact(name, {"kernel.cl": helper + art.source}, art.launch, main_file="kernel.cl")

    runners = launcher.compile_many([with_helper("twice", 2.0), with_helper("thrice", 3.0)])
    x = np.arange(4, dtype=np.float32)
    assert [r([x]).tolist() for r in runners] == [(2 * x).tolist(), (3 * x).tolist()]


def test_a_kernel_that_does_not_compile_is_named(private_cache: Path) -> None:
    good, bad = _art("fine", "y[i] = x[i];"), _art("broken", "y[i] = undefined_name;")
    with pytest.raises(CompileError, match="OpenCL build of broken failed"):
        launcher.compile_many([good, bad])


def test_split_balances_the_work() -> None:
    arts = [_art(f"k{i}", "y[i] = x[i];" * n) for i, n in enumerate((8, 1, 1, 6, 2))]
    parts = programs.split(programs.entries(arts), 2)
    sizes = sorted(sum(len(a.source) for a, _ in p) for p in parts)
    assert len(parts) == 2 and sizes[1] - sizes[0] <= max(len(a.source) for a in arts)
    assert sorted(name for p in parts for _, name in p) == sorted(a.kernel_name for a in arts)
    assert programs.split(programs.entries(arts[:1]), 4) == [[(arts[0], "k0")]]
