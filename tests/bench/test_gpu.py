"""The parts of bench/gpu.py that need no GPU: arguments, op selection with batch reduction, the report."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench/gpu.py")
gpu = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules["bench_gpu"] = gpu
_spec.loader.exec_module(gpu)  # type: ignore[union-attr]


def test_arguments() -> None:
    a = gpu.parse_args(["--suite", "scaled", "--fp16", "--top-k", "3", "--max-gib", "0.5"])
    assert (a.suite, a.fp16, a.top_k, a.max_gib, a.repeat) == ("scaled", True, 3, 0.5, 20)
    with pytest.raises(SystemExit):
        gpu.parse_args(["--top-k", "0"])
    with pytest.raises(SystemExit):
        gpu.parse_args(["--suite", "nope"])


def test_selects_every_op_of_the_119_suite_and_fp16_copies() -> None:
    ops = gpu.select_ops("roller119", None, True, 8.0, 200.0)
    names = [o["name"] for o, _ in ops]
    assert len(names) == 119 + 51 and len(set(names)) == len(names)
    assert all(o["dtype"] == "float16" for o, _ in ops if o["name"].endswith("_f16"))


def test_batch_is_halved_until_the_op_fits() -> None:
    op = {"name": "c", "op": "conv2d", "N": 128, "C": 64, "H": 56, "W": 56, "F": 64, "KH": 3, "KW": 3}
    nbytes, gflop = gpu.op_cost(op)
    small, note = gpu.shrink_batch(op, nbytes / 3, math.inf)
    assert small["N"] == 32 and note == "N 128->32"
    assert gpu.op_cost(small)[0] <= nbytes / 3
    same, note = gpu.shrink_batch(op, nbytes, gflop)
    assert same == op and note == ""
    r, note = gpu.shrink_batch({"name": "r", "op": "reduce", "kind": "sum", "shape": [64, 1000], "axes": [1]},
                               64 * 1000 * 4 / 4, math.inf)
    assert r["shape"][0] == 8 and note == "dim0 64->8"
    with pytest.raises(SystemExit):
        gpu.select_ops("scaled", "s_matmul_prime,missing_op", False, 8.0, 200.0)
    assert [o["name"] for o, _ in gpu.select_ops("scaled", "s_matmul_prime", False, 8.0, 200.0)] == ["s_matmul_prime"]


def test_categories_and_description_lookup() -> None:
    assert gpu.category("matmul", "float16") == "gemm_float16"
    assert gpu.category("depthwise_conv2d", "float32") == "conv"
    assert gpu.category("avgpool2d", "float32") == "memory"
    assert gpu.description_for("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu.description_for("Tesla V100-SXM2-16GB") == "v100"
    with pytest.raises(SystemExit):
        gpu.description_for("GeForce GTX 480")


def test_report_table_and_targets() -> None:
    rows = [gpu.Row("M1", "matmul", "float32", "gemm_float32", roller_ms=1.0, top1_ms=1.2, baseline="cuBLAS",
                    baseline_ms=0.95, ratio=0.95, ok=True, max_rel_err=1e-6, line="global>shared 64x64x32"),
            gpu.Row("C1", "conv2d", "float32", "conv", roller_ms=2.0, baseline="cuDNN", baseline_ms=1.0, ratio=0.5,
                    ok=True),
            gpu.Row("C2", "conv2d", "float32", "conv", roller_ms=1.0, baseline="cuDNN", baseline_ms=2.0, ratio=2.0,
                    ok=False),
            gpu.Row("R1", "elementwise", "float32", "memory", shrunk="dim0 128->64", error="candidate 2: boom")]
    s = gpu.summary(rows)
    assert s["gemm_float32"]["met"] is True and s["conv"]["geomean"] == pytest.approx(1.0)
    assert s["conv"]["met"] is True and s["memory"]["ops"] == 0 and s["memory"]["met"] is False
    text = gpu.markdown(rows, {"device": "NVIDIA H100", "hw": "h100", "date": "2026-01-01", "suite": "roller119",
                               "top_k": 10, "repeat": 20, "copy_gbps": 3000.0, "cudnn": "torch 2.13"})
    assert text.startswith("### CUDA on NVIDIA H100 (h100), 2026-01-01")
    assert "| gemm_float32 | 1 | 0.95 | 0.95 | 0.9 x cuBLAS | yes |" in text
    assert "| C2 | conv2d | float32 | - | 1 | - | cuDNN | 2 | 2 |" in text and "FAIL" in text
    assert "dim0 128->64" in text and "error: candidate 2: boom" in text


def test_without_gpu_exits_5(capsys: pytest.CaptureFixture[str]) -> None:
    from roller.backends.cuda.toolchain import gpu_present

    if gpu_present()[0]:
        pytest.skip("a GPU is present: bench/gpu.py would run for real")
    assert gpu.main(["--suite", "scaled", "--ops", "s_matmul_prime"]) == 5
    assert "no NVIDIA GPU" in capsys.readouterr().err


def test_ops_interleave_kinds_so_a_deadline_covers_each() -> None:
    ops = gpu.select_ops("scaled", None, True, 8.0, 200.0)
    first = [(o.get("op"), o.get("dtype", "float32")) for o, _ in ops[:12]]
    assert len(set(first)) == 12   # one op of each (kind, dtype) before a second of any
    assert sorted(o["name"] for o, _ in ops) == sorted(o["name"] for o, _ in gpu.select_ops(
        "scaled", ",".join(o["name"] for o, _ in ops), True, 8.0, 200.0))


def test_resume_keeps_the_earlier_rows_of_the_selection(tmp_path: Path) -> None:
    earlier = tmp_path / "earlier.json"
    rows = [gpu.Row("s_matmul_prime", "matmul", "float32", "gemm_float32", roller_ms=0.01, ok=True),
            gpu.Row("elsewhere", "matmul", "float32", "gemm_float32", roller_ms=0.02, ok=True)]
    earlier.write_text(json.dumps({"meta": {"copy_gbps": 3900.0, "date": "2026-11-26"},
                                   "rows": [dataclasses.asdict(r) for r in rows]}))
    kept, meta = gpu.resumed(earlier, {"s_matmul_prime", "s_matmul_k1"})
    assert [r.name for r in kept] == ["s_matmul_prime"] and kept[0].roller_ms == 0.01
    assert meta["copy_gbps"] == 3900.0
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a bench/gpu.py --json output"):
        gpu.resumed(tmp_path / "bad.json", {"x"})
    with pytest.raises(SystemExit):
        gpu.parse_args(["--deadline", "0"])


@pytest.mark.nvcc
def test_precompile_fills_the_cache_with_cubins(private_cache: Path) -> None:
    from roller.backends.cuda.toolchain import compiler_for
    from roller.errors import ToolchainError

    try:
        compiler_for("sm_90")
    except ToolchainError as err:
        pytest.skip(str(err))
    assert gpu.main(["--precompile", "--suite", "scaled", "--ops", "s_matmul_prime", "--top-k", "2",
                     "--jobs", "2"]) == 0
    assert len(list(private_cache.glob("results/cuda/*/*.bin"))) == 2


def test_precompile_refuses_the_options_of_a_gpu_run() -> None:
    with pytest.raises(SystemExit):
        gpu.parse_args(["--precompile", "--resume", "earlier.json"])
    with pytest.raises(SystemExit):
        gpu.parse_args(["--precompile", "--json", "out.json"])
    assert gpu.parse_args(["--precompile", "--jobs", "3"]).jobs == 3


def test_quick_selection_covers_every_category_of_the_paper_suite() -> None:
    ops = [o for o, _ in gpu.select_ops("roller119", "quick", True, 8.0, 20.0)]
    assert len(ops) == len(gpu.QUICK_OPS.split(",")) == 41
    cats = {gpu.category(o.get("op", "generic"), o["dtype"]) for o in ops}
    assert cats == {"gemm_float32", "gemm_float16", "conv", "memory"}
    assert {"M3_f16", "C0_f16", "E0", "R0"} <= {o["name"] for o in ops}


def test_large_and_sanitize_suites_construct_on_h200() -> None:
    import roller.hw as H
    from roller.backends import get

    hw, be = H.load("h200"), get("cuda")
    for suite in ("large", "sanitize"):
        for op, note in gpu.select_ops(suite, None, False, 8.0, 1200.0):
            assert note == "", (suite, op["name"])     # timed at the size written
            assert gpu.candidates(op, hw, be, 1)[1], (suite, op["name"])


def test_summary_reads_a_session_folder(tmp_path: Path) -> None:
    """bench/gpu_summary.py over the rows of the 2026-11-26 H200 run, and an ablation whose ops ran slower."""
    spec = importlib.util.spec_from_file_location("bench_gpu_summary", ROOT / "bench/gpu_summary.py")
    summary = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(summary)  # type: ignore[union-attr]
    paper = json.loads((ROOT / "bench/results/gpu-h200-recheck-2026-11-26.json").read_text())["paper_suite"]
    (tmp_path / "gpu-quick.json").write_text(json.dumps(paper))
    off = [dict(r, roller_ms=r["roller_ms"] * 2, line="off") for r in paper["rows"] if r["name"] in ("M3", "E0")]
    (tmp_path / "ablate-h200-x.json").write_text(json.dumps({"rows": off}))
    lines = summary.categories(paper["rows"])
    assert any(line.startswith("gemm_float16 without M0") for line in lines)
    assert summary.ablation(paper["rows"], off)[-1] == "  2 ops differ, geomean x2.000"
    assert summary.main([str(tmp_path)]) == 0
    assert summary.main([str(tmp_path / "missing")]) == 2


def test_differing_ops_lists_the_ops_a_description_changes() -> None:
    args = gpu.parse_args(["--ops", "M1,E0", "--top-k", "2", "--differing-ops", "h200"])
    assert gpu.differing_ops(args) == []            # h200 against itself
    args = gpu.parse_args(["--hw", "a100", "--ops", "M1,E0", "--top-k", "2", "--differing-ops", "h200"])
    assert sorted(gpu.differing_ops(args)) == ["E0", "M1"]
    with pytest.raises(SystemExit):
        gpu.parse_args(["--precompile", "--differing-ops", "h200"])


def test_sass_gate_flags_a_pipeline_without_cp_async_and_a_vector_program_without_vectors() -> None:
    clean = {"LDGSTS": 4, "LDL": 0, "STL": 0}
    assert gpu.sass_problems({"stages": 3}, clean) == []
    assert gpu.sass_problems({"stages": 3}, dict(clean, LDGSTS=0)) == ["a pipelined kernel without LDGSTS (cp.async)"]
    assert gpu.sass_problems({}, dict(clean, LDGSTS=0, STL=2)) == []      # a spill is counted, not refused
    vector = {"rprogram": "global>shared 4096 | shared>register 8 | grid 528 | block 512 | vector 4 grid-stride"}
    assert gpu.sass_problems(vector, dict(clean, **{"LDG.E.128": 10})) == []
    assert gpu.sass_problems(vector, clean) == ["a vector program without 16-byte loads (LDG.E.128)"]
    shared = {"rprogram": "global>shared 64x128x32 | shared>register 8x8x1 | grid 4 | block 128 | shared-vector 4"}
    assert gpu.sass_problems(shared, dict(clean, **{"LDS.128": 32})) == []
    assert gpu.sass_problems(shared, clean) == ["a shared-vector program without 16-byte shared reads (LDS.128)"]
