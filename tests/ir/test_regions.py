"""Region queries, FLOP and byte counts, axis fusion and the implicit GEMM, checked against hand-worked numbers
and against brute-force enumeration of the points a tile touches."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from roller.ir import Affine, parse_ops
from roller.ir.fuse import fuse_axes, fusible_groups, implicit_gemm, prepare, regroup


def _one(obj):
    (op,) = parse_ops(obj, None)
    return op


MATMUL = {"op": "matmul", "M": 128, "N": 256, "K": 64}
STRIDED_DILATED = {"expr": "Y[n,f,h,w] += X[n,c,2*h+2*r,2*w+2*s] * W[f,c,r,s]",
                   "shapes": {"X": [1, 4, 33, 33], "W": [8, 4, 3, 3], "Y": [1, 8, 15, 15]}}


def brute_region(op, name, tile, origin=None):
    """Bounding box of the indices a tile (starting at ``origin``) reads, by enumerating every point."""
    origin = origin or {a: 0 for a in tile}
    t = op.tensor(name)
    lo = [math.inf] * len(t.shape)
    hi = [-math.inf] * len(t.shape)
    names = [a.name for a in op.axes]
    for point in itertools.product(*[range(origin[a], origin[a] + tile[a]) for a in names]):
        env = dict(zip(names, point))
        for idx in op.accesses(name):
            for d, i in enumerate(idx):
                v = i.evaluate(env)
                lo[d], hi[d] = min(lo[d], v), max(hi[d], v)
    return tuple(min(h - l + 1, s) for l, h, s in zip(lo, hi, t.shape))


# ---- matmul ---------------------------------------------------------------------------------------------------

def test_matmul_tile_regions():
    op = _one(MATMUL)
    tile = {"m": 32, "n": 64, "k": 16}
    assert op.region("A", tile) == (32, 16)
    assert op.region("B", tile) == (16, 64)
    assert op.region("C", tile) == (32, 64)
    assert op.output_region(tile) == (32, 64)
    assert op.region_bytes("A", tile) == 32 * 16 * 4
    assert op.region_bytes("B", tile) == 16 * 64 * 4
    assert op.tile_flops(tile) == 2 * 32 * 64 * 16


def test_matmul_transposed_regions_follow_storage():
    op = _one({**MATMUL, "transpose_a": True, "transpose_b": True})
    tile = {"m": 32, "n": 64, "k": 16}
    assert op.region("A", tile) == (16, 32)
    assert op.region("B", tile) == (64, 16)


def test_matmul_totals():
    op = _one(MATMUL)
    assert op.flops == 2 * 128 * 256 * 64
    assert op.bytes == (128 * 64 + 64 * 256 + 128 * 256) * 4
    assert op.flops_per_point == 2
    half = _one({**MATMUL, "dtype": "float16"})
    assert half.bytes == op.bytes // 2 and half.flops == op.flops
    assert half.region_bytes("A", {"m": 32, "n": 64, "k": 16}) == 32 * 16 * 2


def test_axes_of_each_tensor():
    op = _one(MATMUL)
    assert op.axes_of("A") == ("m", "k")
    assert op.axes_of("B") == ("n", "k")
    assert op.axes_of("C") == ("m", "n")


# ---- convolutions and windows ---------------------------------------------------------------------------------

def test_strided_dilated_conv_bounding_box():
    op = _one(STRIDED_DILATED)
    tile = {"n": 1, "f": 8, "h": 4, "w": 5, "c": 2, "r": 3, "s": 3}
    # rows: 2*(4-1) + 2*(3-1) + 1 = 11; cols: 2*(5-1) + 2*(3-1) + 1 = 13
    assert op.region("X", tile) == (1, 2, 11, 13)
    assert op.region("W", tile) == (8, 2, 3, 3)
    assert op.region("Y", tile) == (1, 8, 4, 5)
    # A reduction tile of one window row: 2*(4-1) + 1 = 7 rows (stride gaps included in the box).
    assert op.region("X", {**tile, "r": 1, "s": 1}) == (1, 2, 7, 9)
    # One output pixel, whole window: the dilated window 2*(3-1)+1 = 5.
    assert op.region("X", {**tile, "h": 1, "w": 1}) == (1, 2, 5, 5)
    assert op.region("X", tile) == brute_region(op, "X", tile)


def test_strided_dilated_conv_flops():
    op = _one(STRIDED_DILATED)
    assert op.flops == 2 * 1 * 8 * 15 * 15 * 4 * 3 * 3
    assert op.tile_flops({"n": 1, "f": 2, "h": 3, "w": 1, "c": 4, "r": 1, "s": 3}) == 2 * 2 * 3 * 4 * 3


def test_named_conv_matches_generic_regions():
    op = _one({"op": "conv2d", "N": 1, "C": 4, "H": 33, "W": 33, "F": 8, "KH": 3, "KW": 3, "stride": 2,
               "dilation": 2, "padding": "VALID"})
    gen = _one(STRIDED_DILATED)
    tile = {"n": 1, "f": 8, "h": 4, "w": 5, "c": 2, "r": 3, "s": 3}
    for t in ("X", "W", "Y"):
        assert op.region(t, tile) == gen.region(t, tile)
    assert op.content_hash() == gen.content_hash()


def test_pooling_window():
    op = _one({"op": "maxpool2d", "N": 1, "C": 16, "H": 32, "W": 32, "K": 3, "stride": 2})
    assert op.output.shape == (1, 16, 15, 15)
    tile = {"n": 1, "c": 4, "h": 2, "w": 3, "r": 3, "s": 3}
    # 2*(2-1) + 3 = 5 rows, 2*(3-1) + 3 = 7 cols
    assert op.region("X", tile) == (1, 4, 5, 7)
    assert op.output_region(tile) == (1, 4, 2, 3)
    # max= counts one operation per point of the iteration space.
    assert op.flops_per_point == 1
    assert op.tile_flops(tile) == 4 * 2 * 3 * 9
    assert op.flops == 16 * 15 * 15 * 9


def test_overlapping_windows_stride_one():
    op = _one({"op": "avgpool2d", "N": 1, "C": 1, "H": 16, "W": 16, "K": 3, "stride": 1})
    tile = {"n": 1, "c": 1, "h": 4, "w": 4, "r": 3, "s": 3}
    assert op.region("X", tile) == (1, 1, 6, 6)
    assert op.flops_per_point == 2  # the division by K*K and the sum
    assert op.flops == 14 * 14 * 9 * 2


def test_clipping_to_tensor_extent():
    # A SAME 3x3 conv reads rows h-1 .. h+1: a full tile covers 58 rows of a 56-row tensor.
    op = _one({"op": "conv2d", "N": 1, "C": 8, "H": 56, "W": 56, "F": 8, "KH": 3, "KW": 3})
    full = op.extents
    assert op.region("X", full) == (1, 8, 56, 56)
    tile = {**full, "h": 8, "w": 56}
    assert op.region("X", tile) == (1, 8, 10, 56)
    assert op.region_bytes("X", full) == 8 * 56 * 56 * 4
    # The strided dilated conv: the full tile reaches exactly the last row.
    sd = _one(STRIDED_DILATED)
    assert sd.region("X", sd.extents) == (1, 4, 33, 33)
    # Tiles larger than the iteration space are clipped too.
    mm = _one({"op": "matmul", "M": 10, "N": 20, "K": 30})
    assert mm.region("A", {"m": 64, "n": 64, "k": 64}) == (10, 30)


def test_multiple_reads_of_one_tensor_take_the_union():
    op = _one({"expr": "Y[i] = X[i+1] + X[i+2] - X[2*i-i+1]", "shapes": {"X": [10], "Y": [8]}})
    assert op.accesses("X") == [(Affine.of({"i": 1}, 1),), (Affine.of({"i": 1}, 2),)]
    assert op.region("X", {"i": 4}) == (5,)
    assert op.flops_per_point == 2


def test_negative_coefficients():
    op = _one({"expr": "Y[i] += X[i-k+4] * K[k]", "shapes": {"X": [12], "K": [5], "Y": [8]}})
    tile = {"i": 3, "k": 5}
    assert op.region("X", tile) == (7,) == brute_region(op, "X", tile)


def test_broadcast_dimension_region_is_one():
    op = _one({"op": "elementwise", "fn": "add", "shapes": {"A": [2, 16, 7, 7], "B": [16, 1, 1]}})
    tile = {"i0": 2, "i1": 4, "i2": 7, "i3": 3}
    assert op.region("B", tile) == (4, 1, 1)
    assert op.region("A", tile) == (2, 4, 7, 3)
    assert op.flops == 2 * 16 * 7 * 7


@pytest.mark.parametrize("obj", [
    STRIDED_DILATED,
    {"op": "conv2d", "N": 2, "C": 3, "H": 9, "W": 7, "F": 2, "KH": 3, "KW": 2, "stride": 2, "padding": "SAME",
     "layout": "NHWC"},
    {"op": "depthwise_conv2d", "N": 1, "C": 3, "H": 9, "W": 9, "KH": 5, "KW": 5, "stride": 2, "dilation": 2},
    {"op": "maxpool2d", "N": 1, "C": 2, "H": 9, "W": 9, "K": 3, "stride": 2, "padding": "SAME"},
    {"expr": "Y[i,j] += X[3*i-j+k, j+2*k] * W[k]", "shapes": {"X": [40, 40], "W": [4], "Y": [8, 8]}},
])
def test_region_equals_enumeration_for_random_tiles(obj):
    op = _one(obj)
    rng = np.random.default_rng(0)
    for _ in range(12):
        tile = {a.name: int(rng.integers(1, a.extent + 1)) for a in op.axes}
        if math.prod(tile.values()) > 20000:
            continue
        for t in op.tensors:
            assert op.region(t.name, tile) == brute_region(op, t.name, tile), (t.name, tile)


# ---- flops and bytes ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("obj,flops", [
    ({"op": "elementwise", "fn": "relu", "shapes": {"X": [4, 5]}}, 20),
    ({"op": "elementwise", "fn": "neg", "shapes": {"X": [4, 5]}}, 20),
    ({"op": "transpose", "shape": [4, 5], "perm": [1, 0]}, 20),  # a copy still counts one per point
    ({"op": "reduce", "kind": "sum", "shape": [4, 5], "axes": [1]}, 20),
    ({"op": "reduce", "kind": "mean", "shape": [4, 5], "axes": [1]}, 40),
    ({"expr": "Y[i] = exp(X[i]) * 2.0 + 1.0", "shapes": {"X": [10]}}, 30),
    ({"op": "batch_matmul", "B": 3, "M": 4, "N": 5, "K": 6}, 2 * 3 * 4 * 5 * 6),
    ({"op": "depthwise_conv2d", "N": 1, "C": 3, "H": 6, "W": 6, "KH": 3, "KW": 3}, 2 * 3 * 36 * 9),
])
def test_flops(obj, flops):
    assert _one(obj).flops == flops


def test_compulsory_bytes():
    op = _one({"op": "conv2d", "N": 1, "C": 3, "H": 8, "W": 8, "F": 4, "KH": 3, "KW": 3, "stride": 2})
    assert op.output.shape == (1, 4, 4, 4)
    assert op.bytes == (3 * 64 + 4 * 3 * 9 + 4 * 16) * 4


# ---- fusion -------------------------------------------------------------------------------------------------------

def test_relu_4d_fuses_to_1d():
    op = _one({"op": "elementwise", "fn": "relu", "shapes": {"X": [2, 3, 4, 5]}})
    f = fuse_axes(op)
    assert [(a.name, a.extent, a.reduce) for a in f.axes] == [("i0i1i2i3", 120, False)]
    assert f.statement() == "Y[i0i1i2i3] = relu(X[i0i1i2i3])"
    assert [t.shape for t in f.tensors] == [(120,), (120,)]
    assert [t.storage_shape for t in f.tensors] == [(2, 3, 4, 5), (2, 3, 4, 5)]
    assert f.source is op and f.flops == op.flops and f.bytes == op.bytes
    assert prepare(op).statement() == f.statement()


def test_pool_fuses_n_and_c():
    op = _one({"op": "maxpool2d", "N": 2, "C": 3, "H": 8, "W": 8, "K": 2})
    f = prepare(op)
    assert [(a.name, a.extent, a.reduce) for a in f.axes] == [
        ("nc", 6, False), ("h", 4, False), ("w", 4, False), ("r", 2, True), ("s", 2, True)]
    assert f.tensor("X").shape == (6, 8, 8) and f.tensor("X").storage_shape == (2, 3, 8, 8)
    assert f.output.shape == (6, 4, 4)
    assert f.statement() == "Y[nc,h,w] max= X[nc,2*h+r,2*w+s]"
    assert f.region("X", {"nc": 2, "h": 2, "w": 2, "r": 2, "s": 2}) == (2, 4, 4)


def test_transpose_fuses_adjacent_dims():
    op = _one({"op": "transpose", "shape": [2, 3, 4, 5], "perm": [0, 2, 3, 1]})
    f = prepare(op)
    assert [(a.name, a.extent) for a in f.axes] == [("i0", 2), ("i2i3", 20), ("i1", 3)]
    assert f.tensor("X").shape == (2, 3, 20)
    assert f.output.shape == (2, 20, 3)
    assert f.statement() == "Y[i0,i2i3,i1] = X[i0,i1,i2i3]"


def test_full_reversal_does_not_fuse():
    op = _one({"op": "transpose", "shape": [3, 4], "perm": [1, 0]})
    assert fusible_groups(op) == []
    assert fuse_axes(op) is op
    assert prepare(op) is op


def test_reduce_fuses_spatial_and_reduction_separately():
    op = _one({"op": "reduce", "kind": "sum", "shape": [2, 64, 7, 7], "axes": [2, 3]})
    f = prepare(op)
    assert [(a.name, a.extent, a.reduce) for a in f.axes] == [("i0i1", 128, False), ("i2i3", 49, True)]
    assert f.statement() == "Y[i0i1] += X[i0i1,i2i3]"


def test_bias_add_fuses_only_what_both_inputs_allow():
    op = _one({"op": "elementwise", "fn": "add", "shapes": {"A": [2, 16, 7, 7], "B": [16, 1, 1]}})
    f = prepare(op)
    assert [(a.name, a.extent) for a in f.axes] == [("i0", 2), ("i1", 16), ("i2i3", 49)]
    assert f.tensor("A").shape == (2, 16, 49)
    assert f.tensor("B").shape == (16, 1, 1)


def test_matmul_and_batch_matmul_do_not_fuse():
    for obj in (MATMUL, {"op": "batch_matmul", "B": 2, "M": 3, "N": 4, "K": 5}):
        op = _one(obj)
        assert prepare(op) is op


def test_prepare_is_idempotent():
    op = _one({"op": "elementwise", "fn": "relu", "shapes": {"X": [2, 3]}})
    p = prepare(op)
    assert prepare(p) is p


def test_conv_implicit_gemm():
    op = _one({"op": "conv2d", "N": 2, "C": 3, "H": 8, "W": 8, "F": 5, "KH": 3, "KW": 3, "stride": 2})
    g = prepare(op)
    assert g is not op and g.source is op
    assert [(a.name, a.extent, a.reduce) for a in g.axes] == [
        ("nhw", 2 * 4 * 4, False), ("f", 5, False), ("crs", 3 * 9, True)]
    assert g.statement() == "Y[nhw,f] += X[nhw,crs] * W[f,crs]"
    w = g.tensor("W")
    assert w.shape == (5, 27) and w.view is not None and w.view.is_reshape()
    assert w.storage_shape == (5, 3, 3, 3)
    x = g.tensor("X")
    assert x.shape == (32, 27) and x.view is not None and not x.view.is_reshape()
    assert x.storage_shape == (2, 3, 8, 8)
    assert g.output.shape == (32, 5) and g.output.storage_shape == (2, 5, 4, 4)
    assert g.flops == op.flops and g.bytes == op.bytes
    assert g.region("X", {"nhw": 16, "f": 5, "crs": 9}) == (16, 9)
    assert g.region_bytes("W", {"nhw": 16, "f": 5, "crs": 9}) == 5 * 9 * 4


def test_nhwc_conv_implicit_gemm_keeps_weight_storage_order():
    op = _one({"op": "conv2d", "N": 1, "C": 3, "H": 6, "W": 6, "F": 4, "KH": 3, "KW": 3, "layout": "NHWC"})
    g = implicit_gemm(op)
    assert [(a.name, a.extent, a.reduce) for a in g.axes] == [("nhw", 36, False), ("f", 4, False),
                                                              ("rsc", 27, True)]
    assert g.tensor("W").view.is_reshape() and g.tensor("W").shape == (27, 4)
    # NHWC output: n,h,w then f is already row-major, so the output is a reshape as well.
    assert g.output.view.is_reshape()


def test_prepare_without_gemm_fuses_conv_axes_only():
    op = _one({"op": "conv2d", "N": 2, "C": 3, "H": 8, "W": 8, "F": 5, "KH": 3, "KW": 3})
    assert prepare(op, gemm_conv=False) is op  # nothing of a 3x3 NCHW conv is adjacent in every tensor


def test_regroup_rejects_mixed_groups():
    op = _one(MATMUL)
    with pytest.raises(ValueError):
        regroup(op, [["n", "k"]])


def test_view_decodes_to_the_right_elements():
    """Reading the im2col view element by element gives the same values as the direct conv access."""
    op = _one({"op": "conv2d", "N": 1, "C": 2, "H": 5, "W": 5, "F": 3, "KH": 3, "KW": 3, "stride": 2,
               "padding": "SAME"})
    g = prepare(op)
    xv = g.tensor("X").view
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 5, 5))
    (direct,) = op.accesses("X")
    for row in range(g.tensor("X").shape[0]):
        for col in range(g.tensor("X").shape[1]):
            env: dict[str, int] = {}
            for dim, value in zip(xv.dims, (row, col)):
                for ax, ext in reversed(dim):
                    env[ax] = value % ext
                    value //= ext
            src = [i.evaluate(env) for i in xv.index]
            want = [i.evaluate(env) for i in direct]
            assert src == want
            inside = all(0 <= v < s for v, s in zip(src, xv.source_shape))
            if inside:
                assert x[tuple(src)] == x[tuple(want)]
