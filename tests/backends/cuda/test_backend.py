"""CUDA backend without a GPU: rendering from the shared plan, matrix programs aligned to the instruction,
dynamic shared memory above 48 KiB, compile errors with log/file/repro, GPU detection that never touches
the driver, and `roller build` writing .cu kernels for every description."""
from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest

import roller.hw as H
from roller.backends import get
from roller.backends.c_family.plan import lower
from roller.backends.cuda import DIALECT, STATIC_SMEM_LIMIT
from roller.backends.cuda.toolchain import compile_unit, compiler_for, gpu_present, parse_ptxas
from roller.backends.opencl import DIALECT as CL_DIALECT
from roller.construction import construct
from roller.construction.matrix import gemm_roles, instructions
from roller.errors import CompileError, ToolchainError
from roller.ir import load_ops

ROOT = Path(__file__).resolve().parents[3]
CUDA = get("cuda")


def _needs(target: str) -> None:
    try:
        compiler_for(target)
    except ToolchainError as err:
        pytest.skip(str(err))


def test_registered_for_nvidia_descriptions() -> None:
    from roller.backends import for_hw

    for d in ("v100", "a100", "h100", "h200"):
        assert for_hw(H.load(d)).name == "cuda"
    assert CUDA.file_ext == "cu" and "float16" in CUDA.dtypes


def test_same_plan_as_opencl() -> None:
    """CUDA and OpenCL kernels of one rProgram come from one plan: only the dialect's spelling differs."""
    op = load_ops({"op": "conv2d", "N": 2, "C": 8, "H": 9, "W": 9, "F": 16, "KH": 3, "KW": 3})[0]
    prog = construct(op, "h100", top_k=1, matrix=CUDA.matrix_support)[0]
    a, b = lower(prog, DIALECT, blocked=False), lower(prog, CL_DIALECT, blocked=False)
    assert (a.grid, a.block, a.smem_bytes, a.out_index, a.thread_points) == \
        (b.grid, b.block, b.smem_bytes, b.out_index, b.thread_points)
    assert [t.smem_strides for t in a.inputs] == [t.smem_strides for t in b.inputs]


@pytest.mark.parametrize("spec", [
    {"op": "matmul", "M": 512, "N": 256, "K": 128},
    {"op": "matmul", "M": 100, "N": 60, "K": 70, "transpose_a": True, "transpose_b": True},
    {"op": "batch_matmul", "B": 3, "M": 64, "N": 96, "K": 48},
    {"op": "conv2d", "N": 4, "C": 32, "H": 14, "W": 14, "F": 64, "KH": 3, "KW": 3},
    {"op": "conv2d", "N": 2, "C": 16, "H": 7, "W": 7, "F": 32, "KH": 1, "KW": 1, "layout": "NHWC"},
])
def test_float16_gemms_get_aligned_matrix_programs(spec: dict) -> None:
    """Paper rule 2.2a on the instruction: warp tiles are multiples of the wmma shape, reduction steps of its
    k, staged rows whole 16-byte pieces; threads = warps x 32."""
    op = load_ops(dict(spec, dtype="float16"))[0]
    for d in ("v100", "h100"):
        hw = H.load(d)
        progs = construct(op, hw, top_k=10, matrix=CUDA.matrix_support)
        mats = [p for p in progs if p.use_matrix]
        assert mats, [p.line() for p in progs]
        roles = gemm_roles(mats[0].expr)
        assert roles is not None
        for p in mats:
            assert p.matrix is not None and p.matrix.family == "wmma"
            m, n, k = p.matrix.shape
            w, b = p.thread_tile.as_dict(p.expr), p.block_tile.as_dict(p.expr)
            assert w[roles.m] % m == 0 and w[roles.n] % n == 0 and w[roles.k] == k
            assert b[roles.k] % k == 0 and b[roles.m] % w[roles.m] == 0 and b[roles.n] % w[roles.n] == 0
            assert p.block % 32 == 0
            art = CUDA.render(p, hw)
            assert "nvcuda::wmma::mma_sync" in art.source
            mx = art.extra["matrix"]
            assert mx.lda * 2 % 16 == 0 and mx.ldb * 2 % 16 == 0


def test_float32_and_non_gemm_ops_stay_scalar() -> None:
    hw = H.load("h100")
    f32 = load_ops({"op": "matmul", "M": 256, "N": 256, "K": 256})[0]
    assert instructions(f32, hw, CUDA.matrix_support) == []
    for spec in ({"op": "matmul", "M": 256, "N": 256, "K": 256},
                 {"op": "depthwise_conv2d", "N": 2, "C": 16, "H": 14, "W": 14, "KH": 3, "KW": 3,
                  "dtype": "float16"},
                 {"op": "reduce", "kind": "sum", "shape": [64, 64], "axes": [1], "dtype": "float16"}):
        progs = construct(load_ops(spec)[0], hw, top_k=10, matrix=CUDA.matrix_support)
        assert not any(p.use_matrix for p in progs)
    # The CUDA backend renders wmma only: an AMD description's MFMA instructions are not for it
    f16 = load_ops({"op": "matmul", "M": 256, "N": 256, "K": 256, "dtype": "float16"})[0]
    assert instructions(f16, H.load("mi100"), CUDA.matrix_support) == []
    relu = load_ops({"op": "elementwise", "fn": "relu", "shapes": {"X": [8, 8]}})[0]
    assert gemm_roles(relu) is None


@pytest.mark.nvcc
def test_float16_scalar_kernel_compiles() -> None:
    _needs("sm_80")
    hw = H.load("a100")
    srcs = []
    for spec in ({"op": "elementwise", "fn": "sigmoid", "shapes": {"X": [33, 65]}},
                 {"op": "maxpool2d", "N": 2, "C": 3, "H": 9, "W": 9, "K": 3, "stride": 2},
                 {"op": "reduce", "kind": "max", "shape": [7, 300], "axes": [1]}):
        op = load_ops(dict(spec, dtype="float16"))[0]
        art = CUDA.render(construct(op, hw, top_k=1, matrix=CUDA.matrix_support)[0], hw)
        assert "__half" in art.source
        srcs.append(art.source)
    res = compile_unit("\n".join(srcs), hw.target, None, "f16_scalar", use_cache=False)
    assert len(res.usage) == 3


@pytest.mark.nvcc
def test_rotary_functions_compile() -> None:
    """cos and sin (rotary position embeddings computed at run time, as Llama's export does) in the CUDA dialect."""
    _needs("sm_90")
    hw = H.load("h200")
    srcs = []
    for fn in ("cos", "sin"):
        op = load_ops({"op": "elementwise", "name": f"rotary_{fn}", "fn": fn, "shapes": {"X": [33, 65]}})[0]
        art = CUDA.render(construct(op, hw, top_k=1)[0], hw)
        assert f"{fn}f(" in art.source
        srcs.append(art.source)
    assert len(compile_unit("\n".join(srcs), hw.target, None, "rotary", use_cache=False).usage) == 2


@pytest.mark.nvcc
def test_runner_cubins_are_cached_with_their_reports(private_cache: Path) -> None:
    """A runner's compile (keep_cubin) stores the cubin beside the report: compiled on a machine without a GPU,
    it loads on one with no compiler run; a damaged cubin is compiled again, never loaded."""
    _needs("sm_90")
    hw = H.load("h200")
    op = load_ops({"op": "matmul", "M": 64, "N": 64, "K": 32})[0]
    art = CUDA.render(construct(op, hw, top_k=1)[0], hw)
    first = compile_unit(art.source, "sm_90", None, art.kernel_name, keep_cubin=True)
    assert not first.cached and first.cubin is not None
    blob = first.cubin.read_bytes()
    again = compile_unit(art.source, "sm_90", None, art.kernel_name, keep_cubin=True)
    assert again.cached and again.cubin is not None and again.cubin.read_bytes() == blob
    report_only = compile_unit(art.source, "sm_90", None, art.kernel_name)
    assert report_only.cached and report_only.cubin is None
    (stored,) = private_cache.glob("results/cuda/*/*.bin")
    stored.write_bytes(blob[:100])
    redone = compile_unit(art.source, "sm_90", None, art.kernel_name, keep_cubin=True)
    assert not redone.cached and redone.cubin is not None and redone.cubin.read_bytes() == blob
    assert stored.read_bytes() == blob
    from roller import cache

    cache.clear()   # `roller cache clear` takes the reports and cubins too
    assert not list(private_cache.glob("results/**/*.*"))


@pytest.mark.nvcc
def test_dynamic_shared_memory_above_48k() -> None:
    """With the opt-in limit in the description, tiles over 48 KiB come from dynamic shared memory (static
    arrays cannot exceed 48 KiB) and launch.json says how much to request."""
    _needs("sm_90")
    hw = H.load("h100", {"memory[1].capacity_per_block_bytes": "227KiB"})
    srcs, dyn = [], []
    for dtype in ("float32", "float16"):
        op = load_ops({"op": "matmul", "M": 4096, "N": 4096, "K": 4096, "dtype": dtype, "name": f"big_{dtype}"})[0]
        for i, p in enumerate(construct(op, hw, top_k=10, matrix=CUDA.matrix_support)):
            art = CUDA.render(p, hw)
            if art.launch["dynamic_shared_bytes"]:
                # a pipelined ring is dynamic whatever its size
                assert art.launch["dynamic_shared_bytes"] > STATIC_SMEM_LIMIT or art.launch.get("stages", 1) > 1
                assert "extern __shared__" in art.source
                srcs.append(art.source.replace(f"void {art.kernel_name}(", f"void {art.kernel_name}_{i}("))
                dyn.append(f"{art.kernel_name}_{i}")
    assert len(dyn) >= 2
    res = compile_unit("\n".join(srcs), hw.target, None, "dyn", use_cache=False)
    for k in dyn:
        assert res.usage[k].smem_bytes < 1024  # nothing static: the tiles are dynamic


@pytest.mark.nvcc
def test_compile_error_shows_log_file_and_repro(tmp_path: Path) -> None:
    _needs("sm_90")
    bad = 'extern "C" __global__ void broken(float* y) { y[0] = undefined_name; }\n'
    with pytest.raises(CompileError) as info:
        compile_unit(bad, "sm_90", tmp_path, "broken", use_cache=False)
    msg = str(info.value)
    assert "undefined_name" in msg and f"kernel: {tmp_path / 'broken.cu'}" in msg and "repro: " in msg
    assert (tmp_path / "broken.cu").read_text() == bad
    repro = msg.split("repro: ", 1)[1].strip()
    out = subprocess.run(repro, check=False, shell=True, capture_output=True, text=True)
    assert out.returncode != 0 and "undefined_name" in out.stdout + out.stderr
    assert info.value.exit_code == 3


@pytest.mark.nvcc
def test_nvrtc_compile_error(tmp_path: Path) -> None:
    _needs("sm_70")
    with pytest.raises(CompileError) as info:
        compile_unit('extern "C" __global__ void b(float* y) { y[0] = nope; }\n', "sm_70", tmp_path, "b",
                     use_cache=False)
    assert "nvrtc" in str(info.value) and "nope" in str(info.value) and "toolchain --nvrtc sm_70" in str(info.value)


def test_unknown_target_is_a_toolchain_error() -> None:
    with pytest.raises(ToolchainError) as info:
        compiler_for("sm_10")
    assert "nvidia-cuda-nvrtc-cu12" in str(info.value) and info.value.exit_code == 5


def test_parse_ptxas_report() -> None:
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'a' for 'sm_90'
ptxas info    : Function properties for a
ptxas         .     8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 8 bytes cumulative stack size, 2312 bytes smem
ptxas info    : Compiling entry function 'b' for 'sm_90'
ptxas info    : Function properties for b
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 360 bytes cmem[0]
"""
    u = parse_ptxas(log)
    assert (u["a"].registers, u["a"].smem_bytes, u["a"].spill_stores, u["a"].spill_loads) == (128, 2312, 8, 12)
    assert (u["b"].registers, u["b"].smem_bytes, u["b"].barriers) == (10, 0, 0)


@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="this machine has an NVIDIA device")
def test_no_gpu_detected_without_touching_the_driver() -> None:
    code = ("import sys; from roller.backends import get; b = get('cuda'); "
            "print(b.can_run_here(), b.why_not_here()); print('cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    first, second = out.stdout.strip().splitlines()
    assert first.startswith("False") and "/dev/nvidia" in first
    assert second == "False"  # cupy (and so the driver) never loaded
    assert gpu_present()[0] is False


def test_run_without_gpu_is_a_toolchain_error(tmp_path: Path) -> None:
    if gpu_present()[0]:
        pytest.skip("a GPU is present")
    op = tmp_path / "op.json"
    op.write_text(json.dumps({"op": "matmul", "M": 8, "N": 8, "K": 8}))
    out = subprocess.run([sys.executable, "-m", "roller", "run", "--hw", "h100", str(op)], check=False,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 5, out.stderr
    assert "/dev/nvidia" in out.stderr


@pytest.mark.parametrize("desc", ["v100", "a100", "h100", "h200"])
def test_cli_build_writes_cu_and_launch_for_every_suite_op(tmp_path: Path, desc: str) -> None:
    suite = ROOT / "bench/suites/scaled.json"
    names = [o["name"] for o in json.loads(suite.read_text())["ops"]]
    out = subprocess.run([sys.executable, "-m", "roller", "build", "--hw", desc, str(suite), "--top-k", "3",
                          "-o", str(tmp_path / "out")], check=False, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    for name in names:
        launch = json.loads((tmp_path / "out" / name / "launch.json").read_text())
        src = (tmp_path / "out" / name / "kernel.cu").read_text()
        assert launch["backend"] == "cuda" and launch["target"] == H.load(desc).target
        assert f'extern "C" __global__ __launch_bounds__({launch["block"][0]}) void {launch["kernel"]}(' in src


def test_construction_pipelines_exactly_what_the_backend_renders_as_a_ring() -> None:
    """construction/pipeline.py's copies_whole_vectors restates the plan's stage_width rule: over the float16
    copies of the 119 suite's GEMMs and convolutions on h200 it holds exactly where every staged tile stages
    as 16-byte vectors, and the kernel renders the ring construction chose."""
    from roller.backends.cuda.check import suite_ops
    from roller.construction.pipeline import copies_whole_vectors

    hw = H.load("h200")
    seen = {True: 0, False: 0}
    for op in suite_ops(ROOT / "bench/suites/roller119.json"):
        if not op.name.endswith("_f16"):
            continue
        for p in construct(op, hw, top_k=3, matrix=CUDA.matrix_support):
            art = CUDA.render(p, hw)
            plan = art.extra["plan"]
            vectors = bool(plan.staged and all(t.stage_vec for t in plan.inputs))
            assert copies_whole_vectors(p) == vectors, p.line()
            assert art.launch.get("stages", 1) == p.stages, p.line()
            seen[vectors] += 1
    assert seen[True] and seen[False], seen
