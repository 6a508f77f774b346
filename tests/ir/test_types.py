"""Integer and bool element types in the IR (issue 37, first step): op files declare them, bodies are typed
(roller.ir.types), the reference evaluates them exactly with the semantics the kernels will render
(roller.ir.typed_eval), and a backend that does not render typed bodies refuses them in one line."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import roller
from roller.cli.main import main
from roller.errors import InputError
from roller.ir.typed_eval import convert
from roller.ir.types import WEAK_FLOAT, WEAK_INT, meet

I64 = np.iinfo(np.int64)


def _op(expr: str, shapes: dict[str, list[int]], **dtypes: str) -> dict:
    return {"name": "t", "expr": expr, "shapes": shapes, "dtypes": dtypes}


def test_types_meet_as_the_module_says() -> None:
    assert meet("int32", "int64") == "int64" and meet("int8", "uint8") == "int32"
    assert meet("int32", "float32") == "float32" and meet("int64", WEAK_INT) == "int64"
    assert meet("int64", WEAK_FLOAT) == "float32" and meet(WEAK_INT, WEAK_FLOAT) == WEAK_FLOAT


@pytest.mark.parametrize("expr,dtypes,acc", [
    ("Y[i] = ids[i] + 1", {"ids": "int64", "Y": "int64"}, "int64"),
    ("Y[i] = ids[i] * 0.5", {"ids": "int32"}, "float32"),
    ("Y[i] = gt(X[i], 0)", {"Y": "bool"}, "bool"),
    ("Y[i] += ids[i,k]", {"ids": "int8", "Y": "int32"}, "int64"),
    ("Y[i] = i", {"Y": "int64"}, "int64"),
    ("Y[i] = X[i]", {"Y": "int32"}, "float32"),
])
def test_op_files_declare_integer_types_and_the_body_computes_in_one(expr: str, dtypes: dict, acc: str) -> None:
    shapes = {t: ([4, 3] if "k]" in expr else [4]) for t in ("X", "ids") if f"{t}[" in expr}
    if "ids" not in shapes and "X" not in shapes:
        shapes = {"Y": [4]}
    e = roller.load_op(_op(expr, shapes, **dtypes))
    assert e.typed and e.acc_dtype == acc


def test_float_ops_are_not_typed() -> None:
    e = roller.load_op(_op("Y[i] += X[i,k] * W[k]", {"X": [4, 3], "W": [3]}))
    assert not e.typed and e.acc_dtype == "float32"


@pytest.mark.parametrize("expr,dtypes,message", [
    ("Y[i] = M[i] + 1", {"M": "bool"}, "a bool value takes no part in '+'"),
    ("Y[i] = -M[i]", {"M": "bool"}, "cannot be negated"),
    ("Y[i] += M[i,k]", {"M": "bool", "Y": "bool"}, "a bool value cannot be reduced"),
    ("Y[i] = isnan(ids[i])", {"ids": "int64"}, "isnan() tests a floating-point value"),
    ("Y[i] = where(M[i], M[i], X[i])", {"M": "bool"}, "where() selects between a bool and a number"),
    ("Y[i] = eq(M[i], X[i])", {"M": "bool"}, "compares a bool with a number"),
    ("Y[i] = max(M[i], M[i])", {"M": "bool"}, "max() takes numbers, not bool"),
    ("Y[i] = X[i] + 1", {"X": "int16"}, "expected one of"),
])
def test_bodies_that_mix_types_they_may_not_are_one_line(expr: str, dtypes: dict, message: str) -> None:
    shapes = {t: ([4, 3] if "k]" in expr else [4]) for t in ("X", "M", "ids") if f"{t}[" in expr}
    with pytest.raises(InputError, match=re.escape(message)) as err:
        roller.load_op(_op(expr, shapes, **dtypes))
    assert "\n" not in str(err.value).split("\n  ")[0]


def test_typed_epilogues_and_row_kernels_are_refused() -> None:
    with pytest.raises(InputError, match="not supported with an epilogue"):
        roller.load_op(_op("Y[m,n] += A[m,k] * B[k,n]; Y[m,n] = float32(gt(Y[m,n], 0))",
                           {"A": [4, 3], "B": [3, 5]}))
    with pytest.raises(InputError, match="not supported in one"):
        roller.load_op(_op("S[r] += ids[r,c]; Y[r,c] = ids[r,c] - S[r]", {"ids": [4, 8]}, ids="int32",
                           Y="int32"))


def test_integer_arithmetic_wraps_and_divides_toward_zero() -> None:
    op = _op("Y[i] = A[i] / B[i] + A[i] * B[i]", {"A": [6], "B": [6]}, A="int64", B="int64", Y="int64")
    a = np.array([7, -7, 7, -7, 5, I64.min], np.int64)
    b = np.array([2, 2, -2, -2, 0, -1], np.int64)
    got = roller.reference(op, {"A": a, "B": b})
    with np.errstate(over="ignore"):
        products = a * b   # numpy's int64 products wrap, as the kernels' must
    quotients = np.array([3, -3, -3, 3, 0, I64.min], np.int64)
    np.testing.assert_array_equal(got, quotients + products)
    assert got.dtype == np.int64


def test_a_narrow_sum_wraps_to_its_width_when_stored() -> None:
    op = _op("Y[i] += X[i,k]", {"X": [2, 3]}, X="int8", Y="int8")
    x = np.array([[100, 100, 100], [-100, -100, -100]], np.int8)
    np.testing.assert_array_equal(roller.reference(op, {"X": x}), np.array([44, -44], np.int8))
    wide = _op("Y[i] += X[i,k]", {"X": [2, 3]}, X="int8", Y="int64")
    np.testing.assert_array_equal(roller.reference(wide, {"X": x}), [300, -300])


def test_casts_truncate_saturate_and_take_nan_to_zero() -> None:
    op = _op("Y[i] = int8(X[i])", {"X": [7]}, Y="int8")
    x = np.array([1.9, -1.9, np.nan, 1e30, -1e30, 127.5, -128.9], np.float32)
    np.testing.assert_array_equal(roller.reference(op, {"X": x}), [1, -1, 0, 127, -128, 127, -128])
    np.testing.assert_array_equal(convert(np.array([300, -1]), "uint8"), [44, 255])
    np.testing.assert_array_equal(convert(np.array([9.3e18, -9.3e18]), "int64"), [I64.max, I64.min])
    np.testing.assert_array_equal(convert(np.array([0.0, -0.0, 0.5, np.nan]), "bool"), [False, False, True, True])


def test_comparisons_logic_and_where() -> None:
    op = _op("Y[i] = where(and(gt(X[i], 0), not(M[i])), X[i], -1.0)", {"X": [4], "M": [4]}, M="bool")
    x = np.array([1.5, -2.0, 3.0, 0.0], np.float32)
    m = np.array([False, False, True, False])
    np.testing.assert_array_equal(roller.reference(op, {"X": x, "M": m}), np.array([1.5, -1, -1, -1], np.float32))
    mask = _op("Y[i,j] = le(j, i)", {"Y": [3, 3]}, Y="bool")   # a causal mask from axis values alone
    np.testing.assert_array_equal(roller.reference(mask, {}), np.tril(np.ones((3, 3), bool)))
    xor = _op("Y[i] = xor(A[i], ne(B[i], 0))", {"A": [4], "B": [4]}, A="bool", B="int32", Y="bool")
    got = roller.reference(xor, {"A": np.array([0, 1, 0, 1], bool), "B": np.array([0, 0, 5, -5], np.int32)})
    np.testing.assert_array_equal(got, [False, True, True, False])
    tests = _op("Y[i] = or(isnan(X[i]), isinf(X[i]))", {"X": [4]}, Y="bool")
    got = roller.reference(tests, {"X": np.array([0, np.nan, -np.inf, 1e38], np.float32)})
    np.testing.assert_array_equal(got, [False, True, True, False])


def test_random_inputs_of_integer_and_bool_types() -> None:
    op = _op("Y[i] = where(M[i], A[i], float32(B[i]))", {"M": [500], "A": [500], "B": [500]}, M="bool",
             B="uint8")
    x = roller.random_inputs(op, seed=3)
    assert x["M"].dtype == np.bool_ and 0 < x["M"].sum() < 500
    assert x["B"].dtype == np.uint8 and x["B"].min() == 0 and x["B"].max() <= 128


def test_a_check_holds_integer_outputs_to_exact_equality() -> None:
    from roller.compiler.check import check_against
    from roller.errors import CheckError

    e = roller.load_op(_op("Y[i] = A[i] + 1", {"A": [4]}, A="int32", Y="int32"))
    a = {"A": np.array([1, 2, 3, 4], np.int32)}
    check_against("t", e, a, np.array([2, 3, 4, 5], np.int32))
    with pytest.raises(CheckError, match="1 of 4"):
        check_against("t", e, a, np.array([2, 3, 4, 6], np.int32))


def test_backends_that_do_not_render_typed_bodies_refuse_in_one_line(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The Poplar backend renders float32 codelets only: a typed op is one line (exit 2), nothing written."""
    op = _op("Y[i] = ids[i] + 1", {"ids": [4]}, ids="int64", Y="int64")
    with pytest.raises(InputError, match="does not render integer and bool element types yet"):
        roller.compile(op, hw="ipu-gc200")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(op))
    assert main(["build", "--hw", "ipu-gc200", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not render integer and bool" in err
    assert not (tmp_path / "out").exists()
    assert roller.construct(op, "ipu-gc200", top_k=2)   # construction itself is type-agnostic
