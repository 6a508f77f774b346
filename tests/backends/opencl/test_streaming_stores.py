"""Stores past the caches on a CPU (plan.schedule.streamed, docs/opencl.md "Streaming stores"): a description
whose global memory says ``streaming_stores`` gets non-temporal stores for outputs larger than its caches, only
where every vector stored whole is whole lines and aligned, with threads ordered along the input's rows. The
kernels run on PoCL against numpy; GPU descriptions and their backends never stream."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import roller
import roller.hw as H
from roller.backends import get
from roller.backends.opencl import probe as cl_probe
from roller.backends.opencl import streaming
from roller.compiler.check import check_against
from roller.construction import construct
from roller.errors import InputError
from roller.ir import load_op
from roller.ir.fuse import write_padded
from roller.ir.reference import random_inputs

CPU = H.load("pocl-cpu")
# The same CPU with caches of 64 KiB, so that outputs of a few hundred KiB stream and the kernels stay quick.
SMALL = H.load("pocl-cpu", overrides={"memory[1].capacity_bytes": "64KiB", "memory[1].capacity_per_unit_bytes": "32KiB"})
OPENCL = get("opencl")
NT = "__builtin_nontemporal_store"


def _src(p, hw=CPU) -> str:   # type: ignore[no-untyped-def]
    return OPENCL.render(p, hw).files["kernel.cl"]


def test_threshold_is_what_the_caches_hold() -> None:
    s = streaming(CPU)
    assert s is not None and s.min_bytes == 2 * 2**20 + 1 and s.whole_bytes == 64
    for gpu in ("v100", "h100", "mi50", "ipu-gc200"):
        assert streaming(H.load(gpu)) is None


def test_a_large_transpose_streams_along_the_input_rows() -> None:
    op = load_op({"name": "t", "op": "transpose", "shape": [4096, 4096], "perm": [1, 0]})
    p = construct(op, CPU, top_k=1)[0]
    src = _src(p)
    assert f"{NT}(rl_vr, (__global float16*)(Y + (rl_g_i1) * 4096 + (rl_g_i0)))" in src
    # adjacent threads take adjacent 16-float runs of X's rows (i1), not of Y's
    assert "rl_t_i1 = (rl_tid / 1) % " in src
    x = random_inputs(op, seed=3)
    check_against(p.line(), op, x, OPENCL.compile(OPENCL.render(p, CPU), CPU)([x["X"]]))


def test_outputs_the_caches_hold_are_stored_through_them() -> None:
    op = load_op({"name": "t", "op": "transpose", "shape": [512, 512], "perm": [1, 0]})   # 1 MiB
    for p in construct(op, CPU, top_k=3):
        src = _src(p)
        assert NT not in src and "vstore16(rl_vr" in src
    assert any(NT in _src(p, SMALL) for p in construct(op, SMALL, top_k=3))


@pytest.mark.parametrize("spec", [
    {"op": "transpose", "shape": [256, 384], "perm": [1, 0]},
    {"op": "transpose", "shape": [8, 64, 96], "perm": [0, 2, 1]},
    {"op": "transpose", "shape": [32, 48, 64], "perm": [2, 1, 0]},
    {"op": "transpose", "shape": [208, 300], "perm": [1, 0]},        # partial tiles along both axes
    {"op": "elementwise", "fn": "relu", "shapes": {"X": [64, 1024]}},
    {"op": "matmul", "M": 128, "N": 512, "K": 64},
])
def test_streamed_kernels_match_numpy(spec: dict) -> None:
    op = load_op({"name": "s", **spec})
    x = random_inputs(op, seed=5)
    streamed = 0
    for p in construct(op, SMALL, top_k=5):
        art = OPENCL.render(p, SMALL)
        streamed += NT in art.files["kernel.cl"]
        check_against(p.line(), op, x, OPENCL.compile(art, SMALL)([x[t.name] for t in op.inputs]))
    assert streamed, "no candidate streamed its output"


@pytest.mark.parametrize("shift,streams", [(16, True), (1, False), (8, False)])
def test_only_aligned_vectors_stream(shift: int, streams: bool) -> None:
    """An output written into the interior of a padded buffer (a value held inside its padding) streams only
    where the offset keeps every vector on a 64-byte boundary: a misaligned streaming store faults."""
    op = write_padded(load_op({"name": "s", "op": "elementwise", "fn": "relu", "shapes": {"X": [96, 1024]}}),
                      ((0, 0), (shift, 16 - shift)))
    x = random_inputs(op, seed=7)
    ref = roller.reference(op, x)
    streamed = 0
    for p in construct(op, SMALL, top_k=3):
        art = OPENCL.render(p, SMALL)
        streamed += NT in art.files["kernel.cl"]
        assert (NT in art.files["kernel.cl"]) == (streams and p.thread_tile.shape[-1] % 16 == 0), p.line()
        np.testing.assert_array_equal(OPENCL.compile(art, SMALL)([x["X"]]), ref, err_msg=p.line())
    assert bool(streamed) == streams


def test_gpu_backends_never_stream() -> None:
    op = load_op({"name": "t", "op": "transpose", "shape": [2048, 2048], "perm": [1, 0]})
    for hw_name, backend in (("h100", "cuda"), ("mi50", "hip")):
        hw = H.load(hw_name)
        p = construct(op, hw, top_k=1)[0]
        assert "nontemporal" not in get(backend).render(p, hw).files[get(backend).render(p, hw).main_file]


def test_streaming_stores_is_a_device_layer_flag(tmp_path: Path) -> None:
    text = (Path(H.BUNDLED_DIR) / "pocl-cpu.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("streaming_stores: true", "streaming_stores: yes please"))
    with pytest.raises(InputError, match=r"memory\[0\]\.streaming_stores.*expected true or false"):
        H.load(str(bad))
    bad.write_text(text.replace("    streaming_stores: true", "    streaming_stores: false").replace(
        "    line_bytes: 64                                    # queried cache line\n",
        "    line_bytes: 64\n    streaming_stores: true\n", 1))
    with pytest.raises(InputError, match=r"memory\[1\]\.streaming_stores.*not used by 'cache' layers"):
        H.load(str(bad))


def test_probe_writes_the_flag_only_for_a_measured_gain() -> None:
    base = cl_probe.ProbeResult(
        platform="Portable Computing Language", device="cpu", driver="1", device_type="cpu", compute_units=2,
        clock_mhz=2600, max_work_group_size=4096, local_mem_bytes=2**20, local_mem_is_global=True,
        global_mem_bytes=2**32, cacheline_bytes=64, cache_bytes=2**20, vector_width=16, warp_size=1,
        vector_registers=32, global_gbps=[30.0, 32.0], local_gbps=[100.0, 110.0], fp32_tflops=[0.2, 0.3],
        launch_us=1.0, per_block_us=0.01)
    for rows, flag in (((10.0, 30.0), True), ((10.0, 11.0), False), ((10.0, None), False), (None, False)):
        text = dataclasses.replace(base, rows_gbps=rows).to_yaml("probed")
        assert H.load_text(text, "probed.yaml").memory[0].streaming_stores is flag
