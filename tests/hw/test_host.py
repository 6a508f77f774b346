"""``--hw host``: this machine's OpenCL device, probed the first time the name is used and cached per device.

Real probes on the local device (PoCL in CI), with ``ROLLER_HOST_PROBE=quick`` (about a second once PoCL has
compiled its kernels; the default full probe takes up to a minute): five in all, one for the shared cache
below, one for a damaged file, two without a cache, one for two processes at once. Each runs ``roller`` in a
subprocess, as a user would, so the stderr line and the exit code are what a user sees.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import roller
from roller import cache, hw
from roller.compiler.target import load_description, local_names

cl = pytest.importorskip("pyopencl")

ROOT = Path(__file__).resolve().parents[2]
# A busy machine adds "(load average L on N cores: the figures may be low)" after the time.
FIRST = re.compile(r"roller: --hw host \(this machine's own description, the default\): probing (.+), once for this device\.\.\. probed in [\d.]+ s"
                   r"(?: \(load average [\d.]+ on \d+ cores: the figures may be low\))?, cached at (.+)")


def _need_device() -> None:
    from roller.backends.opencl import host
    from roller.backends.opencl.launcher import import_opencl
    from roller.errors import RollerError

    try:
        import_opencl()
        host._device()
    except RollerError as err:
        pytest.skip(f"no OpenCL device to probe: {err}")


def _roller(args: list[str], cache_dir: Path, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "ROLLER_CACHE_DIR": str(cache_dir), "ROLLER_HOST_PROBE": "quick", **env}
    return subprocess.run([sys.executable, "-m", "roller", *args], env=full, cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(cache folder, the description file) after a first use of --hw host."""
    _need_device()
    folder = tmp_path_factory.mktemp("host-cache")
    proc = _roller(["hw", "show", "host"], folder)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    match = FIRST.fullmatch(lines[0])
    assert match, lines[0]
    path = Path(match.group(2))
    assert path.parent == folder / "hw" and path.name.startswith("host-") and "-quick-" in path.name
    assert proc.stdout.startswith(f"# {path} ") and "\nname: host\n" in proc.stdout
    return folder, path


@pytest.mark.slow
def test_first_use_probes_and_caches(probed: tuple[Path, Path]) -> None:
    _, path = probed
    text = cache.read_checked(path)
    assert text is not None and "(quick probe)" in text
    d = hw.load(path)
    assert d.name == "host" and d.backend == "opencl" and d.calibration is not None
    assert d.calibration.register_tiles


@pytest.mark.slow
def test_later_uses_read_the_cache_silently(probed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    folder, path = probed
    before = path.stat().st_mtime_ns
    proc = _roller(["build", "--hw", "host", "examples/matmul.json", "--dry-run", "--top-k", "2"], folder)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("matmul_256 on host (opencl)")
    # Naming no description is naming host (issue 43): build and run, the same file read silently.
    proc = _roller(["build", "examples/matmul.json", "--dry-run", "--top-k", "2"], folder)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("matmul_256 on host (opencl)")
    proc = _roller(["run", "examples/matmul.json"], folder)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("matmul_256  host/opencl"), proc.stdout
    assert path.stat().st_mtime_ns == before

    # In this process too: the API and the description loader take the name, and nothing is probed.
    from roller.backends.opencl import host

    monkeypatch.setenv("ROLLER_CACHE_DIR", str(folder))
    monkeypatch.setenv("ROLLER_HOST_PROBE", "quick")
    runs = host.probes_run
    assert load_description("host").content_hash() == hw.load(path).content_hash()
    k = roller.compile({"op": "matmul", "M": 64, "N": 48, "K": 32}, hw="host")
    assert k.hw.name == "host"
    assert roller.compile({"op": "matmul", "M": 64, "N": 48, "K": 32}).hw.name == "host"   # the default
    a = np.random.default_rng(0).random((64, 32), dtype=np.float32)
    b = np.random.default_rng(1).random((32, 48), dtype=np.float32)
    np.testing.assert_allclose(k(a, b), a @ b, rtol=1e-5)
    m = roller.compile_model(_relu_model(), hw="host")
    assert m.hw.name == "host" and roller.compile_model(_relu_model()).hw.name == "host"
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(m(x), np.maximum(x, 0))
    child = tmp_path / "child.yaml"
    child.write_text("extends: host\nname: host-narrow\nparallelism:\n  register_tile_budget: 16\n")
    assert load_description(child).parallelism.register_tile_budget == 16
    assert host.probes_run == runs and path.stat().st_mtime_ns == before


def _relu_model():
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _edit_a_value(text: str) -> str:
    """A change the loader cannot see: the file stays a valid description."""
    return re.sub(r"gflops: (\d)", r"gflops: 9\1", text, count=1)


@pytest.mark.slow
def test_a_damaged_description_is_probed_again(probed: tuple[Path, Path], tmp_path: Path) -> None:
    """An edited value is the damage a loader cannot see (a truncated file fails the same checksum: see
    test_checked_files_refuse_any_change)."""
    _, original = probed
    folder = tmp_path / "cache"
    path = folder / "hw" / original.name
    path.parent.mkdir(parents=True)
    bad = _edit_a_value(original.read_text())
    assert bad != original.read_text()
    path.write_text(bad)
    proc = _roller(["hw", "show", "host"], folder)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "the cached description is damaged (checksum mismatch); probing" in lines[0]
    assert lines[0].endswith(f"cached at {path}")
    assert cache.read_checked(path) is not None and hw.load(path).name == "host"


@pytest.mark.slow
@pytest.mark.parametrize("why", ["disabled", "unwritable"])
def test_without_a_cache_each_process_probes(tmp_path: Path, why: str) -> None:
    _need_device()
    if why == "disabled":
        folder, env, tail = tmp_path, {"ROLLER_NO_CACHE": "1"}, "not cached: ROLLER_NO_CACHE is set"
    else:
        folder, env = tmp_path / "a-file", {}
        folder.write_text("not a folder")
        tail = f"not cached: {folder}/hw: Not a directory"
    proc = _roller(["build", "--hw", "host", "examples/matmul.json", "--dry-run", "--top-k", "1"], folder, **env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].endswith(tail), proc.stderr
    assert proc.stdout.startswith("matmul_256 on host (opencl)")
    assert not (tmp_path / "hw").exists()


@pytest.mark.slow
def test_concurrent_first_uses_probe_once(tmp_path: Path) -> None:
    _need_device()
    env = {**os.environ, "ROLLER_CACHE_DIR": str(tmp_path), "ROLLER_HOST_PROBE": "quick"}
    procs = [subprocess.Popen([sys.executable, "-m", "roller", "hw", "show", "host"], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    errs = sorted(err for _, err in results)
    assert errs[0] == "" and FIRST.fullmatch(errs[1].strip()), errs
    assert results[0][0] == results[1][0]


# -- errors: one line, the right exit code, and no probe ---------------------------------------------------

def _no_platform_env() -> dict[str, str]:
    """An environment in which the ICD loader finds no OpenCL platform (skip where this one still does)."""
    env = {"OCL_ICD_VENDORS": "/nonexistent-roller-test"}
    code = "import pyopencl as cl\ntry:\n    print(len(cl.get_platforms()))\nexcept Exception:\n    print(0)"
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True,
                          text=True, timeout=120, check=False)
    if proc.stdout.strip() != "0":
        pytest.skip("OCL_ICD_VENDORS does not hide the OpenCL platforms here")
    return env


def test_no_opencl_device_is_a_one_line_toolchain_error(tmp_path: Path) -> None:
    env = _no_platform_env()
    proc = _roller(["run", "--hw", "host", "examples/matmul.json"], tmp_path, **env)
    assert proc.returncode == 5
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(
        "roller: error: --hw host describes this machine's OpenCL device, and there is none: no OpenCL platform")
    # With no description named and none to measure, a build says which names it could have had.
    proc = _roller(["build", "examples/matmul.json", "--dry-run"], tmp_path, **env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith(
        "roller: error: no description named, and no device here to measure one (bundled: a100, "), proc.stderr
    assert not (tmp_path / "hw").exists()


def test_the_oclgrind_simulator_is_not_probed(tmp_path: Path) -> None:
    try:
        names = [p.name for p in cl.get_platforms()]
    except (cl.Error, RuntimeError):
        names = []
    if not any("Oclgrind" in n for n in names):
        pytest.skip("no Oclgrind platform here")
    proc = _roller(["hw", "show", "host"], tmp_path, ROLLER_CL_DEVICE="Oclgrind")
    assert proc.returncode == 5 and proc.stderr.count("\n") == 1
    assert "the one here is the Oclgrind simulator" in proc.stderr


@pytest.mark.parametrize("args,env,message", [
    (["hw", "show", "host"], {"ROLLER_HOST_PROBE": "fast"},
     "roller: error: ROLLER_HOST_PROBE: expected one of full, quick, got 'fast'"),
    (["hw", "show", "hots"], {}, "roller: error: no hardware description 'hots' (bundled: a100, "),
])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], env: dict[str, str], message: str) -> None:
    proc = _roller(args, tmp_path, **env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith(message), proc.stderr
    assert not (tmp_path / "hw").exists()


def test_unknown_names_list_the_measured_ones() -> None:
    with pytest.raises(roller.errors.InputError, match=r"; measured here: host\)$"):
        load_description("no-such-device")


# -- the checksummed files the descriptions are kept in ------------------------------------------------------

def test_checked_files_refuse_any_change(tmp_path: Path) -> None:
    path = tmp_path / "hw" / "d.yaml"
    assert cache.read_checked(path) is None
    cache.write_checked(path, "name: x\nvalue: 1\n")
    assert cache.read_checked(path) == "name: x\nvalue: 1\n"
    whole = path.read_bytes()
    for bad in (whole.replace(b"value: 1", b"value: 2"), whole[:-3], whole.split(b"\n", 1)[1], b""):
        path.write_bytes(bad)
        with pytest.raises(cache.Damaged):
            cache.read_checked(path)
    path.unlink()
    path.mkdir()
    with pytest.raises(cache.Damaged):
        cache.read_checked(path)


def test_the_bundled_pocl_cpu_stays_the_bundled_file() -> None:
    """Tests and documents name pocl-cpu: it must never become this machine's description."""
    d = hw.load("pocl-cpu")
    assert d.name == "pocl-cpu" and Path(d.source).name == "pocl-cpu.yaml"
    assert "host" not in hw.list_bundled() and local_names() == ["host"]
