"""Reads through a run-time index in the IR (``roller.ir.expr.Gather``): parsing and printing, the type rules,
the reference's wrap-then-clamp, the refusals, and the passes that must leave a gathered read alone."""
from __future__ import annotations

import numpy as np
import pytest

import roller
from roller.errors import InputError
from roller.ir.build import build_expr
from roller.ir.expr import Affine, Gather, Read, gathers, map_reads
from roller.ir.parse import parse_statement
from roller.ir.tensor_expr import TensorExpr
from roller.ir.typed_eval import gather_index


def embed(n: int = 10, d: int = 4, k: int = 6, idx: str = "int64") -> TensorExpr:
    return build_expr("embed", "Y[i,d] = E[ids[i], d]", {"E": [n, d], "ids": [k], "Y": [k, d]},
                      dtypes={"ids": idx})


def test_parse_print_round_trip() -> None:
    for text in ("E[ids[i],d] * 2.0", "X[b,idx[j] + 1] + 1.0", "X[I[i,j],j]"):
        body = parse_statement(f"Y[i,j] = {text}").body
        assert gathers(body), text
        assert str(parse_statement(f"Y[i,j] = {body}").body) == str(body)
    g = parse_statement("Y[i,d] = E[ids[i], d]").body
    assert isinstance(g, Gather) and g.dim == 0 and g.source.index[0] == Affine((), 0)
    assert str(g.index) == "ids[i]"


def test_gather_index_wraps_once_then_clamps() -> None:
    np.testing.assert_array_equal(gather_index(np.array([0, 9, -1, -10, -11, 10, 2**40]), 10),
                                  [0, 9, 9, 0, 0, 9, 9])


def test_reference_reads_rows_by_index() -> None:
    expr = embed()
    e = np.arange(40, dtype=np.float32).reshape(10, 4)
    ids = np.array([3, -1, 12, -30, 0, 7])
    y = roller.reference(expr, {"E": e, "ids": ids})
    np.testing.assert_array_equal(y, e[[3, 9, 9, 0, 0, 7]])


@pytest.mark.parametrize(("text", "dtypes", "message"), [
    ("Y[i,d] = E[f[i], d]", {}, "the run-time index of E must be an integer, got float32"),
    ("Y[i,d] = E[m[i], d]", {"m": "bool"}, "the run-time index of E must be an integer, got bool"),
    ("Y[i] += E[ids[i], d]", {"ids": "int64"}, r"supported in elementwise ops \('='\) only"),
    ("Y[i,d] = E[a[i], b[d]]", {"a": "int64", "b": "int64"}, "a read takes one run-time index at most"),
])
def test_refusals(text: str, dtypes: dict[str, str], message: str) -> None:
    shapes = {"E": [10, 4], "f": [6], "m": [6], "ids": [6], "a": [6], "b": [4], "Y": [6, 4] if "d]" in text[:8]
              else [6]}
    with pytest.raises(InputError, match=message):
        build_expr("bad", text, {k: v for k, v in shapes.items() if k in text}, dtypes=dtypes)


def test_map_reads_keeps_the_gather_and_refuses_to_recompute_its_row() -> None:
    g = parse_statement("Y[i,d] = E[ids[i], d]").body
    renamed = map_reads(g, lambda r: Read(r.tensor.lower(), r.index, r.pos))
    assert isinstance(renamed, Gather) and str(renamed) == "e[ids[i],d]"
    with pytest.raises(TypeError, match="cannot be replaced"):
        map_reads(g, lambda r: r if r.tensor == "ids" else parse_statement("Y[i] = P[i] * 2.0").body)


def test_passes_leave_gathered_reads_alone() -> None:
    """No layout variant repacks a gathered table, and fusion never puts a gathered read into a reduction."""
    from roller.construction.layout import packed_variants
    from roller.graph.fusion import _renderable

    assert packed_variants(embed(64, 64, 64), {"E"}, block=16) == []
    red = build_expr("red", "Y[i] += X[i,d]", {"X": [6, 4]})
    fused = red.remap_reads(lambda r: embed().body if r.tensor == "X" else r)
    assert not _renderable(fused)


def test_a_gathered_tensor_keeps_its_dimensions_through_preparation() -> None:
    """Axis fusion may not merge the dimensions of a tensor read through a run-time index (the index names its
    dimension by position), and no padded copy shifts it."""
    from roller.ir.fuse import fusible_groups, window_pads

    pick = build_expr("pick", "Y[a,b,c] = X[a,b,I[a,b,c]]", {"X": [2, 5, 3], "I": [2, 5, 4], "Y": [2, 5, 4]},
                      dtypes={"I": "int64"})
    assert fusible_groups(pick) == []
    shifted = build_expr("shifted", "Y[i,j] = X[ids[i], j - 1]", {"X": [7, 5], "ids": [3], "Y": [3, 5]},
                         dtypes={"ids": "int64"})
    assert "X" not in window_pads(shifted)
