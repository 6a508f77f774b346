"""Bad op files: each case runs ``roller op check FILE`` and asserts the exact one-line message and exit 2.

Messages follow docs/design.md: ``roller: error: FILE[:LINE] FIELD: what was expected, got what``, and
expression errors add the expression and a caret under the offending column.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from roller.cli.main import main
from roller.errors import InputError
from roller.ir import parse_ops


def _write(tmp_path: Path, doc, name: str = "op.json") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def _check(capsys, *paths: Path, verbose: bool = False) -> tuple[int, str, str]:
    argv = (["-v"] if verbose else []) + ["op", "check", *[str(p) for p in paths]]
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _listing(tmp_path: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


def assert_error(tmp_path, capsys, doc, expected: str, *, name: str = "op.json") -> None:
    """``expected`` is the message after ``roller: error: FILE``; it may span lines (the caret form)."""
    path = _write(tmp_path, doc, name)
    before = _listing(tmp_path)
    rc, out, err = _check(capsys, path)
    assert rc == 2
    assert out == ""
    assert err == f"roller: error: {path}{expected}\n"
    assert "Traceback" not in err
    assert _listing(tmp_path) == before  # nothing written


MATMUL = {"op": "matmul", "M": 4, "N": 4, "K": 4}


# ---- files that are not op files ------------------------------------------------------------------------------

def test_invalid_json(tmp_path, capsys):
    assert_error(tmp_path, capsys, '{"op": "matmul",\n "M": 4,, "N": 4}\n',
                 ":2: invalid JSON: Expecting property name enclosed in double quotes (column 9)")


def test_invalid_json_first_line(tmp_path, capsys):
    assert_error(tmp_path, capsys, '{"op": "matmul" "M": 4}',
                 ":1: invalid JSON: Expecting ',' delimiter (column 17)")


def test_empty_file(tmp_path, capsys):
    assert_error(tmp_path, capsys, "", ":1: invalid JSON: Expecting value (column 1)")


def test_not_an_object(tmp_path, capsys):
    assert_error(tmp_path, capsys, [1, 2], ': expected an op object or {"ops": [...]}, got list')


def test_missing_file(tmp_path, capsys):
    path = tmp_path / "nope.json"
    rc, out, err = _check(capsys, path)
    assert (rc, out, err) == (2, "", f"roller: error: {path}: no such op file\n")
    assert not path.exists()


def test_ops_not_a_list(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"ops": []}, " ops: expected a non-empty list of ops, got []")


def test_unknown_top_level_field(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"ops": [MATMUL], "op": "matmul"}, " op: unknown top-level field; expected 'ops'")


def test_op_not_an_object(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"ops": [MATMUL, "conv"]}, " ops[1]: expected an op object, got str")


# ---- unknown / missing fields ---------------------------------------------------------------------------------

def test_unknown_op_did_you_mean(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"op": "matmull", "M": 4, "N": 4, "K": 4},
                 " op: unknown op 'matmull' (did you mean 'matmul'?); expected one of matmul, batch_matmul, conv2d, "
                 "depthwise_conv2d, avgpool2d, maxpool2d, reduce, elementwise, transpose")


def test_unknown_op_no_hint(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"op": "softmax"},
                 " op: unknown op 'softmax'; expected one of matmul, batch_matmul, conv2d, "
                 "depthwise_conv2d, avgpool2d, maxpool2d, reduce, elementwise, transpose")


def test_unknown_field_generic(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i]", "shapes": {"X": [4]}, "shape": {}},
                 " shape: unknown field (did you mean 'shapes'?); expected one of comment, dtype, dtypes, expr, "
                 "extents, name, pad_value, shapes")


def test_unknown_field_named(tmp_path, capsys):
    assert_error(tmp_path, capsys, {**MATMUL, "transpose_c": True},
                 " transpose_c: unknown field for op 'matmul' (did you mean 'transpose_b'?); "
                 "expected one of K, M, N, transpose_a, transpose_b")


def test_unknown_field_in_second_op(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"ops": [MATMUL, {"op": "conv2d", "N": 1, "C": 3, "H": 8, "W": 8, "F": 4,
                                                     "KH": 3, "KW": 3, "strides": 2}]},
                 " ops[1].strides: unknown field for op 'conv2d' (did you mean 'stride'?); "
                 "expected one of C, F, H, KH, KW, N, W, dilation, layout, padding, stride")


def test_missing_named_field(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"op": "matmul", "M": 4, "N": 4}, ": missing field 'K'")


def test_missing_expr_and_op(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"shapes": {"X": [4]}}, ": missing field 'expr' or 'op'")


def test_both_expr_and_op(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i]", "op": "matmul"},
                 ": give either 'expr' (generic) or 'op' (named), not both")


def test_bad_dtype(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i]", "shapes": {"X": [4]}, "dtype": "int16"},
                 " dtype: expected one of float64, float32, float16, bfloat16, int64, int32, int8, uint8, bool, got "
                 "'int16'")


def test_bad_per_tensor_dtype(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i]", "shapes": {"X": [4]}, "dtypes": {"X": "int16"}},
                 " dtypes.X: expected one of float64, float32, float16, bfloat16, int64, int32, int8, uint8, bool, got 'int16'")


def test_bad_pad_value(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i]", "shapes": {"X": [4]}, "pad_value": "-infinity"},
                 " pad_value: expected a number, \"-inf\" or \"inf\", got '-infinity'")


def test_bad_named_type(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"op": "matmul", "M": 4, "N": "4", "K": 4}, " N: expected an integer, got '4'")
    assert_error(tmp_path, capsys, {**MATMUL, "transpose_a": 1}, " transpose_a: expected true or false, got 1")


# ---- sizes ----------------------------------------------------------------------------------------------------

def test_zero_size_generic(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i]", "shapes": {"X": [0]}},
                 " shapes.X[0]: expected a positive size, got 0")


def test_negative_size_generic(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i,j] = X[i,j]", "shapes": {"X": [4, -2]}},
                 " shapes.X[1]: expected a positive size, got -2")


def test_zero_size_named(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"op": "matmul", "M": 0, "N": 4, "K": 4}, " M: expected a positive integer, got 0")


def test_negative_size_named(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"op": "matmul", "M": 4, "N": -4, "K": 4},
                 " N: expected a positive integer, got -4")


def test_zero_in_named_shape_list(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"op": "reduce", "kind": "sum", "shape": [4, 0], "axes": [1]},
                 " shape[1]: expected a positive size, got 0")


def test_shape_not_a_list(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i]", "shapes": {"X": 4}},
                 " shapes.X: expected a list of positive integers, got 4")


def test_too_many_elements_generic(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i,j] = X[i,j]", "shapes": {"X": [65536, 32768]}},
                 " shapes.X: 2147483648 elements is more than 2^31-1 in one tensor")


def test_just_under_the_element_limit_parses():
    # 2^31 - 1 elements is allowed (the limit is a signed 32-bit index), nothing is allocated by parsing.
    ops = parse_ops({"expr": "Y[i] = X[i]", "shapes": {"X": [2**31 - 1]}}, None)
    assert ops[0].output.shape == (2**31 - 1,)


def test_too_many_elements_named(tmp_path, capsys):
    # The output of a named op is computed from its parameters: the error is on the op, naming the tensor.
    assert_error(tmp_path, capsys, {"op": "matmul", "M": 65536, "N": 65536, "K": 4},
                 ": tensor C [65536, 65536] has 4294967296 elements, more than 2^31-1")


def test_window_does_not_fit(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"op": "maxpool2d", "N": 1, "C": 1, "H": 2, "W": 8, "K": 3},
                 ": window of 3 does not fit H=2 with padding VALID")


# ---- shapes that disagree with the expression ----------------------------------------------------------------

def test_axis_extent_conflict(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "C[m,n] += A[m,k] * B[k,n]", "shapes": {"A": [4, 8], "B": [6, 5]}},
                 " expr: axis 'k' has extent 8 from A dimension 1 but 6 from B dimension 0 (column 20)\n"
                 "  C[m,n] += A[m,k] * B[k,n]\n"
                 "                     ^")


def test_output_rank_mismatch(tmp_path, capsys):
    assert_error(tmp_path, capsys,
                 {"expr": "C[m,n] += A[m,k] * B[k,n]", "shapes": {"A": [4, 8], "B": [8, 5], "C": [4, 5, 1]}},
                 " shapes.C: expected rank 2 (the output is indexed [m,n]), got [4, 5, 1]")


def test_output_size_mismatch(tmp_path, capsys):
    assert_error(tmp_path, capsys,
                 {"expr": "C[m,n] += A[m,k] * B[k,n]", "shapes": {"A": [4, 8], "B": [8, 5], "C": [4, 6]}},
                 " shapes.C: dimension 1 (axis 'n') is 6 but the expression gives 5 from B dimension 1")


def test_extent_field_conflict(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i]", "shapes": {"X": [4]}, "extents": {"i": 5}},
                 " extents.i: axis 'i' has extent 4 from X dimension 0, got 5")


def test_uninferable_extent(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] max= X[2*i+r]", "shapes": {"X": [9], "Y": [4]}},
                 " expr: cannot infer the extent of axis 'r': it never indexes a dimension alone "
                 "(give it in 'extents') (column 11)\n"
                 "  Y[i] max= X[2*i+r]\n"
                 "            ^")


def test_shape_for_unused_tensor(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i]", "shapes": {"X": [4], "Z": [3]}},
                 " shapes.Z: tensor 'Z' does not appear in the expression")


def test_tensor_without_shape(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i] + Z[i]", "shapes": {"X": [4]}},
                 " expr: tensor 'Z' has no entry in 'shapes' (column 15)\n"
                 "  Y[i] = X[i] + Z[i]\n"
                 "                ^")


def test_no_shapes_at_all(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i]"},
                 " expr: tensor 'X' has no entry in 'shapes' (column 8)\n"
                 "  Y[i] = X[i]\n"
                 "         ^")


def test_index_out_of_rank(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] += X[i,j,k]", "shapes": {"X": [4, 5]}},
                 " expr: X has rank 2 but is indexed with 3 indices (column 9)\n"
                 "  Y[i] += X[i,j,k]\n"
                 "          ^")


def test_broadcast_mismatch(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"op": "elementwise", "fn": "add", "shapes": {"A": [4, 3], "B": [4]}},
                 " shapes: shapes [[4, 3], [4]] do not broadcast (dimension 1)")


def test_reduce_axis_out_of_range(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"op": "reduce", "kind": "sum", "shape": [4, 5], "axes": [2]},
                 " axes[0]: axis 2 is out of range for rank 2")


# ---- expression syntax and semantics (caret under the column) -------------------------------------------------

def test_non_affine_index(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i,j] = X[i*j]", "shapes": {"X": [16], "Y": [4, 4]}},
                 " expr: non-affine index: product of two axes (column 13)\n"
                 "  Y[i,j] = X[i*j]\n"
                 "              ^")


def test_division_in_index(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i/2]", "shapes": {"X": [8], "Y": [4]}},
                 " expr: division is not allowed in an index (indices must be affine) (column 11)\n"
                 "  Y[i] = X[i/2]\n"
                 "            ^")


def test_indirect_index_must_be_an_integer(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[Z[i]]", "shapes": {"X": [8], "Z": [4]}},
                 " expr: the run-time index of X must be an integer, got float32 (column 10)\n"
                 "  Y[i] = X[Z[i]]\n"
                 "           ^")


def test_index_that_is_neither_affine_nor_a_read(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[2*Z[i]]", "shapes": {"X": [8], "Z": [4]}},
                 " expr: non-affine index: Z[... (column 12)\n"
                 "  Y[i] = X[2*Z[i]]\n"
                 "             ^")


def test_reduction_index_with_plain_assignment(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i,k]", "shapes": {"X": [4, 5]}},
                 " expr: reduction index 'k' needs a reducing assignment (+=, max=, min=), not '=' (column 8)\n"
                 "  Y[i] = X[i,k]\n"
                 "         ^")


def test_reduction_index_caret_on_the_read_that_uses_it(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i] * W[i,k]", "shapes": {"X": [4], "W": [4, 5]}},
                 " expr: reduction index 'k' needs a reducing assignment (+=, max=, min=), not '=' (column 15)\n"
                 "  Y[i] = X[i] * W[i,k]\n"
                 "                ^")


def test_unknown_function(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i] + gelu(X[i])", "shapes": {"X": [4]}},
                 " expr: unknown function 'gelu' (known: exp, log, sqrt, rsqrt, tanh, erf, sigmoid, relu, abs, "
                 "cos, sin, round, max, min, pow, fmod, eq, ne, lt, le, gt, ge, and, or, xor, not, isnan, isinf, float64, float32, int64, int32, int8, "
                 "uint8, bool, where) (column 15)\n"
                 "  Y[i] = X[i] + gelu(X[i])\n"
                 "                ^")


def test_wrong_arity(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = max(X[i])", "shapes": {"X": [4]}},
                 " expr: max() takes 2 arguments, got 1 (column 8)\n"
                 "  Y[i] = max(X[i])\n"
                 "         ^")


def test_unexpected_character(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i] $ 2", "shapes": {"X": [4]}},
                 " expr: unexpected character '$' (column 13)\n"
                 "  Y[i] = X[i] $ 2\n"
                 "              ^")


def test_missing_assignment(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] X[i]", "shapes": {"X": [4]}},
                 " expr: expected '=', '+=', 'max=' or 'min=', got 'X' (column 6)\n"
                 "  Y[i] X[i]\n"
                 "       ^")


def test_unclosed_bracket(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i", "shapes": {"X": [4]}},
                 " expr: expected ',' or ']', got end of expression (column 11)\n"
                 "  Y[i] = X[i\n"
                 "            ^")


def test_output_index_not_an_axis(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i, j+1] = X[i,j]", "shapes": {"X": [4, 4]}},
                 " expr: output index 1 of Y must be a single axis name, got j+1 (column 6)\n"
                 "  Y[i, j+1] = X[i,j]\n"
                 "       ^")


def test_output_axis_twice(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i,i] = X[i]", "shapes": {"X": [4]}},
                 " expr: axis 'i' appears twice in the output Y (column 5)\n"
                 "  Y[i,i] = X[i]\n"
                 "      ^")


def test_output_read_on_rhs(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = Y[i] + X[i]", "shapes": {"X": [4]}},
                 " expr: the output Y cannot be read on the right-hand side (column 8)\n"
                 "  Y[i] = Y[i] + X[i]\n"
                 "         ^")


def test_empty_expression(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "  ", "shapes": {}}, " expr: expected an expression string, got '  '")


def test_caret_in_second_op_of_a_list(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"ops": [MATMUL, {"name": "b", "expr": "Y[i] = X[i]]", "shapes": {"X": [4]}}]},
                 " ops[1].expr: unexpected ']' after the expression (column 12)\n"
                 "  Y[i] = X[i]]\n"
                 "             ^")


# ---- names ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("word", ["float", "int", "double", "kernel", "__kernel", "__global", "global", "local",
                                  "__shared__", "threadIdx", "half", "for", "while", "exp", "main", "get_global_id",
                                  "rl_tmp", "_x", "a" * 49])
def test_bad_tensor_names_rejected(word):
    with pytest.raises(InputError) as info:
        parse_ops({"expr": f"Y[i] = X[i] + {word}[i]", "shapes": {"X": [4], word: [4]}}, None)
    msg = str(info.value)
    assert msg.startswith(f"expr: tensor name: {word!r} ")
    assert any(why in msg for why in ("reserved word", "not an identifier", "starts with 'rl_'", "longer than 48"))
    assert msg.endswith("\n" + " " * (2 + len("Y[i] = X[i] + ")) + "^")


@pytest.mark.parametrize("word", ["float", "__global", "int", "x-y", "9x", ""])
def test_bad_names_in_shapes_only_are_still_rejected(word):
    # A name that the expression cannot even spell is rejected too (as an unused shape or at parse time).
    with pytest.raises(InputError):
        parse_ops({"expr": f"Y[i] = {word}[i]", "shapes": {word: [4]}}, None)


@pytest.mark.parametrize("word", ["Float", "integer", "x_1", "kernel2", "W"])
def test_near_keywords_are_fine(word):
    (op,) = parse_ops({"expr": f"Y[i] = {word}[i]", "shapes": {word: [4]}}, None)
    assert op.inputs[0].name == word


def test_tensor_named_float(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = float[i]", "shapes": {"float": [4]}},
                 " expr: tensor name: 'float' is a reserved word in C/CUDA/OpenCL (column 8)\n"
                 "  Y[i] = float[i]\n"
                 "         ^")


def test_tensor_named_global(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = X[i] * __global[i]", "shapes": {"X": [4], "__global": [4]}},
                 " expr: tensor name: '__global' is not an identifier (letters, digits, '_'; starting with a letter)"
                 " (column 15)\n"
                 "  Y[i] = X[i] * __global[i]\n"
                 "                ^")


def test_tensor_named_global_without_underscores(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = global[i]", "shapes": {"global": [4]}},
                 " expr: tensor name: 'global' is a reserved word in C/CUDA/OpenCL (column 8)\n"
                 "  Y[i] = global[i]\n"
                 "         ^")


def test_output_named_int(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "int[i] = X[i]", "shapes": {"X": [4]}},
                 " expr: output name: 'int' is a reserved word in C/CUDA/OpenCL (column 1)\n"
                 "  int[i] = X[i]\n"
                 "  ^")


def test_axis_named_for(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] += X[i,for]", "shapes": {"X": [4, 4]}},
                 " expr: axis name: 'for' is a reserved word in C/CUDA/OpenCL (column 9)\n"
                 "  Y[i] += X[i,for]\n"
                 "          ^")


def test_tensor_name_cuda_builtin(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"expr": "Y[i] = threadIdx[i]", "shapes": {"threadIdx": [4]}},
                 " expr: tensor name: 'threadIdx' is a reserved word in C/CUDA/OpenCL (column 8)\n"
                 "  Y[i] = threadIdx[i]\n"
                 "         ^")


def test_op_name_not_identifier(tmp_path, capsys):
    assert_error(tmp_path, capsys, {**MATMUL, "name": "my-op"},
                 " name: 'my-op' is not an identifier (letters, digits, '_'; starting with a letter)")


def test_op_name_keyword(tmp_path, capsys):
    assert_error(tmp_path, capsys, {"name": "float", "expr": "Y[i] = X[i]", "shapes": {"X": [4]}},
                 " name: 'float' is a reserved word in C/CUDA/OpenCL")


def test_op_name_reserved_prefix(tmp_path, capsys):
    assert_error(tmp_path, capsys, {**MATMUL, "name": "rl_mm"},
                 " name: 'rl_mm' starts with 'rl_', which generated code reserves for its own names")


def test_duplicate_op_name(tmp_path, capsys):
    assert_error(tmp_path, capsys,
                 {"ops": [{"name": "a", "expr": "Y[i] = X[i]", "shapes": {"X": [4]}}, {**MATMUL, "name": "a"}]},
                 " ops[1].name: duplicate op name 'a' (also ops[0])")


def test_duplicate_default_name(tmp_path, capsys):
    # Named ops default to their op kind: two matmuls without names collide.
    assert_error(tmp_path, capsys, {"ops": [MATMUL, MATMUL]}, " ops[1].name: duplicate op name 'matmul' (also ops[0])")


# ---- the CLI around the errors --------------------------------------------------------------------------------

def test_check_stops_at_first_bad_file(tmp_path, capsys):
    good = _write(tmp_path, MATMUL, "good.json")
    bad = _write(tmp_path, {"op": "matmul", "M": 4}, "bad.json")
    later = _write(tmp_path, MATMUL, "later.json")
    rc, out, err = _check(capsys, good, bad, later)
    assert rc == 2
    assert out == f"{good}: 1 op OK\n"
    assert err == f"roller: error: {bad}: missing field 'N'\n"


def test_verbose_shows_traceback(tmp_path, capsys):
    path = _write(tmp_path, {"expr": "Y[i,j] = X[i*j]", "shapes": {"X": [16], "Y": [4, 4]}})
    rc, out, err = _check(capsys, path, verbose=True)
    assert rc == 2
    assert err.startswith("Traceback (most recent call last):")
    assert "roller.errors.InputError" in err
    assert err.endswith(f"roller: error: {path} expr: non-affine index: product of two axes (column 13)\n"
                        "  Y[i,j] = X[i*j]\n"
                        "              ^\n")


def test_without_verbose_no_traceback(tmp_path, capsys):
    path = _write(tmp_path, {"expr": "Y[i,j] = X[i*j]", "shapes": {"X": [16], "Y": [4, 4]}})
    rc, _, err = _check(capsys, path)
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 3


def test_directory_is_not_an_op_file(tmp_path, capsys):
    rc, out, err = _check(capsys, tmp_path)
    assert rc == 2 and out == ""
    assert err == f"roller: error: {tmp_path}: cannot read op file: IsADirectoryError\n"


def test_errors_carry_structured_fields():
    with pytest.raises(InputError) as info:
        parse_ops({"ops": [MATMUL, {"op": "matmul", "M": 4, "N": 4, "K": 0}]}, "x.json")
    err = info.value
    assert err.exit_code == 2
    assert (err.source, err.field, err.bare) == ("x.json", "ops[1].K", "expected a positive integer, got 0")


def test_cwd_untouched(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, {"expr": "Y[i] = X[i,k]", "shapes": {"X": [4, 5]}}, "bad.json")
    before = _listing(tmp_path)
    assert main(["op", "check", "bad.json"]) == 2
    capsys.readouterr()
    assert _listing(tmp_path) == before
    assert os.listdir(tmp_path) == ["bad.json"]
