"""Output checks: a kernel's output against roller.reference within each element's error bound
(``check_against``), fixed tolerances (``check_output``, ``compare``), a model's outputs against onnxruntime or
the graph reference (``compare_outputs``), and throughput (GFLOP/s for ops with a reduction, GB/s otherwise)."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from roller.dtypes import dtype as dtype_of
from roller.errors import CheckError

if TYPE_CHECKING:
    from roller.ir.reference import Bound
    from roller.ir.tensor_expr import TensorExpr

#: a model's output may differ from the reference by this much of the element's magnitude, plus MODEL_ATOL of
#: the output's largest magnitude: float32 rounding summed over tens of layers (ResNet-50's logits and BERT's
#: layer output differ from onnxruntime by 1e-6 to 1e-5 of their scale), far below an indexing bug's error
MODEL_RTOL = 1e-3
MODEL_ATOL = 1e-4
#: the same for a model that holds half-precision values (float16, bfloat16): onnxruntime then computes in half
#: precision too, each operator rounding to 2^-11 of its values, so both differ from exact arithmetic by about
#: 1e-3 of the scale after a few layers (a float16 ResNet: Roller 1.6e-4 from the float32 model's output,
#: onnxruntime 4.0e-4, the two 4.6e-4 apart), still far below an indexing bug's error
HALF_RTOL = 1e-2
HALF_ATOL = 4e-3


def model_tolerances(dtypes: Iterable[str]) -> tuple[float, float]:
    """(rtol, atol) of ``compare_outputs`` for a model whose values have ``dtypes``."""
    return (HALF_RTOL, HALF_ATOL) if {"float16", "bfloat16"} & set(dtypes) else (MODEL_RTOL, MODEL_ATOL)


#: (rtol, atol) per output dtype for fixed-tolerance comparisons (``check_output`` without a bound, ``compare``);
#: kernels are checked with ``check_against``, whose bound follows the reduction's length and magnitudes
TOLERANCES = {"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (1e-2, 1e-2)}


def tolerances(dtype: str) -> tuple[float, float]:
    return TOLERANCES.get(dtype, TOLERANCES["float32"])


def compare(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> tuple[bool, float, float, tuple]:
    """(ok, max abs error, max rel error, index of the worst element) of ``out`` against ``ref``."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        if out.size != ref.size:
            return False, math.inf, math.inf, ()
        out = out.reshape(ref.shape)
    same = (out == ref) | (np.isnan(out) & np.isnan(ref))  # equal infinities and NaN where expected
    diff = np.where(same, 0.0, np.abs(out - ref))
    diff = np.where(np.isnan(diff), np.inf, diff)
    bad = diff > atol + rtol * np.abs(np.where(np.isfinite(ref), ref, 0.0))
    if diff.size == 0:
        return True, 0.0, 0.0, ()
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    max_abs = float(diff[worst])
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(same, 0.0, diff / np.abs(ref))
    rel = np.where(np.isnan(rel), np.inf, rel)
    max_rel = float(rel.max())
    return not bool(bad.any()), max_abs, max_rel, tuple(int(i) for i in worst)


def check_output(what: str, out: np.ndarray, ref: np.ndarray, dtype: str = "float32",
                 rtol: float | None = None, atol: float | None = None, *, bound: Bound | None = None
                 ) -> tuple[float, float]:
    """Raise CheckError (exit 4) when ``out`` disagrees with ``ref``; returns (max abs, max rel) error.

    With ``bound`` (``roller.ir.reference.bound``: what ``check_against`` passes) each element is held to its
    own a-priori error bound, which grows with the reduction's length and the magnitudes summed; without, to the
    fixed ``rtol``/``atol`` (default: ``tolerances(dtype)``)."""
    if tuple(np.shape(out)) != tuple(np.shape(ref)) and np.size(out) != np.size(ref):
        raise CheckError(f"{what}: output has shape {list(np.shape(out))}, roller.reference gives "
                         f"{list(np.shape(ref))}")
    if bound is None:
        dr, da = tolerances(dtype)
        rtol = dr if rtol is None else rtol
        atol = da if atol is None else atol
        with np.errstate(all="ignore"):
            ok, max_abs, max_rel, worst = compare(out, ref, rtol, atol)
        if not ok:
            n_bad = _count_bad(out, ref, rtol, atol)
            got = float(np.asarray(out, dtype=np.float64).reshape(np.shape(ref))[worst])
            want = float(np.asarray(ref, dtype=np.float64)[worst])
            raise CheckError(f"{what}: output differs from roller.reference in {n_bad} of {np.size(ref)} elements: "
                             f"max abs error {max_abs:.3g}, max rel error {max_rel:.3g} (at {list(worst)}: got "
                             f"{got:.9g}, expected {want:.9g}; rtol {rtol:g}, atol {atol:g})")
        return max_abs, max_rel
    return _check_bound(what, out, bound, dtype)


def check_against(what: str, op: TensorExpr, inputs: Mapping[str, np.ndarray], out: np.ndarray
                  ) -> tuple[float, float]:
    """The check of ``roller run --check``, ``evaluate=True`` and the tests: ``out`` (a kernel's output for
    ``inputs``) against roller.reference, each element within its error bound; CheckError otherwise."""
    from roller.ir.reference import bound as error_bound

    src = op.source or op
    b = error_bound(src, inputs)
    return check_output(what, out, b.ref, src.output.dtype, bound=b)


def _check_bound(what: str, out: np.ndarray, b: Bound, dtype: str) -> tuple[float, float]:
    from roller.ir.reference import np_dtype

    ref = b.ref
    o = np.asarray(out, dtype=np.float64).reshape(ref.shape)
    with np.errstate(all="ignore"):
        # Where the float64 reference exceeds the output dtype, or the terms' magnitudes the float32
        # accumulator, a correct kernel may overflow (to inf, or to NaN through inf - inf) where the reference
        # does not: an infinity or a NaN is then no error.
        top = math.inf if dtype_of(dtype).integral else float(np.finfo(np_dtype(dtype)).max)
        overflow = ((np.abs(ref) > top) | (b.magnitude > float(np.finfo(np.float32).max))) & ~np.isfinite(o)
        finite = np.isfinite(ref)
        same = (o == ref) | (np.isnan(o) & np.isnan(ref))
        diff = np.abs(o - ref)
        good = same | overflow | (finite & (diff <= b.bound))
        bad = ~good
        if bad.any():
            ratio = np.where(bad, np.where(np.isnan(diff), np.inf, diff) / np.maximum(b.bound, 1e-300), -1.0)
            at = np.unravel_index(int(np.argmax(ratio)), ref.shape)
            got, want, d, lim = float(o[at]), float(ref[at]), float(diff[at]), float(b.bound[at])
            if not finite[at] or np.isnan(got):
                why = "where the reference has " + (f"{want}" if not finite[at] else "a number")
            else:
                terms = (f"sum of {b.points} terms, sum |term| = {float(b.magnitude[at]):.4g}"
                         if b.reduce_op == "sum" and b.points > 1 else
                         f"{b.reduce_op} over {b.points} terms" if b.reduce_op else "no reduction")
                why = f"|difference| {d:.3g} > bound {lim:.3g} ({terms})"
            where = f"at {[int(i) for i in at]}" if at else "at the scalar output"
            raise CheckError(f"{what}: output differs from roller.reference beyond the error bound in "
                             f"{int(np.count_nonzero(bad))} of {ref.size} elements; worst {where}: got {got:.9g}, "
                             f"expected {want:.9g}, {why}")
        close = finite & ~same & ~overflow
        max_abs = float(diff[close].max()) if close.any() else 0.0
        rel = diff / np.abs(ref)
        max_rel = float(rel[close].max()) if close.any() else 0.0
    return max_abs, max_rel


def _count_bad(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> int:
    o = np.asarray(out, dtype=np.float64).reshape(np.shape(ref))
    r = np.asarray(ref, dtype=np.float64)
    same = (o == r) | (np.isnan(o) & np.isnan(r))
    with np.errstate(invalid="ignore"):
        close = np.abs(o - r) <= atol + rtol * np.abs(np.where(np.isfinite(r), r, 0.0))
    return int(np.count_nonzero(~(same | close)))


def throughput(expr: TensorExpr, seconds: float) -> tuple[float, str]:
    """(value, unit): GFLOP/s for ops with a reduction, GB/s of compulsory traffic for the others."""
    src = expr.source or expr
    if seconds <= 0:
        return math.inf, "GFLOP/s" if src.is_reduction else "GB/s"
    if src.is_reduction:
        return src.flops / seconds / 1e9, "GFLOP/s"
    return src.bytes / seconds / 1e9, "GB/s"


def compare_outputs(what: str, names: Sequence[str], got: Mapping[str, Any], ref: Mapping[str, Any],
                    by: str, tolerances: tuple[float, float] = (MODEL_RTOL, MODEL_ATOL),
                    spread: Mapping[str, Any] | None = None, spread_by: str = "") -> dict[str, Any]:
    """Each output against its reference within ``rtol`` of the element plus ``atol`` of the output's largest
    magnitude (``tolerances``; integer and bool outputs: equal); CheckError naming the output and the worst
    element otherwise.

    ``spread`` (a quantized model's, ``model_reference``) holds a second correct run's outputs: an output
    outside the tolerance still passes when its largest and its mean difference from the reference are each at
    most twice the two runs' (a third correct run is as far from either as they are from each other, and the
    factor covers how much that varies between inputs); an indexing or requantization bug's differences are of
    the values' own magnitude."""
    rtol, atol = tolerances
    worst: dict[str, float] = {}
    quantized: dict[str, dict[str, float]] = {}
    for name in names:
        y = np.asarray(got[name])
        r = np.asarray(ref[name]).reshape(y.shape)
        floating = np.issubdtype(y.dtype, np.floating)
        failure, worst[name] = (_float_failure(name, y, r, by, rtol, atol) if floating else
                                _exact_failure(name, y, r, by))
        if failure is not None and spread is not None and name in spread:
            failure, quantized[name] = _spread_failure(name, y, r, np.asarray(spread[name]).reshape(y.shape),
                                                       by, spread_by, failure)
        if failure is not None:
            raise CheckError(f"{what}: {failure}")
    report: dict[str, Any] = {"ok": True, "reference": by, "max_abs_error": worst}
    if quantized:
        report["quantized"] = {"spread_by": spread_by, "outputs": quantized}
    return report


def _float_failure(name: str, y: np.ndarray, r: np.ndarray, by: str, rtol: float, atol: float
                   ) -> tuple[str | None, float]:
    """(None or why a float output fails, its largest difference from the reference)."""
    y, r = y.astype(np.float64), r.astype(np.float64)
    # The scale comes from the finite values only (an inf in the reference would make every bound infinite, a
    # NaN every comparison false); a NaN or an infinity in the reference must be matched exactly.
    finite = np.isfinite(r)
    scale = float(np.max(np.abs(r[finite]))) if finite.any() else 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        bound = np.where(finite, rtol * np.abs(r) + atol * scale + 1e-30, 0.0)
        diff = np.where((y == r) | (np.isnan(y) & np.isnan(r)), 0.0, np.abs(y - r))
    diff = np.where(np.isnan(diff), np.inf, diff)
    bad = diff > bound
    largest = float(diff.max()) if diff.size else 0.0
    if not bad.any():
        return None, largest
    with np.errstate(divide="ignore", invalid="ignore"):
        i = np.unravel_index(int(np.argmax(np.where(bad, diff / np.maximum(bound, 1e-300), -1.0))), diff.shape)
    return (f"output {name!r} differs from {by} in {int(bad.sum())} of {r.size} elements; worst at "
            f"{list(map(int, i))}: got {y[i]:.9g}, expected {r[i]:.9g} (difference {diff[i]:.3g}, bound "
            f"{bound[i]:.3g})"), largest


def _exact_failure(name: str, y: np.ndarray, r: np.ndarray, by: str) -> tuple[str | None, float]:
    """An integer or bool output against its reference, element for element (as int64: float64 would round
    values beyond 2^53)."""
    yi, ri = y.astype(np.int64), r.astype(np.int64)
    bad = yi != ri
    if not bad.any():
        return None, 0.0
    largest = float(np.abs(yi - ri).max())
    i = tuple(int(k) for k in np.argwhere(bad)[0])
    return (f"output {name!r} differs from {by} in {int(bad.sum())} of {r.size} elements; first at {list(i)}: "
            f"got {y[i]}, expected {r[i]}"), largest


def _spread_failure(name: str, y: np.ndarray, r: np.ndarray, second: np.ndarray, by: str, spread_by: str,
                    failure: str) -> tuple[str | None, dict[str, float]]:
    """(None or the failure, the figures) of a quantized model's output held to twice the spread between two
    correct runs (``compare_outputs``)."""
    y, r, second = y.astype(np.float64), r.astype(np.float64), second.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(y - r)
        s = np.abs(second - r)
    # Non-finite values must still match exactly: the spread of numbers says nothing about them.
    if not (np.array_equal(np.isnan(y), np.isnan(r)) and np.array_equal(y[np.isinf(r)], r[np.isinf(r)])
            and np.isfinite(y[np.isfinite(r)]).all()):
        return failure, {}
    fin = np.isfinite(r)
    d, s = d[fin], s[fin]
    figures = {"max": float(d.max(initial=0.0)), "mean": float(d.mean()) if d.size else 0.0,
               "spread_max": float(s.max(initial=0.0)), "spread_mean": float(s.mean()) if s.size else 0.0}
    if figures["max"] <= 2 * figures["spread_max"] and figures["mean"] <= 2 * figures["spread_mean"]:
        return None, figures
    return (f"output {name!r} of this quantized model differs from {by} by max {figures['max']:.3g}, mean "
            f"{figures['mean']:.3g}, more than twice the spread between {by} and {spread_by} (max "
            f"{figures['spread_max']:.3g}, mean {figures['spread_mean']:.3g}): {failure}"), figures
