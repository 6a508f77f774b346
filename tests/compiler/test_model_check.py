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
