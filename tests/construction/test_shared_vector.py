"""Scalar programs that read their staged rows in vectors (roller/construction/shared_vector.py,
RProgram.shared_vector): chosen from the description's block-scope ``vector_bytes``, only where every staged
input is read along its rows."""
from __future__ import annotations

from pathlib import Path

import pytest

import roller.hw as H
from roller.construction import construct
from roller.construction.shared_vector import runs, shared_vector_width
from roller.ir import load_ops
from roller.program import RProgram

ROOT = Path(__file__).resolve().parents[2]
MM = {"op": "matmul", "M": 1024, "N": 1024, "K": 1024, "dtype": "float32"}


def _top(spec: dict, desc: str, k: int = 6) -> list[RProgram]:
    return construct(load_ops(spec)[0], H.load(desc), top_k=k)


def test_float32_gemm_reads_rows_in_vectors_on_nvidia_descriptions() -> None:
    for p in _top(MM, "h200"):
        assert p.shared_vector == 4 and p.line().endswith("shared-vector 4"), p.line()
        block = p.block_tile.as_dict(p.expr)
        for name, pad in p.block_tile.storage_padding:
            inner = block["k"] if name == "A" else block["n"]
            row = (inner + pad) * 4
            assert row % 16 == 0 and (row // 16) % 2 == 1, (name, inner, pad)
        assert runs(p) == {"n": 4}   # B[k, n]: n is a row; A[m, k] is walked along k by the unrolled step


def test_element_reads_where_the_description_or_the_op_does_not_allow_vectors() -> None:
    assert all(p.shared_vector == 1 for p in _top(MM, str(ROOT / "bench/hw/h200-lds1.yaml")))
    assert all(p.shared_vector == 1 for p in _top(MM, "mi100"))   # no vector_bytes on its LDS
    conv = {"op": "conv2d", "N": 1, "C": 64, "H": 28, "W": 28, "F": 64, "KH": 3, "KW": 3, "dtype": "float32"}
    # a window read (w + s) walks columns: vector padding would put its reads on a quarter of the banks
    assert all(p.shared_vector == 1 for p in _top(conv, "h200"))


def test_width_rules() -> None:
    expr = load_ops(MM)[0]
    block = {"m": 64, "n": 128, "k": 32}
    assert shared_vector_width(expr, block, {"m": 8, "n": 8, "k": 1}, 16) == 4
    assert shared_vector_width(expr, block, {"m": 8, "n": 6, "k": 1}, 16) == 0     # runs of 6 are not vectors
    assert shared_vector_width(expr, dict(block, k=30), {"m": 8, "n": 8, "k": 1}, 16) == 0   # step of 30
    assert shared_vector_width(expr, block, {"m": 8, "n": 8, "k": 1}, 4) == 0      # one element a read
    half = load_ops(dict(MM, dtype="float16"))[0]
    assert shared_vector_width(half, block, {"m": 8, "n": 8, "k": 1}, 16) == 8


def test_serialisation_keeps_the_width_and_refuses_odd_ones() -> None:
    p = _top(MM, "h200", 1)[0]
    doc = p.to_json()
    assert doc["shared_vector"] == 4
    again = RProgram.from_json(doc)
    assert again.shared_vector == 4 and again.key() == p.key()
    with pytest.raises(ValueError, match="shared_vector"):
        RProgram.from_json(dict(doc, shared_vector=3))


def test_a_partial_reduction_step_reads_element_by_element() -> None:
    """A step that does not divide the reduction tests each point in the inner loop, and nvcc merges no read
    across the test (the SASS gate of bench/gpu_prepare.sh found such reductions without LDS.128)."""
    expr = load_ops({"op": "reduce", "kind": "sum", "shape": [128, 512, 1024], "axes": [2],
                     "dtype": "float32"})[0]
    names = [a.name for a in expr.axes]
    block = dict(zip(names, (1, 128, 48)))
    thread = dict.fromkeys(names, 1)
    assert shared_vector_width(expr, block, thread, 16) == 0
    assert shared_vector_width(expr, dict(block, **{names[-1]: 64}), thread, 16) == 4
