"""Fault injection on the model path (issue 38): a ``roller build MODEL -o DIR`` killed with SIGKILL at each of
its renames (the kernel cache's and the build folder's, with and without the one-step swap), then a build
into the same folder again; concurrent builds of one model into one cache from several processes; a read-only
build folder and cache. DIR always holds one whole build (the earlier or the new one; for a moment between
the fallback's two renames none, which the next build puts back), the next build sweeps what the killed one
left, and a damaged cache is rebuilt, never served."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper

import roller
from roller.atomic import sweep_stale
from roller.backends import get

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())

# Runs roller's CLI with os.rename (and the one-step swap) counted: the KILL_AT-th one kills the process first.
KILLER = """
import os, signal, sys
import roller.compiler.artifact as artifact
n, seen, rename = int(os.environ["KILL_AT"]), [0], os.rename
def counted(f):
    def g(*a, **k):
        seen[0] += 1
        if seen[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return f(*a, **k)
    return g
os.rename = counted(rename)
artifact.exchange = (lambda a, b: False) if os.environ.get("NO_SWAP") else counted(artifact.exchange)
from roller.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def adder(path: Path, weight: float, width: int = 64) -> Path:
    w = numpy_helper.from_array(np.full(width, weight, np.float32), "w")
    g = helper.make_graph([helper.make_node("Add", ["X", "w"], ["h"]), helper.make_node("Relu", ["h"], ["Y"])],
                          "adder", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [width])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [width])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def build(model: Path, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", KILLER, "build", "--hw", "pocl-cpu", str(model), "-o", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)


def weight_of(out: Path) -> float:
    """Which build the folder holds: its output for zeros is its weight (the whole folder loads and runs)."""
    m = roller.load(out)
    y = m.run({"X": np.zeros(m.graph.values["X"].shape, np.float32)})["Y"]
    assert np.all(y == y[0])
    return float(y[0])


@needs_device
@pytest.mark.slow
@pytest.mark.parametrize("swap", [True, False], ids=["swap", "two-renames"])
def test_a_build_killed_at_each_rename_leaves_one_whole_build(tmp_path: Path, swap: bool) -> None:
    # the new model's kernel is another (its width): the killed builds store kernel cache entries too
    old, new, out = adder(tmp_path / "old.onnx", 1.0), adder(tmp_path / "new.onnx", 2.0, 48), tmp_path / "out"
    env = dict(os.environ, ROLLER_CACHE_DIR=str(tmp_path / "cache"), KILL_AT="0", **({} if swap else {"NO_SWAP": "1"}))
    assert build(old, out, env).returncode == 0 and weight_of(out) == 1.0
    for n in range(1, 40):
        done = build(new, out, dict(env, KILL_AT=str(n)))
        if done.returncode == 0:
            break
        assert done.returncode == -9, done.stderr
        if not out.exists():   # killed between the fallback's two renames: the next build restores it first
            assert not swap
            sweep_stale(out)
        assert weight_of(out) in (1.0, 2.0)
        assert build(old, out, env).returncode == 0 and weight_of(out) == 1.0   # and builds over it again
        assert not list(tmp_path.glob(".out.tmp-*"))
    else:
        pytest.fail("the build never finished")
    assert n >= 3 and weight_of(out) == 2.0 and not list(tmp_path.glob(".out.tmp-*"))


@needs_device
@pytest.mark.slow
def test_concurrent_builds_into_one_cache(tmp_path: Path) -> None:
    """Ten processes build one model at once, each into a folder of its own, sharing one kernel cache."""
    model = adder(tmp_path / "m.onnx", 3.0)
    env = dict(os.environ, ROLLER_CACHE_DIR=str(tmp_path / "cache"), KILL_AT="0")
    procs = [subprocess.Popen([sys.executable, "-c", KILLER, "build", "--hw", "pocl-cpu", str(model), "-o",
                               str(tmp_path / f"out{i}")], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for i in range(10)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert all(weight_of(tmp_path / f"out{i}") == 3.0 for i in range(10))
    entries = list((tmp_path / "cache" / "entries").iterdir())
    assert entries and all(e.is_dir() for e in entries)


@needs_device
@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folders(tmp_path: Path) -> None:
    model = adder(tmp_path / "m.onnx", 4.0)
    env = dict(os.environ, ROLLER_CACHE_DIR=str(tmp_path / "cache"), KILL_AT="0")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        done = build(model, locked / "out", env)
        assert done.returncode == 2 and "cannot write there" in done.stderr and "Traceback" not in done.stderr
        (tmp_path / "cache").mkdir(mode=0o500)   # a cache that cannot be written costs time, never the build
        done = build(model, tmp_path / "out", env)
        assert done.returncode == 0, done.stderr
        assert weight_of(tmp_path / "out") == 4.0
    finally:
        locked.chmod(0o700)
        (tmp_path / "cache").chmod(0o700)


@pytest.fixture
def full_disk(tmp_path: Path):
    """A 64 KiB tmpfs (root where mounting is allowed: CI's container may not allow it, then skipped)."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True,
                          check=False)
    if done.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@needs_device
def test_a_full_disk(full_disk: Path, tmp_path: Path) -> None:
    """The build folder on a full disk: one line, and nothing half-written left there; the kernel cache on a
    full disk: the build goes on without it."""
    model = adder(tmp_path / "m.onnx", 5.0, width=64 * 1024)   # its weights alone (256 KiB) do not fit
    env = dict(os.environ, ROLLER_CACHE_DIR=str(tmp_path / "cache"), KILL_AT="0")
    done = build(model, full_disk / "out", env)
    assert done.returncode == 2 and "cannot write there: No space left on device" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not list(full_disk.iterdir())
    env["ROLLER_CACHE_DIR"] = str(full_disk / "cache")
    done = build(adder(tmp_path / "small.onnx", 6.0), tmp_path / "out", env)
    assert done.returncode == 0, done.stderr
    assert weight_of(tmp_path / "out") == 6.0
    assert not list((full_disk / "cache" / "tmp").iterdir())   # no half-written entry
