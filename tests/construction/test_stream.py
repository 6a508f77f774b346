"""Construction of vector programs for ops with no reuse (roller/construction/stream.py) and the model's
memory-level-parallelism term that ranks them (roller/perf/micro.py, ``inflight_bandwidth``): which ops get
them, what the description decides, and that E0 of the 119 suite ranks one first on h200."""
from __future__ import annotations

from pathlib import Path

import pytest

import roller.hw as H
from roller.construction import construct, prepared
from roller.construction.stream import stream_width
from roller.ir import load_ops
from roller.perf.micro import inflight_bandwidth
from roller.perf.traffic import TileGeometry
from roller.program import RProgram

ROOT = Path(__file__).resolve().parents[2]
E0 = {"op": "elementwise", "fn": "relu", "shapes": {"X": [128, 1008, 42, 42]}, "dtype": "float32"}


def vector_programs(spec: dict, hw: str = "h200") -> list[RProgram]:
    return [p for p in construct(load_ops(spec)[0], H.load(hw), top_k=40, vectors=True) if p.vector > 1]


@pytest.mark.parametrize("spec", [
    {"op": "elementwise", "fn": "add", "shapes": {"A": [4, 300], "B": [300]}, "dtype": "float32"},  # broadcast
    {"op": "elementwise", "fn": "relu", "shapes": {"X": [4, 300]}, "dtype": "float64"},
    {"op": "elementwise", "fn": "add", "shapes": {"A": [4096], "B": [4096]}, "dtypes": {"B": "float16"}},
    {"op": "reduce", "kind": "sum", "shape": [64, 1024], "axes": [1], "dtype": "float32"},
])
def test_reads_that_are_not_element_for_element_stay_scalar(spec: dict) -> None:
    """A broadcast, float64, tensors of two widths, a reduction: no vector program (the scalar ones stay)."""
    op = load_ops(spec)[0]
    progs = construct(op, H.load("h200"), top_k=40, vectors=True)
    assert progs and all(p.vector == 1 for p in progs)


def test_e0_top1_is_a_vector_program() -> None:
    """On h200 (vector_bytes 16, latency_ns) the suite's E0 ranks a 4-wide grid-stride program first, and its
    resident blocks keep at least Little's-law bytes in flight; with the A/B description of 4-byte accesses
    (bench/hw/h200-scalar.yaml) no vector program is built."""
    hw = H.load("h200")
    op = load_ops(E0)[0]
    top = construct(op, hw, top_k=5, vectors=True)
    p = top[0]
    assert p.vector == 4 and p.grid <= hw.parallelism.compute_units * hw.parallelism.max_blocks_per_unit
    assert p.prediction is not None
    resident = p.prediction.blocks_per_unit * p.block
    need = hw.memory[0].bandwidth_effective_gbps * hw.memory[0].latency_ns / hw.parallelism.compute_units
    assert resident * p.thread_tile.shape[0] * 4 >= need
    scalar = [q for q in top if q.vector == 1]
    if scalar:
        assert scalar[0].prediction.time_s > p.prediction.time_s * 1.5  # type: ignore[union-attr]
    ab = H.load(str(ROOT / "bench/hw/h200-scalar.yaml"))
    assert all(q.vector == 1 for q in construct(op, ab, top_k=10, vectors=True))


def test_vector_program_round_trips() -> None:
    p = vector_programs(E0)[0]
    q = RProgram.loads(p.dumps())
    assert q.vector == p.vector and q.grid == p.grid and q.line() == p.line()
    assert "vector 4 grid-stride" in p.line()


@pytest.mark.parametrize("desc,dtype,width", [("h200", "float32", 4), ("h200", "float16", 8), ("a100", "float32", 4),
                                              ("mi300x", "float32", 1), ("pocl-cpu", "float32", 1)])
def test_width_comes_from_the_description(desc: str, dtype: str, width: int) -> None:
    """vector_bytes / itemsize where the description gives vector_bytes; none without it (AMD, OpenCL CPU)."""
    hw = H.load(desc)
    assert stream_width(prepared(load_ops(dict(E0, dtype=dtype))[0], hw), hw) == width
    assert bool(vector_programs(dict(E0, dtype=dtype), desc)) == (width > 1)


def test_inflight_bandwidth_is_littles_law() -> None:
    """units x resident blocks x a block tile's input bytes / latency: 132 SMs x 16 blocks x 128 floats at
    600 ns is 1.8 TB/s; four times that with 4-float vectors."""
    hw = H.load("h200")
    geo = TileGeometry(prepared(load_ops(E0)[0], hw))
    assert inflight_bandwidth(geo, hw, (128,), 16) == pytest.approx(132 * 16 * 512 / 600e-9)
    assert inflight_bandwidth(geo, hw, (512,), 16) == pytest.approx(4 * 132 * 16 * 512 / 600e-9)
    assert inflight_bandwidth(geo, H.load("v100"), (128,), 16) == float("inf")   # no latency_ns: no cap
