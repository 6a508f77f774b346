"""Ground truth for every backend: evaluate a TensorExpr with numpy, in float64.

Products of plainly indexed tensors go through ``np.einsum`` (BLAS where it applies); everything else is
evaluated over the iteration space with broadcasting, looping in Python over the shortest reduction axes only
as far as needed to keep temporaries near ``_CHUNK`` elements.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from roller.dtypes import dtype
from roller.errors import InputError
from roller.ir.expr import Affine, AxisValue, BinOp, Call, Const, Expr, Neg, Read, walk
from roller.ir.opfile import OpLike, load_op
from roller.ir.tensor_expr import TensorExpr
from roller.ir.typed_eval import take

_CHUNK = 1 << 23


def _erf(x: np.ndarray) -> np.ndarray:
    """erf by scipy where it is installed (math.erf is exact but element by element), imported at the first
    call: importing scipy.special costs 0.2 s, a fifth of a warm model build, which rarely needs erf."""
    try:
        from scipy.special import erf
    except ImportError:  # pragma: no cover - depends on the environment
        return np.asarray(np.frompyfunc(math.erf, 1, 1)(x), dtype=np.float64)
    return np.asarray(erf(x), dtype=np.float64)


def np_dtype(name: str) -> type:
    """The numpy type arrays of ``name`` have on the host (and the reference computes in)."""
    return dtype(name).host


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
        if t.dtype == "bfloat16":   # what the tensor holds: float32 values rounded to bfloat16, as a device stores them
            kind = dtype("bfloat16")
            arr = kind.from_storage(kind.to_storage(arr))
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
    plain = _plain_output(expr)
    if plain is not None:
        return _scatter(expr, reference(plain, bound))
    if expr.typed:
        return _typed(expr, bound)[0]
    data = {k: np.asarray(v, dtype=np.float64) for k, v in bound.items()}
    if expr.stages:
        ref, _ = _rows_bound(expr, data, 0.0)
        return np.asarray(np.broadcast_to(ref, expr.output.shape), dtype=np_dtype(expr.output.dtype))
    out = _einsum(expr, data)
    if out is None:
        out = _general(expr, data)
    if expr.epilogue is not None:
        with np.errstate(all="ignore"):
            out = _eval(expr.epilogue, _output_grids(expr), {**data, expr.output.name: out}, expr.pad_value)
    return np.asarray(np.broadcast_to(out, expr.output.shape), dtype=np_dtype(expr.output.dtype))


def _plain_output(expr: TensorExpr) -> TensorExpr | None:
    """Where the output index is not its spatial axes alone (a layout blocked along an axis writes
    ``Y[m, 16*n_o + n_i]``): the same op writing a tensor indexed by the spatial axes in order, whose values
    ``_scatter`` places (a padded buffer's interior too). None where the index is plain and covers the output."""
    if all(i.plain_axis() is not None and n == expr.axis(str(i.plain_axis())).extent
           for i, n in zip(expr.out_index, expr.output.shape)):
        return None
    index = tuple(Affine.axis(a.name) for a in expr.spatial_axes)
    out = replace(expr.output, shape=tuple(a.extent for a in expr.spatial_axes), view=None, orig_shape=None)
    return replace(expr.remap_reads(lambda r: r, index), output=out, source=None)


def _scatter(expr: TensorExpr, values: np.ndarray) -> np.ndarray:
    """``values`` over ``expr``'s spatial axes placed at its output index."""
    spatial = expr.spatial_axes
    grids = {a.name: np.arange(a.extent).reshape([-1 if i == j else 1 for j in range(len(spatial))])
             for i, a in enumerate(spatial)}
    where = tuple(np.broadcast_to(_index(i, grids), values.shape) for i in expr.out_index)
    out = np.zeros(expr.output.shape, dtype=values.dtype)
    out[where] = values
    return out


def _rows_bound(expr: TensorExpr, data: dict[str, np.ndarray], u: float) -> tuple[np.ndarray, np.ndarray]:
    """(value, error bound) of a row kernel: each stage reduced over the column axes (its error as ``bound``
    explains, with unit roundoff ``u``), then the body over them."""
    env = _output_grids(expr)
    axes = [str(i.plain_axis()) for i in expr.out_index]
    shape = tuple(expr.axis(a).extent for a in axes)
    rows = set(expr.row_axes)
    cols = tuple(d for d, a in enumerate(axes) if a not in rows)
    points = math.prod(shape[d] for d in cols)
    seeds: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    with np.errstate(all="ignore"):
        for st in expr.stages:
            val, err = _eval_err(st.body, env, data, expr.pad_value, u, seeds)
            val, err = np.broadcast_to(val, shape), np.broadcast_to(err, shape)
            if st.reduce_op == "sum":
                mag = np.sum(np.abs(val), axis=cols, keepdims=True)
                e = np.sum(err, axis=cols, keepdims=True)
                seeds[st.name] = (np.sum(val, axis=cols, keepdims=True), e + _gamma(max(points - 1, 0), u) * (mag + e))
            else:
                fold = np.max if st.reduce_op == "max" else np.min
                seeds[st.name] = (fold(val, axis=cols, keepdims=True), np.max(err, axis=cols, keepdims=True))
        return _eval_err(expr.body, env, data, expr.pad_value, u, seeds)


def _output_grids(expr: TensorExpr) -> dict[str, np.ndarray]:
    """Each output axis's values, broadcast over the output's shape (the epilogue's iteration space)."""
    axes = [i.plain_axis() for i in expr.out_index]
    return {str(a): np.arange(expr.axis(str(a)).extent).reshape([-1 if i == j else 1 for j in range(len(axes))])
            for i, a in enumerate(axes)}


def random_inputs(op: OpLike, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the right shapes and dtypes (what tests and ``roller run`` feed kernels): standard-normal
    floats; integers uniform in [-64, 64] ([0, 128] unsigned), zeros included, so that divisions by zero and
    negative operands are exercised; bools fair coins."""
    expr = load_op(op)
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for t in expr.inputs:
        kind = dtype(t.dtype).kind
        if kind == "float":
            out[t.name] = rng.standard_normal(t.storage_shape).astype(np_dtype(t.dtype))
        elif kind == "bool":
            out[t.name] = rng.random(t.storage_shape) < 0.5
        else:
            low = 0 if kind == "uint" else -64
            out[t.name] = rng.integers(low, low + 129, t.storage_shape).astype(np_dtype(t.dtype))
    return out


def _typed(expr: TensorExpr, inputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(output, sum of |terms| as float64) of a typed op (``roller.ir.typed_eval``): each node in its type,
    an integer reduction in int64 (wrapping), a float one in float64, the result converted to the output's
    type."""
    from roller.ir.typed_eval import convert, evaluate
    from roller.ir.types import BodyTypes

    types = BodyTypes({t.name: t.dtype for t in expr.tensors})
    data = {k: np.asarray(v) for k, v in inputs.items()}
    acc_t = expr.acc_dtype
    acc: np.ndarray | None = None
    mag: np.ndarray | None = None
    for env, shape, red_dims in _chunks(expr):
        val = np.broadcast_to(evaluate(expr.body, env, data, expr.pad_value, types, acc_t), shape)
        wide = val.astype(np.float64) if acc_t == "float32" else val
        size = np.abs(val.astype(np.float64))
        if red_dims:
            fold = _FOLDS[str(expr.reduce_op)]
            wide = fold(wide, axis=red_dims) if expr.reduce_op != "sum" else np.sum(wide, axis=red_dims,
                                                                                     dtype=wide.dtype)
            size = np.sum(size, axis=red_dims)
        if acc is None or mag is None:
            acc, mag = np.array(wide), np.array(size)
            continue
        mag += size
        if expr.reduce_op == "sum":
            acc = acc + wide
        else:
            acc = (np.maximum if expr.reduce_op == "max" else np.minimum)(acc, wide)
    assert acc is not None and mag is not None
    shape = expr.output.shape
    return (np.asarray(np.broadcast_to(convert(acc, expr.output.dtype), shape)),
            np.asarray(np.broadcast_to(mag, shape), dtype=np.float64))


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
    operands = []
    ext = expr.extents
    for r in reads:
        plain = [i.plain_axis() for i in r.index]
        if None in plain or len(set(plain)) != len(plain):
            strided = _window_view(data[r.tensor], r.index, ext, expr.pad_value)
            if strided is None:
                return None
            view, axes = strided
        else:
            view, axes = data[r.tensor], [str(a) for a in plain]
        specs.append("".join(letters[a] for a in axes))
        operands.append(view)
    out = "".join(letters[i.plain_axis()] for i in expr.out_index)  # type: ignore[index]
    if not set(out) <= set("".join(specs)):  # an output axis no input reads: einsum cannot broadcast it
        return None
    result = np.einsum(",".join(specs) + "->" + out, *operands, optimize=True)
    return result * scale if scale != 1.0 else result


def _window_view(arr: np.ndarray, index: tuple[Affine, ...], ext: Mapping[str, int], pad: float
                 ) -> tuple[np.ndarray, list[str]] | None:
    """A read with affine indices (a convolution's ``X[n,c,2*h+r-1,w+s-1]``) as a strided view over the array
    padded with the pad value: one view axis per (dimension, axis) term, so that einsum (BLAS) computes what
    the loop over the iteration space would. None where that does not apply: a negative coefficient, an axis
    in two dimensions, or padding far larger than the array (near-limit indices)."""
    before, after, plan = [], [], []
    seen: set[str] = set()
    for d, i in enumerate(index):
        if any(c <= 0 for _, c in i.terms) or seen & set(i.axes()):
            return None
        seen.update(i.axes())
        lo = i.const
        hi = i.const + sum(c * (ext[a] - 1) for a, c in i.terms)
        before.append(max(0, -lo))
        after.append(max(0, hi - (arr.shape[d] - 1)))
        plan.append((lo, i.terms))
    padded_size = math.prod(n + b + a for n, b, a in zip(arr.shape, before, after))
    if padded_size > 4 * arr.size + (1 << 20):
        return None
    padded = np.pad(arr, list(zip(before, after)), constant_values=pad) if any(before) or any(after) else arr
    offset = sum((lo + b) * st for (lo, _), b, st in zip(plan, before, padded.strides))
    shape, strides, axes = [], [], []
    for (_, terms), st in zip(plan, padded.strides):
        for a, c in terms:
            shape.append(ext[a])
            strides.append(c * st)
            axes.append(a)
    base = padded.reshape(-1)[offset // padded.itemsize:]
    return np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides, writeable=False), axes


def _chunks(expr: TensorExpr) -> Iterator[tuple[dict, tuple[int, ...], tuple[int, ...]]]:
    """(axis values, shape, reduced dimensions) of each chunk of the iteration space: the shortest reduction
    axes are looped over in Python only as far as needed to keep a chunk near ``_CHUNK`` points."""
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
    for point in np.ndindex(*[a.extent for a in looped]):
        env = dict(grids)
        env.update({a.name: np.int64(v) for a, v in zip(looped, point)})
        yield env, shape, red_dims


# How a reduction folds a chunk of points (``reduce_op`` names them).
_FOLDS: dict[str, Any] = {"sum": np.sum, "max": np.max, "min": np.min}


def _general(expr: TensorExpr, data: dict[str, np.ndarray]) -> np.ndarray:
    acc: np.ndarray | None = None
    for env, shape, red_dims in _chunks(expr):
        val = np.broadcast_to(_eval(expr.body, env, data, expr.pad_value), shape)
        if red_dims:
            val = _FOLDS[str(expr.reduce_op)](val, axis=red_dims)
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
    if isinstance(e, AxisValue):
        return np.asarray(env[e.axis], dtype=np.float64)
    if isinstance(e, Read):
        vals, ok = take(data[e.tensor], [_index(i, env) for i in e.index])
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
    if fn == "cos":
        return np.cos(x)
    if fn == "sin":
        return np.sin(x)
    if fn == "erf":
        return np.asarray(_erf(x), dtype=np.float64)
    if fn == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if fn == "relu":
        return np.maximum(x, 0.0)
    if fn == "abs":
        return np.abs(x)
    if fn == "round":
        return np.rint(x)
    if fn == "pow":
        with np.errstate(all="ignore"):
            return np.power(x, args[1])
    if fn == "fmod":
        with np.errstate(all="ignore"):
            return np.fmod(x, args[1])
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


# -- how far a correct kernel may be from the reference --------------------------------------------------------
#: unit roundoff (half an ulp at 1.0) and smallest subnormal step of each storage dtype
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
_TINY = {"float64": 2.0**-1074, "float32": 2.0**-149, "float16": 2.0**-24, "bfloat16": 2.0**-133}
# Error of one evaluation of each function, in ulps of its result (1 ulp = 2 unit roundoffs): the OpenCL C 1.2
# single-precision limits (CUDA's and HIP's are tighter); sigmoid is exp, an add and a division.
_ULPS = {"exp": 3, "log": 3, "sqrt": 3, "rsqrt": 2, "tanh": 5, "erf": 16, "sigmoid": 7, "relu": 0, "abs": 0,
         "max": 0, "min": 0, "cos": 4, "sin": 4, "round": 0, "pow": 16,
         "fmod": 0}
_DIV_ULPS = 2.5


@dataclass
class Bound:
    """The reference output and, per element, the most a correct kernel may differ from it (see ``bound``)."""

    ref: np.ndarray  # float64, the output's shape (before rounding to the output dtype)
    bound: np.ndarray  # float64, same shape; inf where the magnitudes overflow
    magnitude: np.ndarray  # sum over the reduction of |term| (the terms themselves without one)
    points: int  # terms per output element (1 without a reduction)
    reduce_op: str | None


def bound(op: OpLike, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> Bound:
    """The reference output with an a-priori error bound per element: the most a correct kernel can differ from
    it, computing in float32 (the accumulator) and storing in the output's dtype.

    Each term of the body carries a first-order forward error (inputs exact; every +, -, * rounds by one unit
    roundoff u, a division by 2.5 ulps, a constant by its own rounding, a function by its ulp limit plus its
    argument's error times its derivative's magnitude). A sum of K terms adds the bound that holds for every
    summation order (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 4.4 and lemma 3.1):
    ``gamma(K-1) * sum |term|`` with ``gamma(n) = n u / (1 - n u)``. That is the worst case, not the typical
    sqrt(K) growth of random rounding: a correct kernel can never fail it, whatever order its tiles, vectors
    and split reductions add in, and for the layer shapes of ResNet-18 and BERT-base it still sits far below
    the difference an index off by one makes (tests/compiler/test_hostile_numerics.py). max= and min= add no error of
    their own. The result is then rounded to the output dtype twice (by the kernel, and when the reference is
    stored), each within one unit roundoff of that dtype, plus the dtype's subnormal step."""
    expr = load_op(op)
    expr = expr.source or expr
    bound_in = bind_inputs(expr, (), inputs) if isinstance(inputs, Mapping) else bind_inputs(expr, inputs)
    plain = _plain_output(expr)
    if plain is not None:
        b = bound(plain, bound_in)
        return replace(b, ref=_scatter(expr, b.ref), bound=_scatter(expr, b.bound), magnitude=_scatter(expr, b.magnitude))
    if expr.typed:
        return _typed_bound(expr, bound_in)
    data = {k: np.asarray(v, dtype=np.float64) for k, v in bound_in.items()}
    u = UNIT_ROUNDOFF.get(expr.acc_dtype, UNIT_ROUNDOFF["float32"])
    out_u = UNIT_ROUNDOFF[expr.output.dtype]
    points = math.prod(a.extent for a in expr.reduce_axes) if expr.reduce_op else 1
    with np.errstate(all="ignore"):
        fast = None if expr.stages else _einsum_bound(expr, data, u)
        if expr.stages:
            ref, err = _rows_bound(expr, data, u)
            mag = np.abs(ref)
        elif fast is not None:
            ref, err, mag = fast
        else:
            ref, err, mag = _general_bound(expr, data, u)
        total = err
        if expr.reduce_op == "sum" and points > 1:
            total = err + _gamma(points - 1, u) * (mag + err)
        if expr.epilogue is not None:
            seed = {expr.output.name: (np.asarray(ref), np.asarray(total))}
            ref, total = _eval_err(expr.epilogue, _output_grids(expr), data, expr.pad_value, u, seed)
            ref, total = np.broadcast_to(ref, expr.output.shape), np.broadcast_to(total, expr.output.shape)
        total = total * (1 + out_u) + 2 * out_u * np.abs(ref) + _TINY[expr.output.dtype]
        total = np.where(np.isnan(total), np.inf, total)
    shape = expr.output.shape
    return Bound(np.asarray(ref, dtype=np.float64).reshape(shape), np.asarray(total).reshape(shape),
                 np.asarray(mag, dtype=np.float64).reshape(shape), points, expr.reduce_op)


def _typed_bound(expr: TensorExpr, inputs: Mapping[str, np.ndarray]) -> Bound:
    """A typed op's reference and bound: an integer or bool output must match exactly; a float one (a cast, a
    select, float arithmetic beside comparisons) as a float32 evaluation of the body may differ, each function
    and operation by its ulp limit, a sum by the bound that holds for every order."""
    ref, mag = _typed(expr, inputs)
    points = math.prod(a.extent for a in expr.reduce_axes) if expr.reduce_op else 1
    out = np.asarray(ref, dtype=np.float64)
    if dtype(expr.output.dtype).integral:
        return Bound(out, np.zeros_like(out), mag, points, expr.reduce_op)
    u = UNIT_ROUNDOFF["float32"]
    out_u = UNIT_ROUNDOFF[expr.output.dtype]
    ops = 1 + _rounding_count(expr.body) + 16 * sum(1 for n in walk(expr.body) if isinstance(n, Call) and n.fn in _ULPS)
    per_term = 2 * ops * u * mag
    total = per_term + (_gamma(points - 1, u) * (mag + per_term) if expr.reduce_op == "sum" and points > 1 else 0)
    total = total * (1 + out_u) + 2 * out_u * np.abs(out) + _TINY[expr.output.dtype]
    return Bound(out, np.where(np.isnan(total), np.inf, total), mag, points, expr.reduce_op)


def _gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u) if n * u < 1 else math.inf


def _rounding_count(e: Expr) -> float:
    """Relative error, in unit roundoffs, of a product or quotient of reads and constants (first order)."""
    count = 0.0
    for node in walk(e):
        if isinstance(node, BinOp):
            count += 2 * _DIV_ULPS if node.op == "/" else 1
        elif isinstance(node, Const):
            count += 1
    return count


def _einsum_bound(expr: TensorExpr, data: dict[str, np.ndarray], u: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(reference, summed term errors, summed |terms|) of a body that is a product of reads: both sums are
    einsums, the second over absolute values (BLAS, no pass over the iteration space)."""
    ref = _einsum(expr, data)
    if ref is None:
        return None
    mag = _einsum(expr, {k: np.abs(v) for k, v in data.items()})
    if mag is None:
        return None
    mag = np.abs(mag)  # a negative constant factor scales the absolute einsum by it
    return ref, _rounding_count(expr.body) * u * mag, mag


def _general_bound(expr: TensorExpr, data: dict[str, np.ndarray], u: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(reference, term errors reduced as the op reduces, summed |terms|) over the iteration space, chunked
    as _general."""
    acc: np.ndarray | None = None
    err_acc: np.ndarray | None = None
    mag_acc: np.ndarray | None = None
    for env, shape, red in _chunks(expr):
        val, err = _eval_err(expr.body, env, data, expr.pad_value, u)
        val, err = np.broadcast_to(val, shape), np.broadcast_to(err, shape)
        mag = np.abs(val)
        if red:
            fold = _FOLDS[str(expr.reduce_op)]
            val, mag = fold(val, axis=red), np.sum(mag, axis=red)
            err = np.sum(err, axis=red) if expr.reduce_op == "sum" else np.max(err, axis=red)
        if acc is None:
            acc, err_acc, mag_acc = np.array(val, np.float64), np.array(err, np.float64), np.array(mag, np.float64)
        elif expr.reduce_op == "sum":
            assert err_acc is not None and mag_acc is not None
            acc += val
            err_acc += err
            mag_acc += mag
        else:
            assert err_acc is not None and mag_acc is not None
            (np.maximum if expr.reduce_op == "max" else np.minimum)(acc, val, out=acc)
            np.maximum(err_acc, err, out=err_acc)
            mag_acc += mag
    assert acc is not None and err_acc is not None and mag_acc is not None
    return acc, err_acc, mag_acc


def _eval_err(e: Expr, env: dict, data: dict[str, np.ndarray], pad: float, u: float,
              seeds: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(value, bound on the float32 evaluation's error) of a body, first order, as _eval evaluates it. A read
    of a tensor in ``seeds`` (an epilogue's reduced value, read at the output's own index) is (value, error)
    already computed."""
    if seeds and isinstance(e, Read) and e.tensor in seeds:
        return seeds[e.tensor]
    if isinstance(e, Const):
        return np.float64(e.value), np.float64(abs(e.value) * u if math.isfinite(e.value) else 0.0)
    if isinstance(e, (Read, AxisValue)):  # exact: inputs are the kernel's own values, axis values are small
        return _eval(e, env, data, pad), np.float64(0.0)
    if isinstance(e, Neg):
        v, d = _eval_err(e.x, env, data, pad, u, seeds)
        return -v, d
    if isinstance(e, BinOp):
        a, da = _eval_err(e.lhs, env, data, pad, u, seeds)
        b, db = _eval_err(e.rhs, env, data, pad, u, seeds)
        if e.op in "+-":
            v = a + b if e.op == "+" else a - b
            return v, da + db + u * np.abs(v)
        if e.op == "*":
            v = a * b
            return v, np.abs(b) * da + np.abs(a) * db + da * db + u * np.abs(v)
        v = a / b
        # |a/b - (a+da)/(b+db)| <= (da + |v| db) / (|b| - db) while db < |b|; beyond, anything.
        room = np.abs(b) - db
        spread = np.where(room > 0, (da + np.abs(v) * db) / np.where(room > 0, room, 1.0), np.inf)
        return v, spread + 2 * _DIV_ULPS * u * np.abs(v)
    if isinstance(e, Call):
        pairs = [_eval_err(x, env, data, pad, u, seeds) for x in e.args]
        v = _call(e.fn, [p[0] for p in pairs])
        x, dx = pairs[0]
        ax, adx = np.abs(x), np.abs(dx)
        if e.fn in ("max", "min"):
            prop = np.maximum(adx, np.abs(pairs[1][1]))
        elif e.fn in ("relu", "abs", "tanh", "cos", "sin"):   # |f'| <= 1
            prop = adx
        elif e.fn == "round":   # a step: an error that reaches a half may move the result by one
            prop = np.where(np.abs(x - np.rint(x)) + adx >= 0.5, adx + 1.0, 0.0)
        elif e.fn == "pow":   # |d x^y| <= |y x^(y-1)| dx + |x^y ln x| dy, while x keeps its sign
            y, dy = pairs[1]
            with np.errstate(all="ignore"):
                safe = np.where(ax > 0, ax, 1.0)
                prop = np.abs(y * v / safe) * adx + np.abs(v * np.log(safe)) * np.abs(dy)
            prop = np.where((adx == 0) & (np.abs(dy) == 0), 0.0, np.where(ax > adx, prop, np.inf))
            return v, prop + 2 * _ULPS[e.fn] * u * np.abs(v)
        elif e.fn == "fmod":   # x - n y for n = trunc(x / y), plus a whole |y| where the errors may move n
            y, dy = pairs[1]
            ady = np.abs(dy)
            with np.errstate(all="ignore"):
                q = x / y
                n = np.trunc(q)
                moves = np.abs(y) <= ady
                moves |= (np.abs(q - np.round(q)) * (np.abs(y) - ady) <= adx + np.abs(q) * ady) & (np.round(q) != 0)
            prop = adx + np.abs(n) * ady + np.where(moves, np.abs(y) + ady, 0.0)
            prop = np.where((adx == 0) & (ady == 0), 0.0, prop)
        elif e.fn == "erf":
            prop = 1.1284 * adx
        elif e.fn == "sigmoid":
            prop = 0.25 * adx
        elif e.fn == "exp":
            prop = np.abs(v) * np.expm1(adx)
        elif e.fn == "log":
            prop = np.where(ax > adx, -np.log1p(-adx / np.where(ax > adx, ax, 1.0)), np.inf)
        elif e.fn == "sqrt":
            prop = np.minimum(adx / np.sqrt(ax), np.sqrt(adx))
        else:  # rsqrt
            prop = np.where(ax > adx, adx / np.where(ax > adx, ax - adx, 1.0) ** 1.5, np.inf)
        prop = np.where(adx == 0, 0.0, prop)  # an exact argument propagates nothing (also where f' is infinite)
        return v, prop + 2 * _ULPS[e.fn] * u * np.abs(v)
    raise TypeError(e)
