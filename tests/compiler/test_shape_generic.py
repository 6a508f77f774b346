"""Ops with symbolic sizes: one build serves every size in range (shape-generic kernel sets, run on PoCL), or
builds per size where one kernel cannot; the loader's errors for bad symbols."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

import roller
from roller.compiler.check import check_against
from roller.construction import prepared
from roller.construction.generic import (
    MAX_KERNELS,
    WASTE_CAP,
    at_size,
    construct_generic,
    generic_axis,
    sample_sizes,
)
from roller.errors import InputError
from roller.hw import load
from roller.ir.symbolic import parse_symbolic

MATMUL = {"op": "matmul", "M": "m", "N": 96, "K": 80, "symbols": {"m": [1, 1024]}}


def _inputs(expr: roller.TensorExpr, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.storage_shape).astype(np.float32) for t in expr.inputs}


def _check(k: object, op: object, values: dict[str, int]) -> None:
    expr = op.instantiate(values)  # type: ignore[attr-defined]
    x = _inputs(expr)
    got = k(**x)  # type: ignore[operator]
    assert got.shape == tuple(expr.output.storage_shape)
    check_against(f"{expr.name} at {values}", expr, x, got)  # CheckError beyond each element's error bound


def test_matmul_with_symbolic_m_runs_every_size_from_one_build() -> None:
    k = roller.compile(MATMUL, hw="pocl-cpu")
    assert k.mode == "generic"
    built = k.compiled
    assert 1 <= built <= MAX_KERNELS  # "a handful", and all compiled at build time
    for m in (1, 7, 64, 300, 1000):
        _check(k, k.op, {"m": m})
    assert k.compiled == built  # no size compiled anything


def test_kept_set_serves_every_sample_within_the_waste_cap() -> None:
    hw = load("pocl-cpu")
    ks = construct_generic(parse_symbolic({**MATMUL, "N": 768, "K": 768}, None), hw)
    assert not isinstance(ks, str)
    assert ks.samples == sample_sizes(1, 1024)
    assert 1 <= len(ks.programs) <= MAX_KERNELS and ks.candidates >= len(ks.programs)
    for v in (*ks.samples, 3, 100, 1000):
        i = ks.choose(v)
        assert ks.rows(i, v) <= v * WASTE_CAP
        # the dispatch picks the kept program the model predicts fastest among those within the cap
        fitting = [j for j in range(len(ks.programs)) if ks.rows(j, v) <= v * WASTE_CAP]
        assert ks.predict(i, v) == min(ks.predict(j, v) for j in fitting)
    # a 1-row size runs a 1-row tile: a taller one computes rows nobody reads
    assert ks.programs[ks.choose(1)].block_tile.shape[0] == 1


def test_a_size_is_the_same_form_prepared_anew() -> None:
    """at_size substitutes the size into the form built at the greatest one: it must equal preparing the op at
    that size, or the model would rank a kernel for another shape."""
    hw = load("pocl-cpu")
    for doc, v in ((MATMUL, 300), ({"op": "conv2d", "N": "n", "C": 8, "H": 10, "W": 10, "F": 16, "KH": 3,
                                    "KW": 3, "padding": "SAME", "symbols": {"n": [1, 16]}}, 5),
                   ({"op": "elementwise", "fn": "relu", "shapes": {"X": ["n", 4, 6]}}, 3)):
        op = parse_symbolic(doc, None)
        ax = generic_axis(op, hw)
        assert not isinstance(ax, str), ax
        top = prepared(op.instantiate({ax.symbol: op.ranges[ax.symbol][1]}), hw)
        mine = at_size(top, ax, v, op.instantiate({ax.symbol: v}))
        fresh = prepared(op.instantiate({ax.symbol: v}), hw)
        assert mine.axes == fresh.axes
        assert [t.shape for t in mine.tensors] == [t.shape for t in fresh.tensors]
        assert [t.storage_shape for t in mine.tensors] == [t.storage_shape for t in fresh.tensors]


@pytest.mark.parametrize("doc,sizes", [
    ({"op": "conv2d", "N": "n", "C": 8, "H": 10, "W": 10, "F": 16, "KH": 3, "KW": 3, "padding": "SAME",
      "symbols": {"n": [1, 16]}}, (1, 3, 16)),
    ({"op": "elementwise", "fn": "relu", "shapes": {"X": ["n", 4, 6]}, "symbols": {"n": [1, 64]}}, (1, 5, 64)),
    ({"expr": "Y[b,s,f] += X[b,s,c] * W[c,f]", "shapes": {"X": [1, "seq", 24], "W": [24, 40]},
      "symbols": {"seq": [1, 512]}}, (1, 17, 384)),
    ({"op": "maxpool2d", "N": "n", "C": 8, "H": 8, "W": 8, "K": 2, "symbols": {"n": [1, 9]}}, (2, 9)),
])
def test_generic_kernels_match_numpy(doc: dict, sizes: tuple[int, ...]) -> None:
    k = roller.compile(doc, hw="pocl-cpu")
    assert k.mode == "generic", k.why
    sym = k.kernels.axis.symbol
    for v in sizes:
        _check(k, k.op, {sym: v})


def test_per_size_where_one_kernel_cannot_serve() -> None:
    """Row sums over [4, s, s]: the head and row axes fuse into one of 4s, neither a prefix of the grid nor an
    extent a kernel can take as an argument (tests/construction/test_runtime_extents.py): built per size, still correct."""
    k = roller.compile({"expr": "Y[h,q] += X[h,q,k]", "shapes": {"X": [4, "s", "s"]}, "symbols": {"s": [1, 64]}},
                       hw="pocl-cpu")
    assert k.mode == "per-size" and "changes with s" in k.why and "by a factor" in k.why
    for s in (1, 17):
        _check(k, k.op, {"s": s})
    assert k.compiled == 2


def test_ipu_builds_per_size() -> None:
    k = roller.compile(MATMUL, hw="ipu-gc200")
    assert k.mode == "per-size" and "grid it was built for" in k.why


def test_gpu_descriptions_render_the_set() -> None:
    k = roller.compile(MATMUL, hw="h100")
    assert k.mode == "generic" and len(k.artifacts) == len(k.kernels.programs)
    assert all("__global__" in a.source for a in k.artifacts)


@pytest.mark.parametrize("doc,message", [
    ({"op": "matmul", "M": "M1", "N": 8, "K": 8}, "lower-case identifier"),
    ({"op": "matmul", "M": "m", "N": 8, "K": 8, "symbols": {"m": [0, 8]}}, "1 <= least"),
    ({"op": "matmul", "M": "m", "N": 8, "K": 8, "symbols": {"m": [9, 8]}}, "1 <= least"),
    ({"op": "matmul", "M": "m", "N": 8, "K": 8, "symbols": {"m": "big"}}, "expected [least, greatest]"),
    ({"op": "matmul", "M": "m", "N": 8, "K": 8, "symbols": {"m": [1, 8], "q": [1, 4]}}, "no size of the op"),
    ({"op": "maxpool2d", "N": 1, "C": 4, "H": "h", "W": 8, "K": 3, "symbols": {"h": [1, 8]}}, "does not fit"),
    ({"op": "matmul", "M": "m", "N": 8, "K": 8, "symbols": [1, 8]}, "expected an object"),
])
def test_bad_symbols_are_one_line_errors(doc: dict, message: str) -> None:
    with pytest.raises(InputError) as err:
        roller.compile(doc, hw="pocl-cpu")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_calls_outside_the_range_or_inconsistent_are_errors(tmp_path: object) -> None:
    k = roller.compile({**MATMUL, "symbols": {"m": [1, 64]}}, hw="pocl-cpu")
    b = np.ones((80, 96), np.float32)
    with pytest.raises(InputError, match=r"outside its range \[1, 64\]"):
        k(np.ones((65, 80), np.float32), b)
    with pytest.raises(InputError, match="must be"):
        k(np.ones((5, 81), np.float32), b)
    with pytest.raises(InputError, match="missing input"):
        k(np.ones((5, 80), np.float32))


def test_op_file_with_symbols(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "mm.json"
    path.write_text(json.dumps(MATMUL))
    k = roller.compile(str(path), hw="pocl-cpu")
    a = np.ones((3, 80), np.float32)
    assert np.allclose(k(a, np.ones((80, 96), np.float32)), 80.0)


@pytest.mark.nvcc
def test_gpu_kernel_set_compiles_with_nvcc_within_the_description(tmp_path: object) -> None:
    from pathlib import Path

    from roller.backends.cuda.toolchain import compile_unit
    from roller.errors import ToolchainError

    k = roller.compile({**MATMUL, "N": 768, "K": 768, "symbols": {"m": [1, 512]}}, hw="h100")
    hw = k.hw
    smem = next(m for m in hw.memory if m.scope == "block").capacity_per_block_bytes
    for i, art in enumerate(k.artifacts):
        try:
            result = compile_unit(art.source, hw.target, Path(str(tmp_path)) / f"k{i}", art.kernel_name)
        except ToolchainError as err:
            pytest.skip(str(err))
        u = result.usage[art.kernel_name]
        assert u.registers <= hw.parallelism.max_registers_per_thread and u.spill_stores == 0
        assert u.smem_bytes <= smem


def test_build_writes_the_kernel_set_and_a_dispatch_table_covering_the_range(tmp_path: object) -> None:
    import subprocess
    import sys
    from pathlib import Path

    folder = Path(str(tmp_path))
    op = folder / "mm.json"
    op.write_text(json.dumps({**MATMUL, "name": "mm_seq", "symbols": {"m": [1, 300]}}))
    out = folder / "out"
    run = subprocess.run([sys.executable, "-m", "roller", "build", "--hw", "pocl-cpu", str(op), "-o", str(out)],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    doc = json.loads((out / "mm_seq" / "dispatch.json").read_text())
    assert doc["symbol"] == "m" and doc["growing"] == {"A": {"dim": 0, "per_value": 1},
                                                       "C": {"dim": 0, "per_value": 1}}
    spans = doc["dispatch"]
    assert spans[0]["from"] == 1 and spans[-1]["to"] == 300
    assert all(a["to"] + 1 == b["from"] for a, b in itertools.pairwise(spans))
    for k in doc["kernels"]:
        assert (out / "mm_seq" / k["folder"] / "kernel.cl").is_file()
        assert (out / "mm_seq" / k["folder"] / "launch.json").is_file()
    ipu = subprocess.run([sys.executable, "-m", "roller", "build", "--hw", "ipu-gc200", str(op), "-o",
                          str(folder / "ipu")], capture_output=True, text=True, check=False)
    assert ipu.returncode == 2 and "build it at a size" in ipu.stderr and "Traceback" not in ipu.stderr
    assert not (folder / "ipu" / "mm_seq").exists()


def test_row_kernel_with_symbolic_rows_is_one_kernel_set() -> None:
    """A one-kernel softmax over a symbolic number of rows: a row kernel's blocks tile its rows, so it serves
    every row count too."""
    doc = {"expr": "M[r] max= X[r,c]; S[r] += exp(X[r,c] - M[r]); Y[r,c] = exp(X[r,c] - M[r]) / S[r]",
           "shapes": {"X": ["rows", 300]}, "symbols": {"rows": [1, 600]}}
    k = roller.compile(doc, hw="pocl-cpu")
    assert k.mode == "generic", k.why
    built = k.compiled
    for rows in (1, 7, 129, 600):
        _check(k, k.op, {"rows": rows})
    assert k.compiled == built


def test_other_commands_say_what_a_symbolic_op_needs(tmp_path: object) -> None:
    import subprocess
    import sys
    from pathlib import Path

    op = Path(str(tmp_path)) / "mm.json"
    op.write_text(json.dumps(MATMUL))
    for cmd in (["run", "--hw", "pocl-cpu"], ["op", "show"]):
        run = subprocess.run([sys.executable, "-m", "roller", *cmd, str(op)], capture_output=True, text=True,
                             check=False)
        assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
        assert "has symbolic sizes (m)" in run.stderr


def test_benchmark_of_a_padded_generic_kernel_times_its_pad_copy() -> None:
    """A CPU convolution reads a padded copy of its input; timing it at a size below the greatest copies that
    size's interior (the launch's shapes follow the size)."""
    k = roller.compile({"op": "conv2d", "N": "n", "C": 8, "H": 10, "W": 10, "F": 16, "KH": 3, "KW": 3,
                        "padding": "SAME", "symbols": {"n": [1, 16]}}, hw="pocl-cpu")
    assert k.mode == "generic"
    assert 0 < k.benchmark({"n": 3}, repeat=2, warmup=1) < 1.0


def test_cover_spends_its_budget_on_the_sizes_without_a_good_kernel() -> None:
    """A budgeted cover: two kernels for four samples, where each of three narrow candidates wins one sample by
    a few percent and one broad one is 1.1x off at the small sizes and best at the large ones. Counting the
    samples served within the slack kept narrow kernels and left a sample with none near its best."""
    from roller.construction.generic import _cover

    inf = float("inf")
    table = [[1.0, 9.0, 9.0, 9.0],    # narrow, best at sample 0
             [9.0, 1.0, 9.0, 9.0],    # narrow, best at sample 1
             [inf, inf, 1.0, 9.0],    # narrow, best at sample 2 (does not fit 0, 1)
             [1.1, 1.1, 1.05, 1.0]]   # broad
    fits = [[t != inf for t in row] for row in table]
    kept = _cover(table, fits, 1.01, 2)
    assert 3 in kept and len(kept) == 2
    # with room for all, every sample ends within the slack of its best
    kept = _cover(table, fits, 1.01, 4)
    assert all(min(table[i][j] for i in kept) <= 1.01 * min(r[j] for r in table) for j in range(4))


def test_evaluated_set_is_chosen_and_dispatched_by_measured_times() -> None:
    """evaluate=True on an op with a symbolic size: the model's shortlist is timed at the sample sizes, the
    kept kernels are timed at every sample they may serve, a sample takes the kept kernel measured fastest
    there, and each call's result is checked against numpy."""
    doc = {"op": "matmul", "M": "m", "N": 64, "K": 48, "symbols": {"m": [1, 96]}}
    k = roller.compile(doc, hw="pocl-cpu", evaluate=True, repeat=3, progress=False)
    assert k.mode == "generic"
    ks = k.kernels
    assert ks is not None and ks.measured is not None
    assert len(ks.measured) == len(ks.programs) <= MAX_KERNELS
    assert ks.samples == sample_sizes(1, 96, past=True)
    built = k.compiled
    for j, v in enumerate(ks.samples):
        timed = [i for i in range(len(ks.programs)) if np.isfinite(ks.measured[i][j])]
        assert timed, f"no kept kernel was timed at {v}"
        i = ks.choose(v)
        # the model's prediction scaled by the measured ratio at the sample itself is the measured time
        assert ks.expected(i, v) == pytest.approx(ks.measured[i][j]) if i in timed else True
        # among those within the waste cap; where none is (the set was full), among all, each timed there
        fitting = [t for t in timed if ks.rows(t, v) <= v * WASTE_CAP] or timed
        assert ks.measured[i][j] == min(ks.measured[t][j] for t in fitting)
        assert ks.table()[j]["measured_ms"] == pytest.approx(ks.measured[i][j] * 1e3)
    for m in (1, 5, 37, 96):
        _check(k, k.op, {"m": m})
    assert k.compiled == built


def test_expected_time_follows_the_measured_ratio_between_samples() -> None:
    """Between two samples where a kernel was timed, its expected time is its prediction times the measured /
    predicted ratio interpolated geometrically in the size; outside them, the nearest ratio."""
    import dataclasses
    import math

    hw = load("pocl-cpu")
    ks = construct_generic(parse_symbolic({**MATMUL, "symbols": {"m": [1, 64]}}, None), hw)
    assert not isinstance(ks, str)
    n = len(ks.samples)
    j0, j1 = ks.samples.index(16), ks.samples.index(32)
    ratio = {j0: 2.0, j1: 0.5}
    measured = [[ks.predicted[i][j] * ratio[j] if j in ratio else math.inf for j in range(n)]
                for i in range(len(ks.programs))]
    timed = dataclasses.replace(ks, measured=measured, _forms={}, _choice={})
    # at 24 (not timed), a share log2(1.5) of the way from 16 to 32: 2 ** (1 - 2 * log2(1.5))
    for v, want in ((16, 2.0), (32, 0.5), (8, 2.0), (64, 0.5), (24, 2 ** (1 - 2 * math.log2(1.5)))):
        assert timed.expected(0, v) == pytest.approx(ks.predict(0, v) * want)


def test_build_eval_writes_a_dispatch_table_chosen_by_measured_times(tmp_path: object) -> None:
    import subprocess
    import sys
    from pathlib import Path

    folder = Path(str(tmp_path))
    op = folder / "mm.json"
    op.write_text(json.dumps({"op": "matmul", "M": "m", "N": 32, "K": 32, "name": "mm_eval",
                              "symbols": {"m": [1, 24]}}))
    run = subprocess.run([sys.executable, "-m", "roller", "build", "--hw", "pocl-cpu", "--eval", "--repeat", "2",
                          str(op), "-o", str(folder / "out")], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert "chosen by measured" in run.stdout
    doc = json.loads((folder / "out" / "mm_eval" / "dispatch.json").read_text())
    assert doc["chosen_by"] == "measured" and doc["not_timed"] == []
    assert all(row["measured_ms"] > 0 for row in doc["samples"])
    assert doc["dispatch"][0]["from"] == 1 and doc["dispatch"][-1]["to"] == 24


def test_timed_sets_sample_the_sizes_just_past_each_sample() -> None:
    """Where the device decides, each sample plus one is sampled too (17 rows under a 16-row tile cost 32)."""
    plain = sample_sizes(1, 64)
    past = sample_sizes(1, 64, past=True)
    assert set(plain) < set(past)
    assert {17, 25, 33, 49} <= set(past) and max(past) == 64 and 17 not in plain
