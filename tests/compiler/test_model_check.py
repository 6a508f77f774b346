"""A model's check against its reference never calls a wrong output right: a NaN or an infinity in the reference
is matched exactly (same positions, same signs) and leaves the other elements' bounds finite (an inf once made
every bound infinite, so a kernel writing 42 passed; a NaN made every comparison false)."""
from __future__ import annotations

import numpy as np
import pytest

from roller.compiler.check import compare_outputs
from roller.errors import CheckError

REF = np.array([0.0, 1.0, np.inf, -np.inf, np.nan, 2.0], np.float32)


def check(got: np.ndarray) -> dict:
    return compare_outputs("m", ["y"], {"y": got}, {"y": REF}, "onnxruntime")


def test_the_same_non_finite_values_pass() -> None:
    report = check(REF.copy())
    assert report["ok"] and report["max_abs_error"]["y"] == 0.0
    near = REF.copy()
    near[[1, 5]] += 1e-4   # float32 rounding's size: within MODEL_RTOL of the element
    assert check(near)["max_abs_error"]["y"] == pytest.approx(1e-4, rel=1e-2)


@pytest.mark.parametrize(("at", "value", "shown"), [
    (0, 42.0, "got 42, expected 0"),            # a finite error next to an inf in the reference
    (2, 3.0e38, r"got 3.0+\d*e\+38, expected inf"),
    (3, np.inf, "got inf, expected -inf"),      # the sign of an infinity
    (4, 0.0, "got 0, expected nan"),            # a number where the reference has NaN
    (1, np.nan, "got nan, expected 1"),
])
def test_a_wrong_element_beside_non_finite_ones_fails(at: int, value: float, shown: str) -> None:
    got = REF.copy()
    got[at] = value
    with pytest.raises(CheckError, match=rf"output 'y' differs from onnxruntime in 1 of 6 elements; worst at "
                                         rf"\[{at}\]: {shown}"):
        check(got)


def test_a_reference_of_nan_only_still_checks() -> None:
    ref = np.full(4, np.nan, np.float32)
    assert compare_outputs("m", ["y"], {"y": ref.copy()}, {"y": ref}, "r")["ok"]
    with pytest.raises(CheckError, match="in 4 of 4 elements"):
        compare_outputs("m", ["y"], {"y": np.zeros(4, np.float32)}, {"y": ref}, "r")


# -- quantized models: a second correct run's spread (roller.compiler.model_reference) -------------------------
LOGITS = np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 1000


def flips(ref: np.ndarray, at: list[int], by: float) -> np.ndarray:
    """``ref`` with the elements ``at`` one rounding flip (``by``) away, as a requantization near a half gives."""
    out = ref.copy()
    out[at] += by
    return out


def quantized_check(got: np.ndarray, second: np.ndarray) -> dict:
    return compare_outputs("m", ["y"], {"y": got}, {"y": LOGITS}, "onnxruntime", spread={"y": second},
                           spread_by="onnxruntime without graph optimisations")


def test_a_quantized_output_within_twice_the_spread_passes() -> None:
    second = flips(LOGITS, list(range(0, 1000, 4)), 30.0)          # 250 elements a step of 30 apart
    got = flips(LOGITS, list(range(1, 1000, 5)), -45.0)            # 200 elements, each flip larger, same mean
    with pytest.raises(CheckError, match="differs from onnxruntime in 200 of 1000"):
        compare_outputs("m", ["y"], {"y": got}, {"y": LOGITS}, "onnxruntime")   # float32's tolerance: no
    report = quantized_check(got, second)
    figures = report["quantized"]["outputs"]["y"]
    # float32 values of up to about 3000 add a flip within their rounding (2^-12)
    assert report["ok"] and figures["max"] == pytest.approx(45, abs=1e-3)
    assert figures["spread_max"] == pytest.approx(30, abs=1e-3)
    assert figures["mean"] == pytest.approx(9.0, abs=1e-3) and figures["spread_mean"] == pytest.approx(7.5, abs=1e-3)
    assert report["max_abs_error"]["y"] == figures["max"]


@pytest.mark.parametrize(("got", "shown"), [
    # one element off by an indexing bug's amount: the largest difference gives it away
    (flips(LOGITS, [7], 500.0), r"by max 500, mean 0\.5, more than twice the spread .* \(max 30, mean 7\.5\)"),
    # every element a little off: within the largest flip, but the mean is 4x the spread's
    (LOGITS + 30.0, r"by max 30, mean 30, more than twice"),
])
def test_a_quantized_output_beyond_twice_the_spread_fails(got: np.ndarray, shown: str) -> None:
    second = flips(LOGITS, list(range(0, 1000, 4)), 30.0)
    with pytest.raises(CheckError, match=rf"output 'y' of this quantized model differs from onnxruntime {shown}"):
        quantized_check(got, second)


def test_a_quantized_check_still_matches_non_finite_values_exactly() -> None:
    ref = REF.copy()
    second = flips(ref, [1], 0.5)
    ok = flips(ref, [5], 0.5)
    assert compare_outputs("m", ["y"], {"y": ok}, {"y": ref}, "r", spread={"y": second})["ok"]
    bad = ok.copy()
    bad[4] = 1.0   # a number where the reference has NaN, whatever the spread
    with pytest.raises(CheckError, match=r"got 1, expected nan"):
        compare_outputs("m", ["y"], {"y": bad}, {"y": ref}, "r", spread={"y": second})


def test_where_the_two_runs_agree_a_quantized_output_must_match() -> None:
    with pytest.raises(CheckError, match=r"more than twice the spread .* \(max 0, mean 0\)"):
        quantized_check(flips(LOGITS, [3], 20.0), LOGITS.copy())
