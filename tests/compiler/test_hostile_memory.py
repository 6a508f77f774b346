"""Memory safety and hangs (issue 21, items 1-5): index arithmetic at the integer limits, reductions too long
for a 32-bit loop, YAML that expands without bound, damaged cache entries, and workers that outlive their
compare.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import roller
from roller.backends import get
from roller.backends.c_family.plan import index_types
from roller.backends.opencl import DIALECT as CL
from roller.cli.main import main
from roller.compiler.check import check_against
from roller.construction import construct
from roller.hw import load
from roller.ir import Affine, load_op
from roller.ir.reference import random_inputs

ROOT = Path(__file__).resolve().parents[2]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# ---- 1: indices at and beyond 32 bits ----------------------------------------------------------------------------

NEAR_LIMIT = [
    "Y[i] = X[4294967296*i+1]",  # the audit's SIGSEGV
    "Y[i] = X[i-4294967295]",
    "Y[i] = X[2147483648*i]",
    "Y[i] = X[1073741824*i+1]",  # the audit's silently wrong value (wrapped into range)
    "Y[i] = X[-2147483648*i+3]",
    "Y[i] = X[2147483647*i] + X[i-2147483648]",
    "Y[i] = X[2305843009213693951 - 72057594037927935*i]",
    "Y[i,j] += X[4294967296*i+k] * W[k, 2147483648*j + 1]",
    "Y[i] max= X[2147483649*k + i - 1]",
]


@pytest.mark.parametrize("expr", NEAR_LIMIT)
@pytest.mark.parametrize("hw", ["pocl-cpu", "v100", "mi50", "ipu-gc200"])
def test_near_limit_indices_run_and_check(tmp_path, capsys, expr, hw) -> None:
    """Rendered as OpenCL from every kind of description (blocked CPU kernels with vectors, staged GPU kernels,
    exchange-fed IPU programs) and run here: in range reads read, the rest read the pad value, nothing faults.
    Where two reads of a tensor lie 2^31 apart, the box a GPU block or an IPU vertex would stage is that large:
    there, and only there, the description says so in one line."""
    shapes = {"X": [4], "W": [3, 2], "Y": [4, 2] if expr.startswith("Y[i,j]") else [4]}
    doc = {"name": "g", "expr": expr, "shapes": {t: s for t, s in shapes.items() if f"{t}[" in expr}}
    if "k" in expr and "W[k" not in expr:
        doc["extents"] = {"k": 3}
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    rc, out, err = cli(capsys, "run", "--hw", hw, "--backend", "opencl", str(path), "--check", "--no-cache")
    if rc == 2 and hw != "pocl-cpu" and ("2147483647*i] + X[i-2147483648]" in expr or "max=" in expr):
        assert "no program fits" in err and "Traceback" not in err
        return
    assert rc == 0 and "check ok" in out, err


def test_the_wrapped_read_reads_the_pad_value() -> None:
    """The audit's wrong answer: X[1073741824*i+1] at i=4 is 2^32+1, which wrapped to 32 bits is X[1]."""
    op = load_op({"name": "w", "expr": "Y[i] = X[1073741824*i+1]", "shapes": {"X": [4], "Y": [8]}})
    k = roller.compile(op, hw="pocl-cpu", cache=False)
    y = k(np.arange(4, dtype=np.float32) + 10)
    np.testing.assert_array_equal(y, [11, 0, 0, 0, 0, 0, 0, 0])


@pytest.mark.parametrize("index,ranges,wide", [
    (Affine.of({"i": 1}, 5), {"i": 2**31 - 6}, False),
    (Affine.of({"i": 1}, 6), {"i": 2**31 - 6}, True),
    (Affine.of({"i": 1073741824}, 1), {"i": 1}, False),
    (Affine.of({"i": 1073741824}, 1), {"i": 2}, True),  # 2^31 + 1 in a partial sum
    (Affine.of({"i": -1}, -2**31 + 1), {"i": 0}, False),
    (Affine.of({"i": -1}, -2**31 + 1), {"i": 1}, True),  # -2^31 is representable, but not proven by the bound
    (Affine.of({"i": 3, "j": -5}, 0), {"i": 10**8, "j": 10**8}, False),
    (Affine.of({"i": 3, "j": -5}, 0), {"i": 10**9, "j": 10**8}, True),
])
def test_index_type_is_proven(index, ranges, wide) -> None:
    """Where a dialect keeps 32-bit indices when they provably fit (the GPU ones), the proof holds; OpenCL's
    CPU kernels take 64-bit indices always (``Dialect.wide_index``)."""
    import dataclasses

    narrow = dataclasses.replace(CL, wide_index=False)
    assert index_types(index, ranges, narrow) == (("long", "ulong") if wide else ("int", "unsigned"))
    assert index_types(index, ranges, CL) == ("long", "ulong")


@pytest.mark.parametrize("hw", ["h100", "v100"])
def test_wide_only_where_needed(hw) -> None:
    """GPU kernels keep 32-bit indices (no 64-bit arithmetic on the fast path); the near-limit ones get 64-bit
    indices and bounds tests. OpenCL's take 64 bits everywhere."""
    h = load(hw)
    plain = load_op({"name": "p", "op": "conv2d", "N": 1, "C": 8, "H": 9, "W": 9, "F": 8, "KH": 3, "KW": 3})
    far = load_op({"name": "f", "expr": "Y[i,j] += X[4294967296*i+k] * W[k,j]",
                   "shapes": {"X": [4], "W": [3, 2], "Y": [4, 2]}})
    src_plain = get("cuda").render(construct(plain, h, top_k=1)[0], h).source
    src_far = get("cuda").render(construct(far, h, top_k=1)[0], h).source
    assert "long long" not in src_plain and "unsigned long long" in src_far
    assert "long" in get("opencl").render(construct(plain, h, top_k=1)[0], h).source


def _compiles(backend: str, hw_name: str, tmp_path: Path) -> dict:
    op = load_op({"name": "wide", "expr": "Y[i,j] += X[4294967296*i+k-1] * W[k, 2147483648*j]",
                  "shapes": {"X": [6], "W": [3, 2], "Y": [4, 2]}})
    hw = load(hw_name)
    be = get(backend)
    art = be.render(construct(op, hw, top_k=1)[0], hw)
    assert "long long" in art.source
    return be.check_compiles(art, hw, tmp_path)


@pytest.mark.parametrize("backend,hw,resource", [("cuda", "h100", "registers"), ("hip", "mi50", "vgprs")])
def test_wide_indices_compile(tmp_path, backend, hw, resource) -> None:
    from roller.errors import ToolchainError

    try:
        usage = _compiles(backend, hw, tmp_path)
    except ToolchainError as err:
        pytest.skip(str(err))
    assert usage[resource] > 0


def test_wide_indices_run_in_the_hip_emulation(tmp_path) -> None:
    from roller.backends.rocm_hip import emulate
    from roller.errors import ToolchainError

    try:
        emulate.compiler()
    except ToolchainError as err:
        pytest.skip(str(err))
    op = load_op({"name": "wide", "expr": "Y[i,j] += X[4294967296*i+k] * W[k, 2147483648*j + 1]",
                  "shapes": {"X": [6], "W": [3, 2], "Y": [4, 2]}})
    hw = load("mi50")
    art = get("hip").render(construct(op, hw, top_k=1)[0], hw)
    x = random_inputs(op, seed=2)
    y = emulate.run(art, [x[t.name] for t in op.inputs], tmp_path)
    check_against("wide on the HIP emulation", op, x, y)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_wide_indices_run_in_the_poplar_host_run(tmp_path) -> None:
    from roller.backends.ipu_poplar.hostrun import host_run

    op = load_op({"name": "wide", "expr": "Y[i,j] += X[4294967296*i+k] * W[k, 2147483648*j + 1]",
                  "shapes": {"X": [6], "W": [3, 2], "Y": [4, 2]}})
    hw = load("ipu-gc2")
    art = get("poplar").render(construct(op, hw, top_k=1)[0], hw)
    assert "long long" in art.source
    x = random_inputs(op, seed=2)
    results, _ = host_run([(art, x)], tmp_path, jobs=1)
    check_against("wide on the Poplar host run", op, x, results["wide"].output.reshape(4, 2))


# ---- 2: reductions too long for a 32-bit loop ------------------------------------------------------------------

@pytest.mark.parametrize("doc", [
    {"expr": "Y[i] += X[i+k]", "shapes": {"X": [4], "Y": [4]}, "extents": {"k": 2**31}},
    {"expr": "Y[i] += X[i+k] * W[r]", "shapes": {"X": [4], "W": [65536], "Y": [4]}, "extents": {"k": 32769}},
    {"expr": "Y[i] max= X[i+k]", "shapes": {"X": [4], "Y": [4]}, "extents": {"k": 2147483653}},
])
def test_reductions_of_2_31_points_are_rejected(tmp_path, capsys, doc) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    rc, _out, err = cli(capsys, "op", "check", str(path))
    assert rc == 2 and "more than 2^31-1 (kernels count them in 32 bits)" in err


def test_reduction_of_2_31_minus_1_points_is_accepted(tmp_path, capsys) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"expr": "Y[i] += X[i+k]", "shapes": {"X": [4], "Y": [4]},
                                "extents": {"k": 2**31 - 1}}))
    assert cli(capsys, "op", "check", str(path))[0] == 0
    op = load_op(json.loads(path.read_text()))
    src = get("opencl").render(construct(op, "pocl-cpu", top_k=1)[0], load("pocl-cpu")).source
    assert "rl_g_k < 2147483647;" in src  # the loop's bound fits its int counter


# ---- 3: YAML that expands without bound ---------------------------------------------------------------------------

def _validate(tmp_path: Path, capsys, text: str) -> str:
    path = tmp_path / "d.yaml"
    path.write_text(text)
    rc, out, err = cli(capsys, "hw", "validate", str(path))
    assert rc == 2 and out == "" and "Traceback" not in err
    return err


def test_billion_laughs(tmp_path, capsys) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 12)]
    text = "\n".join(lines) + "\nname: bomb\n"
    assert len(text) < 1000
    assert "expands to more than 100000 values" in _validate(tmp_path, capsys, text)


def test_merge_key_bomb(tmp_path, capsys) -> None:
    lines = ["m0: &m0 {k0: 1}"] + [f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}]}}" for i in range(1, 60)]
    assert "expands to more than 100000 values" in _validate(tmp_path, capsys, "\n".join(lines) + "\n")


@pytest.mark.parametrize("text", ["name: " + "[" * 20000 + "]" * 20000, "a:\n" + "".join(
    "  " * i + f"k{i}:\n" for i in range(1, 40)) + "  " * 40 + "x: 1\n", "name: " + "{a: " * 100 + "1" + "}" * 100])
def test_deep_yaml(tmp_path, capsys, text) -> None:
    assert "nested more than 32 levels deep" in _validate(tmp_path, capsys, text)


def test_alias_chains_deeper_than_the_text(tmp_path, capsys) -> None:
    lines = ["a0: &a0 [1]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, 60)]
    assert "nested more than 32 levels deep" in _validate(tmp_path, capsys, "\n".join(lines) + "\n")


def test_recursive_alias(tmp_path, capsys) -> None:
    assert "recursive alias" in _validate(tmp_path, capsys, "a: &a [1, *a]\n")


def test_huge_description(tmp_path, capsys) -> None:
    assert "larger than 1024 KiB" in _validate(tmp_path, capsys, "notes: '" + "x" * (1 << 20) + "'\n")


def test_aliases_within_bounds_still_load(tmp_path) -> None:
    text = (ROOT / "roller/hwdesc/v100.yaml").read_text()
    text = text.replace("compute:", "x-peak: &pk {peak_tflops: 14, effective_tflops: 13}\ncompute:", 1)
    with pytest.raises(roller.errors.InputError, match="x-peak"):  # an unknown key: the alias itself loaded
        roller.hw.loader.load_text(text, "v.yaml")


# ---- 4: damaged cache entries ----------------------------------------------------------------------------------------

RELU = {"name": "relu1", "op": "elementwise", "fn": "relu", "shapes": {"X": [3, 5]}}


def _run_in_subprocess(tmp_path: Path, cache: Path) -> subprocess.CompletedProcess:
    """``roller run`` in a child with a time limit, so that a regression (a read that blocks) fails the test
    instead of hanging the suite."""
    path = tmp_path / "relu.json"
    path.write_text(json.dumps(RELU))
    env = dict(os.environ, ROLLER_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-m", "roller", "run", "--hw", "pocl-cpu", str(path), "--check"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def _entry(cache: Path) -> Path:
    (entry,) = list((cache / "entries").iterdir())
    return entry


def test_entry_that_is_a_regular_file(tmp_path) -> None:
    cache = tmp_path / "cache"
    assert _run_in_subprocess(tmp_path, cache).returncode == 0
    entry = _entry(cache)
    shutil.rmtree(entry)
    entry.write_text("not a folder")
    for _ in range(2):  # rebuilt at once, and the next run uses the rebuilt entry
        done = _run_in_subprocess(tmp_path, cache)
        assert done.returncode == 0 and "check ok" in done.stdout, done.stderr
        assert _entry(cache).is_dir()


@pytest.mark.parametrize("member", ["kernel.cl", "entry.json", "launch.json"])
def test_fifo_in_an_entry(tmp_path, member) -> None:
    cache = tmp_path / "cache"
    assert _run_in_subprocess(tmp_path, cache).returncode == 0
    entry = _entry(cache)
    (entry / member).unlink()
    os.mkfifo(entry / member)
    done = _run_in_subprocess(tmp_path, cache)  # raises TimeoutExpired if the FIFO blocks the lookup
    assert done.returncode == 0 and "check ok" in done.stdout, done.stderr
    assert not (_entry(cache) / member).is_fifo()


def test_entry_that_is_a_link_elsewhere(tmp_path) -> None:
    """A link in place of an entry is removed, not followed: what it points at survives."""
    cache = tmp_path / "cache"
    assert _run_in_subprocess(tmp_path, cache).returncode == 0
    entry = _entry(cache)
    keep = tmp_path / "precious"
    shutil.move(str(entry), keep)
    entry.symlink_to(keep)
    done = _run_in_subprocess(tmp_path, cache)
    assert done.returncode == 0, done.stderr
    assert keep.is_dir() and (keep / "entry.json").is_file()


def test_member_that_is_a_link(tmp_path) -> None:
    cache = tmp_path / "cache"
    assert _run_in_subprocess(tmp_path, cache).returncode == 0
    entry = _entry(cache)
    (tmp_path / "elsewhere.cl").write_text((entry / "kernel.cl").read_text())
    (entry / "kernel.cl").unlink()
    (entry / "kernel.cl").symlink_to(tmp_path / "elsewhere.cl")
    assert _run_in_subprocess(tmp_path, cache).returncode == 0
    assert not (_entry(cache) / "kernel.cl").is_symlink()


def test_cache_folders_replaced_by_files(tmp_path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "entries").write_text("x")
    (cache / "tmp").write_text("y")
    assert _run_in_subprocess(tmp_path, cache).returncode == 0
    assert (cache / "entries").is_dir() and len(list((cache / "entries").iterdir())) == 1


# ---- 5: compare's workers die with it ---------------------------------------------------------------------------------

def _children(pid: int) -> set[int]:
    out = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.update(int(c) for c in (task / "children").read_text().split())
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_compare_workers_die_with_it(tmp_path, sig) -> None:
    env = dict(os.environ, ROLLER_NO_CACHE="1")
    proc = subprocess.Popen([sys.executable, "-m", "roller", "compare", str(ROOT / "bench/suites/roller119.json"),
                             "-o", str(tmp_path / "r"), "-j", "2", "--no-plots"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    for _ in range(1200):  # until its pool has started (the suite takes far longer than that to build)
        workers = _children(proc.pid)
        if len(workers) >= 2 or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert proc.poll() is None and len(workers) >= 2, "compare finished or never started its workers"
    proc.send_signal(sig)
    proc.wait()
    for _ in range(600):  # they notice within a second or so; allow for a loaded machine
        if not any(_alive(w) for w in workers):
            break
        time.sleep(0.1)
    left = [w for w in workers if _alive(w)]
    for w in left:  # do not leave them behind if the test fails
        os.kill(w, signal.SIGKILL)
    assert not left
