"""Ground truth for every backend: evaluate a TensorExpr with numpy, in float64.

Products of plainly indexed tensors go through ``np.einsum`` (BLAS where it applies); everything else is
evaluated over the iteration space with broadcasting, looping in Python over the shortest reduction axes only
as far as needed to keep temporaries near ``_CHUNK`` elements.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from roller.errors import InputError
from roller.ir.expr import Affine, BinOp, Call, Const, Expr, Neg, Read, walk
from roller.ir.opfile import OpLike, load_op
from roller.ir.tensor_expr import TensorExpr

_CHUNK = 1 << 23

try:  # scipy is optional; math.erf is exact but element by element.
    from scipy.special import erf as _erf  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the environment
    _erf = np.frompyfunc(math.erf, 1, 1)

_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.float32}


def np_dtype(name: str) -> type:
    return _NP_DTYPES[name]


def bind_inputs(expr: TensorExpr, args: Sequence[np.ndarray] = (), kwargs: Mapping[str, np.ndarray] | None = None
                ) -> dict[str, np.ndarray]:
    """Inputs by position (right-hand-side order) and/or by name, checked against the declared shapes."""
    kwargs = dict(kwargs or {})
    names = [t.name for t in expr.inputs]
    if len(args) > len(names):
        raise InputError(f"{expr.name} takes {len(names)} inputs ({', '.join(names)}), got {len(args)}")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            raise InputError(f"{expr.name} has no input {k!r} (inputs: {', '.join(names)})")
        if k in bound:
            raise InputError(f"input {k!r} given twice")
        bound[k] = v
    for t in expr.inputs:
        if t.name not in bound:
            raise InputError(f"missing input {t.name!r} of {expr.name}")
        arr = np.asarray(bound[t.name])
        if tuple(arr.shape) != tuple(t.storage_shape):
            raise InputError(f"input {t.name!r} has shape {list(arr.shape)}, expected {list(t.storage_shape)}")
        bound[t.name] = arr
    return bound


def reference(op: OpLike, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> np.ndarray:
    """The output of ``op`` for ``inputs`` (a dict by name, or a sequence in input order)."""
    expr = load_op(op)
    expr = expr.source or expr
    if isinstance(inputs, Mapping):
        bound = bind_inputs(expr, (), inputs)
    else:
        bound = bind_inputs(expr, inputs)
    data = {k: np.asarray(v, dtype=np.float64) for k, v in bound.items()}
    out = _einsum(expr, data)
    if out is None:
        out = _general(expr, data)
    return np.asarray(out, dtype=np_dtype(expr.output.dtype)).reshape(expr.output.shape)


def random_inputs(op: OpLike, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal inputs of the right shapes and dtypes (what tests and ``roller run`` feed kernels)."""
    expr = load_op(op)
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.storage_shape).astype(np_dtype(t.dtype)) for t in expr.inputs}


def _factors(e: Expr) -> tuple[list[Read], float] | None:
    """A body that is a product of reads times constants: (reads, constant factor)."""
    if isinstance(e, Read):
        return [e], 1.0
    if isinstance(e, Const):
        return [], e.value
    if isinstance(e, BinOp) and e.op == "*":
        a, b = _factors(e.lhs), _factors(e.rhs)
        if a is None or b is None:
            return None
        return a[0] + b[0], a[1] * b[1]
    if isinstance(e, BinOp) and e.op == "/" and isinstance(e.rhs, Const) and e.rhs.value != 0:
        a = _factors(e.lhs)
        return None if a is None else (a[0], a[1] / e.rhs.value)
    return None


def _einsum(expr: TensorExpr, data: dict[str, np.ndarray]) -> np.ndarray | None:
    if expr.reduce_op not in (None, "sum"):
        return None
    fac = _factors(expr.body)
    if fac is None or not fac[0]:
        return None
    reads, scale = fac
    letters = {a.name: chr(ord("a") + i) for i, a in enumerate(expr.axes)}
    if len(letters) > 26:
        return None
    specs = []
    for r in reads:
        axes = [i.plain_axis() for i in r.index]
        if None in axes or len(set(axes)) != len(axes):
            return None
        specs.append("".join(letters[a] for a in axes))  # type: ignore[index]
    out = "".join(letters[i.plain_axis()] for i in expr.out_index)  # type: ignore[index]
    if not set(out) <= set("".join(specs)):  # an output axis no input reads: einsum cannot broadcast it
        return None
    result = np.einsum(",".join(specs) + "->" + out, *[data[r.tensor] for r in reads], optimize=True)
    return result * scale if scale != 1.0 else result


def _general(expr: TensorExpr, data: dict[str, np.ndarray]) -> np.ndarray:
    axes = list(expr.axes)
    looped: list = []
    size = math.prod(a.extent for a in axes)
    for a in sorted(expr.reduce_axes, key=lambda a: a.extent):
        if size <= _CHUNK:
            break
        looped.append(a)
        size //= a.extent
    vec = [a for a in axes if a not in looped]
    shape = tuple(a.extent for a in vec)
    grids = {a.name: np.arange(a.extent).reshape([-1 if i == j else 1 for j in range(len(vec))])
             for i, a in enumerate(vec)}
    red_dims = tuple(i for i, a in enumerate(vec) if a.reduce)
    acc: np.ndarray | None = None
    for point in np.ndindex(*[a.extent for a in looped]):
        env = dict(grids)
        env.update({a.name: np.int64(v) for a, v in zip(looped, point)})
        val = np.broadcast_to(_eval(expr.body, env, data, expr.pad_value), shape)
        if red_dims:
            val = {"sum": np.sum, "max": np.max, "min": np.min}[expr.reduce_op](val, axis=red_dims)
        if acc is None:
            acc = np.array(val, dtype=np.float64)
        elif expr.reduce_op == "sum":
            acc += val
        elif expr.reduce_op == "max":
            np.maximum(acc, val, out=acc)
        else:
            np.minimum(acc, val, out=acc)
    assert acc is not None
    # Output axes are the spatial axes in output order, which is how they lead the axis list.
    return acc


def _index(a: Affine, env: dict) -> np.ndarray:
    v = np.int64(a.const)
    for ax, c in a.terms:
        v = v + c * env[ax]
    return v


def _eval(e: Expr, env: dict, data: dict[str, np.ndarray], pad: float) -> np.ndarray:
    if isinstance(e, Const):
        return np.float64(e.value)
    if isinstance(e, Read):
        arr = data[e.tensor]
        idx = [_index(i, env) for i in e.index]
        ok = np.bool_(True)
        clipped = []
        for d, ix in enumerate(idx):
            ok = ok & (ix >= 0) & (ix < arr.shape[d])
            clipped.append(np.clip(ix, 0, arr.shape[d] - 1))
        vals = arr[tuple(clipped)] if clipped else arr[()]
        return np.where(ok, vals, pad)
    if isinstance(e, Neg):
        return -_eval(e.x, env, data, pad)
    if isinstance(e, BinOp):
        a, b = _eval(e.lhs, env, data, pad), _eval(e.rhs, env, data, pad)
        with np.errstate(divide="ignore", invalid="ignore"):
            return {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[e.op](a, b)
    if isinstance(e, Call):
        args = [_eval(x, env, data, pad) for x in e.args]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return _call(e.fn, args)
    raise TypeError(e)


def _call(fn: str, args: list[np.ndarray]) -> np.ndarray:
    x = args[0]
    if fn == "exp":
        return np.exp(x)
    if fn == "log":
        return np.log(x)
    if fn == "sqrt":
        return np.sqrt(x)
    if fn == "rsqrt":
        return 1.0 / np.sqrt(x)
    if fn == "tanh":
        return np.tanh(x)
    if fn == "erf":
        return np.asarray(_erf(x), dtype=np.float64)
    if fn == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if fn == "relu":
        return np.maximum(x, 0.0)
    if fn == "abs":
        return np.abs(x)
    if fn == "max":
        return np.maximum(x, args[1])
    if fn == "min":
        return np.minimum(x, args[1])
    raise ValueError(fn)


def uses_padding(expr: TensorExpr) -> bool:
    """True when some read may fall outside its tensor (then pad_value matters)."""
    ext = expr.extents
    for r in (n for n in walk(expr.body) if isinstance(n, Read)):
        shape = expr.tensor(r.tensor).shape
        for d, i in enumerate(r.index):
            lo, hi = i.span(ext)
            if lo < 0 or hi >= shape[d]:
                return True
    return False
