"""Split-K as a construction decision (roller/construction/splitk.py): offered only to a backend that renders
it, where the output tiles do not fill the device and the reduction is long, ranked by the model with the
partials' traffic and the second kernel added."""
from __future__ import annotations

from pathlib import Path

import pytest

import roller.hw as H
from roller.backends import get
from roller.construction import construct, predict_program
from roller.construction.splitk import output_tiles, reduce_seconds, split_factors, split_program, splittable
from roller.ir import load_ops

ROOT = Path(__file__).resolve().parents[2]
CUDA = get("cuda")


def _op(**spec):  # type: ignore[no-untyped-def]
    return load_ops(dict({"op": "matmul"}, **spec))[0]


@pytest.mark.parametrize("spec", [
    {"M": 2048, "N": 1024, "K": 30522},   # M6 at the size bench/gpu.py runs it (batch halved to 200 GFLOP)
    {"M": 1024, "N": 1024, "K": 30522},
    {"M": 128, "N": 1000, "K": 4032},     # M1
    {"M": 128, "N": 1000, "K": 2048},     # M2
])
def test_few_tiles_long_k_split_on_h200(spec: dict) -> None:
    hw = H.load("h200")
    top = construct(_op(dtype="float32", **spec), hw, top_k=5, matrix=CUDA.matrix_support, split_k=True)[0]
    assert top.reduce_threads > 1, top.line()
    assert output_tiles(top) * top.reduce_threads >= hw.parallelism.compute_units
    assert top.grid == output_tiles(top) * top.reduce_threads


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_big_square_gemm_stays_unsplit(dtype: str) -> None:
    hw = H.load("h200")
    progs = construct(_op(M=4096, N=4096, K=4096, dtype=dtype), hw, top_k=10, matrix=CUDA.matrix_support,
                      split_k=True)
    assert all(p.reduce_threads == 1 for p in progs), [p.line() for p in progs]


def test_only_a_caller_that_renders_it_gets_split_programs() -> None:
    hw = H.load("h200")
    op = _op(M=2048, N=1024, K=30522, dtype="float32")
    assert all(p.reduce_threads == 1 for p in construct(op, hw, top_k=10, matrix=CUDA.matrix_support))
    for name in ("opencl", "hip"):
        assert not get(name).split_k
    assert CUDA.split_k


def test_opencl_cpu_description_never_splits() -> None:
    hw = H.load("pocl-cpu")
    for spec in ({"M": 8, "N": 16, "K": 8192}, {"M": 128, "N": 1000, "K": 4032}):
        progs = construct(_op(dtype="float32", **spec), hw, top_k=10, split_k=True)
        assert all(p.reduce_threads == 1 for p in progs)


def test_description_knob_turns_split_off() -> None:
    """bench/hw/h200-nosplit.yaml (extends the bundled h200, ``max_split_k: 1``) loads from outside
    roller/hwdesc and offers no split; it differs from h200 in that knob alone."""
    off = H.load(str(ROOT / "bench/hw/h200-nosplit.yaml"))
    on = H.load("h200")
    assert off.parallelism.max_split_k == 1 and on.parallelism.max_split_k > 1
    assert off.content_hash() != on.content_hash()
    op = _op(M=2048, N=1024, K=30522, dtype="float32")
    assert all(p.reduce_threads == 1 for p in construct(op, off, top_k=10, matrix=CUDA.matrix_support,
                                                        split_k=True))


def test_split_factors_fill_the_device_and_keep_k_steps() -> None:
    hw = H.load("h200")
    op = _op(M=2048, N=1024, K=30522, dtype="float32")
    base = next(p for p in construct(op, hw, top_k=10, matrix=CUDA.matrix_support) if p.reduce_threads == 1)
    factors = split_factors(base, hw)
    assert factors and factors[0] == 2
    slots = hw.parallelism.compute_units * base.prediction.blocks_per_unit  # type: ignore[union-attr]
    if base.grid < slots:
        assert base.grid * factors[-1] >= slots or factors[-1] == hw.parallelism.max_split_k
    # a short reduction is not split
    short = construct(_op(M=64, N=64, K=64, dtype="float32"), hw, top_k=1)[0]
    assert split_factors(short, hw) == []


def test_model_charges_the_partials_and_the_second_kernel() -> None:
    hw = H.load("h200")
    op = _op(M=2048, N=1024, K=30522, dtype="float32")
    assert reduce_seconds(op, 4, hw) > reduce_seconds(op, 2, hw) > 0
    base = next(p for p in construct(op, hw, top_k=10) if p.reduce_threads == 1)
    split = split_program(base, 2, hw)
    assert split is not None and split.prediction is not None
    layers = dict(split.prediction.layer_times_s)
    assert layers["split-k reduce"] == pytest.approx(reduce_seconds(op, 2, hw))
    # predict_program re-derives the same prediction from the split program alone
    again = predict_program(split, hw)
    assert again is not None and again.time_s == pytest.approx(split.prediction.time_s)


def test_only_plain_sums_are_splittable() -> None:
    import dataclasses

    from roller.ir.expr import Const

    op = _op(M=64, N=64, K=4096, dtype="float32")
    assert splittable(op)
    assert not splittable(dataclasses.replace(op, epilogue=Const(0.0)))
    assert not splittable(_op(M=64, N=64, K=4096, dtype="float64"))


def test_split_program_round_trips_through_json() -> None:
    from roller.program import RProgram

    hw = H.load("h200")
    top = construct(_op(M=2048, N=1024, K=30522, dtype="float32"), hw, top_k=3, matrix=CUDA.matrix_support,
                    split_k=True)[0]
    back = RProgram.loads(top.dumps())
    assert back.reduce_threads == top.reduce_threads and back.grid == top.grid and back.key() == top.key()
    assert "split-k" in top.line()
