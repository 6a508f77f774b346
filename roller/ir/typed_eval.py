"""Exact evaluation of typed bodies (integer and bool element types, ``roller.ir.types``), for the reference.

Each node computes in its type, as a kernel does: integers in their own width with wrapping (numpy's array
arithmetic wraps), division truncating toward zero with ``x / 0 = 0`` and ``MIN / -1 = MIN`` (C would trap on
both, ONNX leaves them undefined: this is what every backend renders), float in float32 (float64 where a value
is float64), bool as numpy bool.
``convert`` is ONNX's Cast as Roller defines it where ONNX does not: float to integer truncates toward zero,
saturates at the type's bounds and takes NaN to 0; integer to a narrower integer wraps; anything to bool is
"not zero".
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from roller.dtypes import dtype as dtype_of
from roller.ir.expr import CAST_FUNCS, Affine, AxisValue, BinOp, Call, Const, Expr, Gather, Neg, Read
from roller.ir.types import WEAK_FLOAT, WEAK_INT, BodyTypes, meet, resolve

#: the numpy types floating-point values compute in
FLOAT_HOSTS = (np.float32, np.float64)


def np_compute(t: str) -> type:
    """The numpy type a value of compute type ``t`` (float32, float64 or an integer or bool type) is held in."""
    return dtype_of(t).host


def convert(values: np.ndarray, to: str) -> np.ndarray:
    """``values`` as element type ``to`` (its host numpy type), by the rules in the module docstring."""
    target = dtype_of(to)
    x = np.asarray(values)
    if target.kind == "bool":
        return x != 0
    if not target.integral:
        return x.astype(target.host)
    if np.issubdtype(x.dtype, np.floating):
        info = np.iinfo(target.host)
        with np.errstate(invalid="ignore"):
            t = np.trunc(np.where(np.isnan(x), 0.0, x.astype(np.float64)))
            # float64 holds int64's bounds only approximately: compare before converting, then pin the ends.
            low, high = t <= float(info.min), t >= float(info.max)
            out = np.where(low | high, 0, t).astype(np.int64)
        out = np.where(low, info.min, np.where(high, info.max, out))
        return out.astype(target.host)
    return x.astype(np.int64).astype(target.host) if x.dtype == np.bool_ else x.astype(target.host)


def take(arr: np.ndarray, idx: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(``arr`` at the index arrays ``idx``, clipped into it; where the indices were inside it): a read that
    leaves the tensor gives its pad value where the mask is False."""
    ok = np.asarray(True)
    clipped = []
    for d, ix in enumerate(idx):
        ok = ok & (ix >= 0) & (ix < arr.shape[d])
        clipped.append(np.clip(ix, 0, arr.shape[d] - 1))
    return np.asarray(arr[tuple(clipped)] if clipped else arr[()]), ok


def gather_index(values: np.ndarray, n: int) -> np.ndarray:
    """Run-time indices into a dimension of ``n``: a negative one counts from the end once (ONNX's Gather), and
    what is still outside is clamped to the nearest end, as every backend renders it (never a read outside)."""
    v = np.asarray(values, dtype=np.int64)
    return np.clip(np.where(v < 0, v + n, v), 0, n - 1)


def _index(a: Affine, env: Mapping[str, np.ndarray]) -> np.ndarray:
    v = np.int64(a.const)
    for ax, c in a.terms:
        v = v + c * env[ax]
    return v


def evaluate(e: Expr, env: Mapping[str, np.ndarray], data: Mapping[str, np.ndarray], pad: float,
             types: BodyTypes, want: str) -> np.ndarray:
    """The body's values over ``env`` (axis values as broadcastable int64 grids) in type ``want``."""
    return _Eval(env, data, pad, types)(e, want)


class _Eval:
    def __init__(self, env: Mapping[str, np.ndarray], data: Mapping[str, np.ndarray], pad: float,
                 types: BodyTypes) -> None:
        self.env, self.data, self.pad, self.types = env, data, pad, types

    def __call__(self, e: Expr, want: str) -> np.ndarray:
        """``e`` in its own type, weak values taking ``want``; then converted to ``want``."""
        own = self.types.of(e)
        t = resolve(own, want) if own in (WEAK_INT, WEAK_FLOAT) else own
        return convert(self._node(e, t), want) if t != want else self._node(e, t)

    def _node(self, e: Expr, t: str) -> np.ndarray:
        np_t = np_compute(t)
        if isinstance(e, Const):
            return np.asarray(e.value if np_t in FLOAT_HOSTS else int(e.value)).astype(np_t)
        if isinstance(e, AxisValue):
            return np.asarray(self.env[e.axis]).astype(np_t)
        if isinstance(e, Read):
            return self._read(e, t, [_index(i, self.env) for i in e.index])
        if isinstance(e, Gather):
            idx = [_index(i, self.env) for i in e.source.index]
            idx[e.dim] = gather_index(self(e.index, "int64"), self.data[e.source.tensor].shape[e.dim])
            return self._read(e.source, t, idx)
        if isinstance(e, Neg):
            return np.negative(self(e.x, t))
        if isinstance(e, BinOp):
            a, b = self(e.lhs, t), self(e.rhs, t)
            with np.errstate(all="ignore"):
                if e.op == "/" and np_t not in FLOAT_HOSTS:
                    return _trunc_div(a, b, np_t)
                return {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[e.op](a, b).astype(np_t)
        if isinstance(e, Call):
            return self._call(e, t)
        raise TypeError(e)

    def _read(self, e: Read, t: str, idx: list[np.ndarray]) -> np.ndarray:
        """``e``'s tensor at the index arrays ``idx``, in type ``t``; points outside it give the pad value."""
        np_t = np_compute(t)
        vals, ok = take(self.data[e.tensor], idx)
        vals = convert(vals, t) if vals.dtype != np_t else vals
        return np.where(ok, vals, convert(np.asarray(self.pad), t))

    def _call(self, e: Call, t: str) -> np.ndarray:
        fn, args = e.fn, e.args
        with np.errstate(all="ignore"):
            if fn in ("eq", "ne", "lt", "le", "gt", "ge"):
                at = resolve(meet(self.types.of(args[0]), self.types.of(args[1])), "float32")
                a, b = self(args[0], at), self(args[1], at)
                return {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
                        "gt": np.greater, "ge": np.greater_equal}[fn](a, b)
            if fn in ("and", "or", "xor"):
                a, b = self(args[0], "bool"), self(args[1], "bool")
                return {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[fn](a, b)
            if fn == "not":
                return np.logical_not(self(args[0], "bool"))
            if fn in ("isnan", "isinf"):
                x = self(args[0], resolve(self.types.of(args[0]), "float32"))
                return np.isnan(x) if fn == "isnan" else np.isinf(x)
            if fn in CAST_FUNCS:
                inner = resolve(self.types.of(args[0]), fn)
                return convert(self(args[0], inner), fn)
            if fn == "where":
                return np.where(self(args[0], "bool"), self(args[1], t), self(args[2], t))
            np_t = np_compute(t)
            if fn in ("pow", "fmod"):
                with np.errstate(all="ignore"):
                    f = np.power if fn == "pow" else np.fmod
                    return f(self(args[0], t), self(args[1], t)).astype(np_t)
            if fn in ("max", "min"):
                a, b = self(args[0], t), self(args[1], t)
                if np_t in FLOAT_HOSTS:   # NaN propagates, as the kernels' rl_max/rl_min
                    return (np.maximum if fn == "max" else np.minimum)(a, b)
                return (np.maximum if fn == "max" else np.minimum)(a, b).astype(np_t)
            x = self(args[0], t)
            if fn == "abs":
                return np.abs(x).astype(np_t)
            if fn == "relu":
                return np.where(x < 0, np.zeros_like(x), x)
            return _float_call(fn)(x.astype(np_t)).astype(np_t)


def _trunc_div(a: np.ndarray, b: np.ndarray, np_t: type) -> np.ndarray:
    """Integer division truncating toward zero; ``x / 0 = 0`` and ``MIN / -1 = MIN`` (what the kernels render)."""
    a64, b64 = np.asarray(a).astype(np.int64), np.asarray(b).astype(np.int64)
    safe = np.where(b64 == 0, 1, b64)
    q = np.abs(a64) // np.abs(safe)   # |MIN| wraps to MIN for int64: MIN // 1 is MIN, as wanted
    q = np.where((a64 < 0) != (safe < 0), -q, q)
    return np.where(b64 == 0, 0, q).astype(np_t)


def _float_call(fn: str) -> Callable[[np.ndarray], np.ndarray]:
    import math

    try:
        from scipy.special import erf
    except ImportError:  # pragma: no cover - depends on the environment
        erf = np.vectorize(math.erf)
    return {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "tanh": np.tanh,
            "cos": np.cos, "sin": np.sin, "erf": erf, "round": np.rint, "sigmoid": lambda x: 1 / (1 + np.exp(-x))}[fn]
