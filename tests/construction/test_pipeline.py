"""The ring depth construction decides (roller/construction/pipeline.py, RProgram.stages): from the global
layer's latency, the block's step time and the shared capacity, capped by the description's max_stages."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

import roller.hw as H
from roller.construction import construct
from roller.construction.matrix import MatrixSupport
from roller.construction.pipeline import choose_stages, step_seconds
from roller.ir import load_ops
from roller.perf.traffic import TileGeometry
from roller.program import RProgram

ROOT = Path(__file__).resolve().parents[2]
WMMA = (MatrixSupport("wmma", "float16", (16, 16, 16)),)


def _top(spec: dict, desc: str, k: int = 5) -> list:
    return construct(load_ops(spec)[0], H.load(desc), top_k=k, matrix=WMMA)


MM = {"op": "matmul", "M": 4096, "N": 4096, "K": 4096, "dtype": "float16"}


def test_large_float16_gemm_is_pipelined_within_the_opt_in_capacity() -> None:
    hw = H.load("h200")
    shared = hw.memory[1]
    for p in _top(MM, "h200"):
        assert p.use_matrix and p.stages >= 2, p.line()
        latency = hw.memory[0].latency_ns
        t_step = step_seconds(p, hw)
        assert latency is not None and t_step is not None
        footprint = TileGeometry(p.expr).footprint(p.block_tile.shape, dict(p.block_tile.storage_padding))
        assert p.stages * footprint <= (shared.capacity_per_block_optin_bytes or 0)
        # deep enough to hide the latency, or held back by the cap or the capacity
        hides = (p.stages - 1) * t_step >= latency * 1e-9
        one_more = (p.stages + 1) * footprint > (shared.capacity_per_block_optin_bytes or 0) // max(
            1, p.prediction.blocks_per_unit)
        assert hides or p.stages == shared.max_stages or one_more, p.line()
        assert f"stages {p.stages}" in p.line()


def test_description_cap_and_parts_without_async_copies_keep_one_stage() -> None:
    assert all(p.stages == 1 for p in _top(MM, str(ROOT / "bench/hw/h200-s1.yaml")))
    assert all(p.stages == 1 for p in _top(MM, "v100"))  # no max_stages: no asynchronous copies described
    f32 = dict(MM, dtype="float32", M=1024, N=1024, K=1024)
    # a scalar program's rows are whole vectors (what cp.async moves) only where it reads them in vectors
    assert all(p.stages == 1 for p in _top(f32, str(ROOT / "bench/hw/h200-lds1.yaml")))
    assert all(p.stages == 1 or p.shared_vector > 1 for p in _top(f32, "h200"))
    assert any(p.stages > 1 for p in _top(f32, "h200"))


def test_few_steps_bound_the_ring() -> None:
    """A ring never holds more steps than the reduction has."""
    for p in _top({"op": "matmul", "M": 256, "N": 256, "K": 32, "dtype": "float16"}, "h200"):
        steps = math.prod(-(-a.extent // s) for a, s in zip(p.expr.axes, p.block_tile.shape) if a.reduce)
        assert p.stages <= max(1, steps)
        assert choose_stages(p, H.load("h200")) == p.stages


def test_stages_round_trip_through_json() -> None:
    p = _top(MM, "h200", 1)[0]
    assert p.stages > 1
    back = RProgram.loads(p.dumps(), p.expr.source)
    assert back.stages == p.stages and back.key() == p.key()
    with pytest.raises(ValueError, match="stages"):
        RProgram.from_json({**p.to_json(), "stages": 0}, p.expr.source)
