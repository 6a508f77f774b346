"""Parsing op.json into TensorExpr: named expansions, generic expressions, round trips and content hashes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from roller.ir import Affine, BinOp, Call, Const, Neg, Read, load_op, load_ops, parse_ops
from roller.ir.fuse import prepare
from roller.ir.parse import parse_statement

REPO = Path(__file__).resolve().parents[2]
OP_FILES = sorted((REPO / "examples").glob("*.json")) + sorted((REPO / "bench" / "suites").glob("*.json"))

GENERIC = [
    {"name": "mm", "expr": "C[m,n] += A[m,k] * B[k,n]", "shapes": {"A": [7, 5], "B": [5, 3]}},
    {"name": "conv", "expr": "Y[n,f,h,w] += X[n,c,h+r-1,w+s-1] * W[f,c,r,s]",
     "shapes": {"X": [1, 3, 8, 8], "W": [4, 3, 3, 3], "Y": [1, 4, 8, 8]}},
    {"name": "strided", "expr": "Y[n,f,h,w] += X[n,c,2*h+2*r,2*w+2*s] * W[f,c,r,s]",
     "shapes": {"X": [1, 4, 33, 33], "W": [8, 4, 3, 3], "Y": [1, 8, 15, 15]}},
    {"name": "pool", "expr": "Y[n,c,h,w] max= X[n,c,2*h+r-1,2*w+s-1]",
     "shapes": {"X": [1, 2, 9, 9], "Y": [1, 2, 5, 5]}, "extents": {"r": 3, "s": 3}, "pad_value": "-inf"},
    {"name": "minred", "expr": "Y[i] min= X[i,j]", "shapes": {"X": [4, 6]}, "pad_value": "inf"},
    {"name": "softplusish", "expr": "Y[i,j] = log(exp(X[i,j]) + 1.0) - (X[i,j] - Z[j]) / 2.5",
     "shapes": {"X": [3, 4], "Z": [4]}},
    {"name": "fns", "expr": "Y[i] = max(relu(X[i]), -abs(X[i])) * sigmoid(tanh(X[i])) + erf(sqrt(abs(X[i])))",
     "shapes": {"X": [5]}},
    {"name": "neg", "expr": "Y[i] = -X[i] - -2.0 * -X[i]", "shapes": {"X": [5]}},
    {"name": "shift", "expr": "Y[i] = X[i+1] + X[i+2] - X[2*i-i+1]", "shapes": {"X": [10], "Y": [8]}},
    {"name": "flip", "expr": "Y[i] += X[i-k+4] * K[k]", "shapes": {"X": [12], "K": [5], "Y": [8]}},
    {"name": "fp16", "expr": "Y[i,j] = X[j,i]", "shapes": {"X": [3, 2]}, "dtype": "float16"},
    {"name": "mixed", "expr": "C[m,n] += A[m,k] * B[k,n]", "shapes": {"A": [2, 3], "B": [3, 4]},
     "dtype": "float16", "dtypes": {"C": "float32"}},
    {"name": "scalar", "expr": "Y[] += X[i,j]", "shapes": {"X": [3, 4]}},
    {"name": "bcast", "expr": "Y[i,j] = X[i,0] + Z[0,j]", "shapes": {"X": [3, 1], "Z": [1, 4]}},
]


def _all_ops() -> list[tuple[str, dict]]:
    out = [(f"generic-{g['name']}", g) for g in GENERIC]
    for path in OP_FILES:
        doc = json.loads(path.read_text())
        items = doc["ops"] if "ops" in doc else [doc]
        for i, item in enumerate(items):
            out.append((f"{path.parent.name}/{path.stem}-{item.get('name', i)}", item))
    return out


ALL_OPS = _all_ops()


def _one(obj: dict):
    (op,) = parse_ops(obj, None)
    return op


def _same(a, b) -> None:
    assert a.statement() == b.statement()
    assert a.axes == b.axes
    assert [(t.name, t.shape, t.dtype) for t in a.tensors] == [(t.name, t.shape, t.dtype) for t in b.tensors]
    assert a.reduce_op == b.reduce_op
    assert a.body == b.body
    assert a.out_index == b.out_index
    assert repr(a.pad_value) == repr(b.pad_value)
    assert a.content_hash() == b.content_hash()


def test_there_are_ops_to_check():
    # Named ops of every kind appear in the examples/suites or the generic list above.
    kinds = {o.get("op", "generic") for _, o in ALL_OPS}
    assert {"matmul", "conv2d", "depthwise_conv2d", "maxpool2d", "avgpool2d", "reduce", "elementwise", "transpose",
            "batch_matmul", "generic"} <= kinds, kinds


@pytest.mark.parametrize("obj", [o for _, o in ALL_OPS], ids=[i for i, _ in ALL_OPS])
def test_round_trip_through_to_json(obj):
    op = _one(obj)
    doc = json.loads(json.dumps(op.to_json()))  # must be plain JSON
    assert "op" not in doc and "expr" in doc
    back = _one(doc)
    _same(op, back)
    assert back.name == op.name
    # And a second round trip is a fixed point.
    assert back.to_json() == op.to_json()


@pytest.mark.parametrize("obj", [o for _, o in ALL_OPS], ids=[i for i, _ in ALL_OPS])
def test_prepared_form_serializes_to_its_source(obj):
    op = _one(obj)
    prep = prepare(op)
    assert prep.flops == op.flops
    assert prep.bytes == op.bytes
    assert _one(prep.to_json()).content_hash() == op.content_hash()


@pytest.mark.parametrize("obj", [o for _, o in ALL_OPS], ids=[i for i, _ in ALL_OPS])
def test_statement_reparses_to_same_tree(obj):
    op = _one(obj)
    # a row kernel's stages come first, a fused op's epilogue after the main statement
    parts = op.statement().split(";")
    stages, main, epilogue = parts[:len(op.stages)], parts[len(op.stages)], parts[len(op.stages) + 1:]
    stmt = parse_statement(main)
    assert stmt.body == op.body
    assert stmt.out_index == op.out_index
    assert str(op) == op.statement()
    assert (parse_statement(epilogue[0]).body if epilogue else None) == op.epilogue
    assert [parse_statement(t).body for t in stages] == [st.body for st in op.stages]


def test_content_hash_stable_across_independent_parses():
    for _, obj in ALL_OPS:
        a = _one(json.loads(json.dumps(obj)))
        b = _one(json.loads(json.dumps(obj)))
        assert a is not b
        assert a.content_hash() == b.content_hash()
        assert len(a.content_hash()) == 16 and int(a.content_hash(), 16) >= 0


def test_content_hash_stable_across_files(tmp_path):
    src = REPO / "examples" / "multi.json"
    if not src.exists():
        pytest.skip("examples/multi.json not present")
    copy = tmp_path / "copy.json"
    copy.write_text(json.dumps(json.loads(src.read_text()), indent=4))
    assert [o.content_hash() for o in load_ops(src)] == [o.content_hash() for o in load_ops(copy)]


def test_content_hash_differs_between_different_ops():
    by_hash: dict[str, str] = {}
    for ident, obj in ALL_OPS:
        op = _one(obj)
        key = json.dumps([op.statement(), [(t.name, t.shape, t.dtype) for t in op.tensors],
                          [(a.name, a.extent) for a in op.axes], repr(op.pad_value)])
        h = op.content_hash()
        if h in by_hash:
            assert by_hash[h] == key, f"{ident} collides with a different op"
        by_hash[h] = key
    assert len(set(by_hash.values())) == len(by_hash) > 20


@pytest.mark.parametrize("change", [
    {"shapes": {"A": [7, 6], "B": [6, 3]}},
    {"dtype": "float16"},
    {"dtypes": {"A": "float16"}},
    {"expr": "C[m,n] += A[m,k] * B[k,n] * 2.0"},
    {"expr": "C[m,n] max= A[m,k] * B[k,n]"},
    {"pad_value": 1.0},
    {"expr": "D[m,n] += A[m,k] * B[k,n]"},
    {"expr": "C[i,n] += A[i,k] * B[k,n]"},
])
def test_content_hash_sees_every_semantic_change(change):
    base = {"expr": "C[m,n] += A[m,k] * B[k,n]", "shapes": {"A": [7, 5], "B": [5, 3]}}
    assert _one({**base, **change}).content_hash() != _one(base).content_hash()


def test_content_hash_ignores_name_and_comment():
    base = {"expr": "C[m,n] += A[m,k] * B[k,n]", "shapes": {"A": [7, 5], "B": [5, 3]}}
    assert _one({**base, "name": "other", "comment": "hi"}).content_hash() == _one(base).content_hash()


def test_named_and_generic_matmul_agree():
    named = _one({"op": "matmul", "M": 7, "N": 3, "K": 5})
    generic = _one({"expr": "C[m,n] += A[m,k] * B[k,n]", "shapes": {"A": [7, 5], "B": [5, 3]}})
    assert named.kind == "matmul" and generic.kind == "generic"
    assert named.name == "matmul" and generic.name == "op"
    assert named.content_hash() == generic.content_hash()


# ---- structure of the parsed expression ---------------------------------------------------------------------

def test_axes_spatial_in_output_order_then_reduction():
    op = _one({"expr": "Y[b,j,i] += X[b,i,k] * W[k,r,j]", "shapes": {"X": [2, 3, 4], "W": [4, 5, 6]}})
    assert [(a.name, a.extent, a.reduce) for a in op.axes] == [
        ("b", 2, False), ("j", 6, False), ("i", 3, False), ("k", 4, True), ("r", 5, True)]
    assert [a.name for a in op.spatial_axes] == ["b", "j", "i"]
    assert [a.name for a in op.reduce_axes] == ["k", "r"]
    assert op.output.shape == (2, 6, 3)
    assert op.reduce_op == "sum" and op.is_reduction


def test_inputs_in_order_of_first_appearance():
    op = _one({"expr": "Y[i] = Z[i] * X[i] + Z[i] / W[i]", "shapes": {"W": [3], "X": [3], "Z": [3]}})
    assert [t.name for t in op.inputs] == ["Z", "X", "W"]
    assert op.accesses("Z") == [(Affine.axis("i"),)]


def test_body_tree_and_precedence():
    op = _one({"expr": "Y[i] = X[i] - (Z[i] - X[i]) / (2.0 * Z[i])", "shapes": {"X": [3], "Z": [3]}})
    x, z = Read("X", (Affine.axis("i"),)), Read("Z", (Affine.axis("i"),))
    assert op.body == BinOp("-", x, BinOp("/", BinOp("-", z, x), BinOp("*", Const(2.0), z)))
    assert op.statement() == "Y[i] = X[i] - (Z[i] - X[i]) / (2.0 * Z[i])"
    assert op.reduce_op is None and not op.is_reduction


def test_left_associative_minus_keeps_no_brackets():
    op = _one({"expr": "Y[i] = (X[i] - Z[i]) - X[i]", "shapes": {"X": [3], "Z": [3]}})
    assert op.statement() == "Y[i] = X[i] - Z[i] - X[i]"
    op2 = _one({"expr": "Y[i] = X[i] - (Z[i] - X[i])", "shapes": {"X": [3], "Z": [3]}})
    assert op2.statement() == "Y[i] = X[i] - (Z[i] - X[i])"
    assert op.body != op2.body


def test_calls_and_negation():
    op = _one({"expr": "Y[i] = -max(X[i], 0.5) + exp(-X[i])", "shapes": {"X": [3]}})
    x = Read("X", (Affine.axis("i"),))
    assert op.body == BinOp("+", Neg(Call("max", (x, Const(0.5)))), Call("exp", (Neg(x),)))


def test_affine_indices():
    op = _one({"expr": "Y[i,j] += X[2*i + 3*k - 1, j*2 - (k - 4)]", "shapes": {"X": [20, 20], "Y": [4, 5]},
               "extents": {"k": 3}})
    (idx,) = op.accesses("X")
    assert idx[0] == Affine.of({"i": 2, "k": 3}, -1)
    assert idx[1] == Affine.of({"j": 2, "k": -1}, 4)
    assert op.axis("k").extent == 3 and op.axis("k").reduce


def test_scientific_constants():
    op = _one({"expr": "Y[i] = X[i] * 1.5e-3 + .25 + 2e2", "shapes": {"X": [3]}})
    consts = [n.value for n in [op.body.lhs.lhs.rhs, op.body.lhs.rhs, op.body.rhs]]
    assert consts == [1.5e-3, 0.25, 200.0]


def test_extents_field_for_window_axes():
    op = _one(GENERIC[3])
    assert op.extents == {"n": 1, "c": 2, "h": 5, "w": 5, "r": 3, "s": 3}
    assert op.pad_value == float("-inf") and op.reduce_op == "max"


def test_output_shape_inferred_when_missing():
    op = _one({"expr": "Y[j,i] = X[i,j]", "shapes": {"X": [3, 4]}})
    assert op.output.shape == (4, 3) and op.output.name == "Y"


def test_scalar_output():
    op = _one(GENERIC[12])
    assert op.output.shape == () and op.output.size == 1 and len(op.reduce_axes) == 2


# ---- dtypes and pad values ----------------------------------------------------------------------------------

def test_float16_dtype():
    op = _one({"op": "matmul", "M": 8, "N": 4, "K": 2, "dtype": "float16"})
    assert {t.dtype for t in op.tensors} == {"float16"}
    assert op.bytes == (8 * 2 + 2 * 4 + 8 * 4) * 2
    assert op.to_json()["dtypes"] == {"A": "float16", "B": "float16", "C": "float16"}


def test_per_tensor_dtypes():
    op = _one(GENERIC[11])
    assert [(t.name, t.dtype) for t in op.tensors] == [("A", "float16"), ("B", "float16"), ("C", "float32")]
    assert op.bytes == 6 * 2 + 12 * 2 + 8 * 4
    back = _one(op.to_json())
    assert [t.dtype for t in back.tensors] == ["float16", "float16", "float32"]


def test_named_op_per_tensor_dtypes():
    op = _one({"op": "elementwise", "fn": "add", "shapes": {"A": [4], "B": [4]}, "dtypes": {"B": "float16"}})
    assert [(t.name, t.dtype) for t in op.tensors] == [("A", "float32"), ("B", "float16"), ("Y", "float32")]


@pytest.mark.parametrize("value,expected", [("-inf", float("-inf")), ("inf", float("inf")), (0, 0.0),
                                            (1.5, 1.5), (-2, -2.0)])
def test_pad_values(value, expected):
    op = _one({"expr": "Y[i] max= X[i+r-1]", "shapes": {"X": [6], "Y": [6]}, "extents": {"r": 3},
               "pad_value": value})
    assert op.pad_value == expected
    assert _one(op.to_json()).pad_value == expected


def test_maxpool_pads_with_minus_infinity_and_reduce_min_with_infinity():
    assert _one({"op": "maxpool2d", "N": 1, "C": 1, "H": 4, "W": 4, "K": 2}).pad_value == float("-inf")
    assert _one({"op": "reduce", "kind": "min", "shape": [3, 4], "axes": [1]}).pad_value == float("inf")
    assert _one({"op": "reduce", "kind": "sum", "shape": [3, 4], "axes": [1]}).pad_value == 0.0


# ---- multi-op files -----------------------------------------------------------------------------------------

def test_ops_list_and_default_names():
    ops = parse_ops({"ops": [{"expr": "Y[i] = X[i]", "shapes": {"X": [4]}},
                             {"expr": "Y[i] = exp(X[i])", "shapes": {"X": [4]}},
                             {"op": "transpose", "shape": [2, 3], "perm": [1, 0]}]}, None)
    assert [o.name for o in ops] == ["op0", "op1", "transpose"]


def test_duplicate_names_in_ops_list():
    from roller.errors import InputError

    with pytest.raises(InputError) as info:
        parse_ops({"ops": [{"name": "x", "op": "matmul", "M": 2, "N": 2, "K": 2},
                           {"name": "y", "op": "matmul", "M": 2, "N": 2, "K": 2},
                           {"name": "x", "expr": "Y[i] = X[i]", "shapes": {"X": [4]}}]}, "f.json")
    assert str(info.value) == "f.json ops[2].name: duplicate op name 'x' (also ops[0])"


def test_load_op_requires_exactly_one(tmp_path):
    from roller.errors import InputError

    path = tmp_path / "two.json"
    path.write_text(json.dumps({"ops": [{"op": "matmul", "M": 2, "N": 2, "K": 2, "name": "a"},
                                        {"op": "matmul", "M": 2, "N": 2, "K": 2, "name": "b"}]}))
    with pytest.raises(InputError) as info:
        load_op(path)
    assert str(info.value) == f"{path}: expected one op, found 2 (choose one with --op NAME)"
    assert [o.name for o in load_ops(path)] == ["a", "b"]
    assert load_op({"op": "matmul", "M": 2, "N": 2, "K": 2}).name == "matmul"


def test_load_ops_accepts_parsed_expr():
    op = _one(GENERIC[0])
    assert load_ops(op) == [op]
    assert load_op(op) is op


# ---- named expansions ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("obj,stmt,shapes", [
    ({"op": "matmul", "M": 4, "N": 5, "K": 6}, "C[m,n] += A[m,k] * B[k,n]", [(4, 6), (6, 5), (4, 5)]),
    ({"op": "matmul", "M": 4, "N": 5, "K": 6, "transpose_a": True, "transpose_b": True},
     "C[m,n] += A[k,m] * B[n,k]", [(6, 4), (5, 6), (4, 5)]),
    ({"op": "batch_matmul", "B": 2, "M": 4, "N": 5, "K": 6, "transpose_b": True},
     "C[b,m,n] += A[b,m,k] * B[b,n,k]", [(2, 4, 6), (2, 5, 6), (2, 4, 5)]),
    ({"op": "conv2d", "N": 1, "C": 3, "H": 8, "W": 8, "F": 4, "KH": 3, "KW": 3},
     "Y[n,f,h,w] += X[n,c,h+r-1,w+s-1] * W[f,c,r,s]", [(1, 3, 8, 8), (4, 3, 3, 3), (1, 4, 8, 8)]),
    ({"op": "conv2d", "N": 1, "C": 3, "H": 8, "W": 9, "F": 4, "KH": 3, "KW": 3, "stride": 2, "dilation": 2,
      "padding": "VALID"},
     "Y[n,f,h,w] += X[n,c,h*2+r*2,w*2+s*2] * W[f,c,r,s]", [(1, 3, 8, 9), (4, 3, 3, 3), (1, 4, 2, 3)]),
    ({"op": "conv2d", "N": 2, "C": 3, "H": 7, "W": 7, "F": 4, "KH": 3, "KW": 3, "stride": 2, "padding": 1,
      "layout": "NHWC"},
     "Y[n,h,w,f] += X[n,h*2+r-1,w*2+s-1,c] * W[r,s,c,f]", [(2, 7, 7, 3), (3, 3, 3, 4), (2, 4, 4, 4)]),
    ({"op": "depthwise_conv2d", "N": 1, "C": 3, "H": 6, "W": 6, "KH": 3, "KW": 3},
     "Y[n,c,h,w] += X[n,c,h+r-1,w+s-1] * W[c,r,s]", [(1, 3, 6, 6), (3, 3, 3), (1, 3, 6, 6)]),
    ({"op": "avgpool2d", "N": 1, "C": 2, "H": 6, "W": 6, "K": 2},
     "Y[n,c,h,w] += X[n,c,h*2+r,w*2+s] / 4.0", [(1, 2, 6, 6), (1, 2, 3, 3)]),
    ({"op": "maxpool2d", "N": 1, "C": 2, "H": 7, "W": 7, "K": 3, "stride": 2, "padding": "SAME"},
     "Y[n,c,h,w] max= X[n,c,h*2+r-1,w*2+s-1]", [(1, 2, 7, 7), (1, 2, 4, 4)]),
    ({"op": "reduce", "kind": "mean", "shape": [2, 3, 4], "axes": [0, -1]},
     "Y[i1] += X[i0,i1,i2] / 8.0", [(2, 3, 4), (3,)]),
    ({"op": "reduce", "kind": "max", "shape": [2, 3], "axes": [1]}, "Y[i0] max= X[i0,i1]", [(2, 3), (2,)]),
    ({"op": "elementwise", "fn": "add", "shapes": {"A": [2, 3, 4], "B": [3, 1]}},
     "Y[i0,i1,i2] = A[i0,i1,i2] + B[i1,0]", [(2, 3, 4), (3, 1), (2, 3, 4)]),
    ({"op": "elementwise", "fn": "neg", "shapes": {"X": [5]}}, "Y[i0] = -X[i0]", [(5,), (5,)]),
    ({"op": "elementwise", "fn": "max", "shapes": {"Y": [5], "Z": [1]}}, "Out[i0] = max(Y[i0], Z[0])",
     [(5,), (1,), (5,)]),
    ({"op": "transpose", "shape": [2, 3, 4], "perm": [2, 0, 1]}, "Y[i2,i0,i1] = X[i0,i1,i2]",
     [(2, 3, 4), (4, 2, 3)]),
])
def test_named_expansion(obj, stmt, shapes):
    op = _one(obj)
    # Printing normalizes i*2 to 2*i; compare through the parser so the test does not depend on that choice.
    assert parse_statement(op.statement()) == parse_statement(stmt) or op.statement() == stmt
    assert op.body == parse_statement(stmt).body
    assert [t.shape for t in op.tensors] == shapes
    assert op.kind == obj["op"]


def test_same_padding_is_tensorflow_convention():
    # H=8, K=4, stride 1: total padding 3, 1 before and 2 after.
    op = _one({"op": "conv2d", "N": 1, "C": 1, "H": 8, "W": 8, "F": 1, "KH": 4, "KW": 4})
    (idx,) = op.accesses("X")
    assert idx[2] == Affine.of({"h": 1, "r": 1}, -1)
    assert op.output.shape == (1, 1, 8, 8)
    # H=7, stride 2, K=3: out 4, total (4-1)*2+3-7 = 2 -> 1 before.
    op = _one({"op": "conv2d", "N": 1, "C": 1, "H": 7, "W": 7, "F": 1, "KH": 3, "KW": 3, "stride": 2})
    assert op.accesses("X")[0][2] == Affine.of({"h": 2, "r": 1}, -1)
    assert op.output.shape == (1, 1, 4, 4)
