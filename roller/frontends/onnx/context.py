"""What a translation of one ONNX node works with: the values it reads (shape, dtype, constant or not), and the
steps it adds to the graph (Roller operators, views, copies, constants).

Every node whose inputs are all constants is evaluated at import with ONNX's own reference evaluator
(``onnx.reference``), so shape arithmetic (Shape, Gather, Concat, ConstantOfShape, Cast of constants...) never
reaches the device.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from roller.dtypes import dtype as dtype_of
from roller.errors import InputError
from roller.graph.ir import CopyNode, Graph, OpNode, Piece, Value, ViewNode
from roller.ir.build import Where, build_expr

_T = onnx.TensorProto
#: ONNX element types a value on the device may have, and Roller's name for them
DEVICE_TYPES: dict[int, str] = {_T.DOUBLE: "float64", _T.FLOAT: "float32", _T.FLOAT16: "float16",
                                _T.BFLOAT16: "bfloat16", _T.INT64: "int64", _T.INT32: "int32", _T.INT8: "int8",
                                _T.UINT8: "uint8", _T.BOOL: "bool"}
#: the floating-point ones (what float-only ops take)
FLOAT_TYPES = ("float64", "float32", "float16", "bfloat16")
#: integer literals written into a body exactly: a body's literals are doubles (``roller.ir.expr.Const``)
MAX_EXACT_LITERAL = 2**53
# The default-domain opsets the importer reads: from 11 to the installed onnx package's newest (the releases
# after 21 changed none of the translated ops' meaning, only the types they take).
OPSETS = (11, onnx.defs.onnx_opset_version())

class NeedsConstant(InputError):
    """A translation needs the value of ``name`` at import (a shape, axes, pads, a scale...), and the model
    computes it or takes it as an input. The ONNX backend, which sees the inputs' values only at run time,
    folds such an input in and compiles again (``roller.compiler.onnx_backend``)."""

    def __init__(self, message: str, name: str, *, source: str | None = None, field: str | None = None) -> None:
        super().__init__(message, source=source, field=field)
        self.name = name


Translator = Callable[["Context", onnx.NodeProto], None]
TRANSLATORS: dict[str, Translator] = {}
#: import-time evaluations of Roller's own, for ops whose inputs are all constants where onnx.reference has no
#: implementation at the model's opset (its DequantizeLinear starts at opset 19)
FOLDERS: dict[str, Translator] = {}


def _registrar(table: dict[str, Translator], *op_types: str) -> Callable[[Translator], Translator]:
    def register(fn: Translator) -> Translator:
        for t in op_types:
            table[t] = fn
        return fn
    return register


def folds(*op_types: str) -> Callable[[Translator], Translator]:
    """Register an import-time evaluation (``FOLDERS``)."""
    return _registrar(FOLDERS, *op_types)


def translates(*op_types: str) -> Callable[[Translator], Translator]:
    """Register a translation for ONNX op types of the default domain."""
    return _registrar(TRANSLATORS, *op_types)


def fmt(x: float) -> str:
    """A float32 constant as an expression literal, exactly (the float32 value, printed in full)."""
    v = float(np.float32(x))
    if not np.isfinite(v):
        raise ValueError(f"cannot inline {x!r}")
    return repr(v)


def real(x: float, dtype: str) -> str:
    """A value the translation computes (a mean's ``1 / n``, an exponent) as a literal of a body whose values
    are ``dtype``: exactly for float64, else as float32's value (``fmt``, as a float32 model holds it)."""
    if dtype != "float64":
        return fmt(x)
    if not math.isfinite(x):
        raise ValueError(f"cannot inline {x!r}")
    return repr(float(x))


def real_type(dtype: str) -> type:
    """The numpy type of a constant the translation computes for values of ``dtype`` (``real``'s arrays)."""
    return np.float64 if dtype == "float64" else np.float32


def held_type(kind: np.dtype) -> str:
    """The element type a constant of numpy type ``kind`` is uploaded as: the device types (float64, float16,
    bfloat16 from ml_dtypes' type, the integer and bool types) stay what they are (the kernels of a float16 or
    bfloat16 model read them so, and its results keep the declared type); every other float type becomes
    float32."""
    return kind.name if kind.name in DEVICE_TYPES.values() else "float32"


def literal(c: np.ndarray) -> str | None:
    """The one element of a constant as a body literal of its own type (an integer without a fraction, a bool
    as ``bool(0|1)``, a float as ``fmt``), or None where a literal cannot hold it exactly (an integer beyond
    2^53, a float that is not finite): such a constant is read from a tensor instead."""
    x = c.reshape(-1)[0]
    if c.dtype == np.bool_:
        return f"bool({int(x)})"
    if np.issubdtype(c.dtype, np.integer):
        return str(int(x)) if abs(int(x)) <= MAX_EXACT_LITERAL else None
    if np.issubdtype(c.dtype, np.floating) and np.isfinite(x):
        return real(float(x), c.dtype.name)
    return None


class Context:
    def __init__(self, graph: Graph, source: str, opset: int) -> None:
        self.graph = graph
        self.source = source
        self.opset = opset
        self.folded: dict[str, np.ndarray] = {}   # constants of any dtype (shape arithmetic); never uploaded
        # quantized values by what they were rounded from (roller.frontends.onnx.quantize.Rounded): a reader
        # of the integers computes its float from that instead, in a float kernel fusion can join to the producer
        self.rounded: dict[str, Any] = {}
        self._names: set[str] = set(graph.values)
        self._count = 0

    # -- errors ---------------------------------------------------------------------------------------------
    def where(self, node: onnx.NodeProto) -> str:
        return f"node {node.name!r} ({node.op_type})" if node.name else f"a {node.op_type} node"

    def error(self, node: onnx.NodeProto, message: str) -> InputError:
        return InputError(message, source=self.source, field=self.where(node))

    # -- reading ----------------------------------------------------------------------------------------------
    def value(self, name: str) -> Value:
        return self.graph.values[name]

    def has(self, node: onnx.NodeProto, i: int) -> bool:
        """Whether optional input ``i`` is given."""
        return len(node.input) > i and node.input[i] != ""

    def const(self, name: str) -> np.ndarray | None:
        """The constant value of ``name`` (a weight or a folded value), or None when it is computed."""
        if name in self.folded:
            return self.folded[name]
        return self.graph.constants.get(name)

    def const_input(self, node: onnx.NodeProto, i: int, what: str) -> np.ndarray:
        """Input ``i``, which must be a constant (shapes, axes, pads...)."""
        if not self.has(node, i):
            raise self.error(node, f"input {i} ({what}) is missing")
        c = self.const(node.input[i])
        if c is None:
            raise NeedsConstant(f"input {i} ({what}) must be a constant known at import; here it is "
                                f"{'an input' if node.input[i] in self.graph.inputs else 'computed by the model'}"
                                " (dynamic shapes are not supported yet)", node.input[i], source=self.source,
                                field=self.where(node))
        return c

    def attr(self, node: onnx.NodeProto, name: str, default: Any = None) -> Any:
        for a in node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def text(self, node: onnx.NodeProto, name: str, default: str) -> str:
        """A string attribute (ONNX stores them as bytes), ``default`` where the node has none."""
        v = self.attr(node, name, default)
        return v.decode() if isinstance(v, bytes) else str(v)

    def ints(self, node: onnx.NodeProto, name: str, default: Sequence[int] | None = None) -> list[int]:
        v = self.attr(node, name, default)
        return [int(x) for x in v] if v is not None else []

    def device_value(self, node: onnx.NodeProto, i: int) -> Value:
        """Input ``i`` as a value kernels read: a computed tensor, or a constant (uploaded as a weight)."""
        name = node.input[i]
        if name in self.graph.values:
            return self.graph.values[name]
        c = self.folded.get(name)
        if c is not None and (np.issubdtype(c.dtype, np.floating) or c.dtype.name in DEVICE_TYPES.values()):
            return self.graph.values[self.add_const(c, name)]
        raise self.error(node, f"input {i} ({name!r}) is a {self.dtype_name(name)} tensor; kernels read "
                               f"{', '.join(DEVICE_TYPES.values())} tensors")

    def element_type(self, name: str) -> str:
        """The element type a kernel holds ``name`` in: a value's own, a constant's as a weight keeps it."""
        c = self.const(name)
        return self.graph.values[name].dtype if c is None else held_type(c.dtype)

    def dtype_name(self, name: str) -> str:
        c = self.const(name)
        if c is not None:
            return str(c.dtype)
        return self.graph.values[name].dtype if name in self.graph.values else "unknown"

    # -- writing ----------------------------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        """A value name not used yet."""
        base = re.sub(r"[^A-Za-z0-9_.:/-]", "_", hint) or "v"
        name = base
        while name in self._names:
            self._count += 1
            name = f"{base}#{self._count}"
        self._names.add(name)
        return name

    def declare(self, name: str, shape: Sequence[int], dtype: str = "float32") -> str:
        self._names.add(name)
        self.graph.values[name] = Value(name, tuple(int(d) for d in shape), dtype)
        return name

    def add_const(self, array: np.ndarray, hint: str) -> str:
        """A weight the device holds (uploaded once per model)."""
        if hint in self.graph.constants and self.graph.constants[hint] is array:
            return hint
        name = hint if hint not in self._names else self.fresh(hint)
        kind = held_type(np.asarray(array).dtype)
        arr: np.ndarray = np.ascontiguousarray(array, dtype=dtype_of(kind).host)   # bfloat16's is float32: exact
        self.declare(name, arr.shape, kind)
        self.graph.constants[name] = arr
        return name

    def fold(self, name: str, array: np.ndarray) -> None:
        """``name`` is a constant known at import (not uploaded unless a kernel reads it)."""
        self._names.add(name)
        self.folded[name] = np.asarray(array)

    def kernel(self, node: onnx.NodeProto, text: str, inputs: Mapping[str, str], output: str,
               shape: Sequence[int], *, pad_value: float = 0.0, extents: Mapping[str, int] | None = None,
               kind: str | None = None, dtype: str | None = None) -> str:
        """A Roller operator: ``text`` in index notation over local tensor names (``inputs`` maps each to a
        value; the output is ``Y``); declares and returns ``output``. The output's dtype is ``dtype``, else
        that of the first input the model computes (ONNX ops keep their input type T), else float32."""
        shapes = {t: list(self.graph.values[v].shape) for t, v in inputs.items()}
        shapes["Y"] = [int(d) for d in shape]
        dtypes = {t: self.graph.values[v].dtype for t, v in inputs.items()}
        dtype = dtype or self._computed_type(inputs)
        dtypes["Y"] = dtype
        if 0 in shape:
            return self.empty(output, shape, dtype)
        kind = kind or node.op_type.lower()
        self._count += 1
        name = re.sub(r"[^a-z0-9]", "", kind) or "op"
        try:
            expr = build_expr(f"{name}_{self._count}", text, shapes, dtypes=dtypes, pad_value=pad_value,
                              extents=dict(extents or {}), kind=kind, where=Where(self.source, self.where(node)))
        except InputError as err:   # a translation that builds a bad expression is a bug: say which
            raise InputError(f"internal error translating it: {err.bare} [{text}]", source=self.source,
                             field=self.where(node)) from None
        order = [t.name for t in expr.inputs]
        self.declare(output, shape, dtype)
        self.graph.nodes.append(OpNode(node.name or node.op_type, expr, tuple(inputs[t] for t in order), output,
                                       self.where(node)))
        return output

    def _computed_type(self, inputs: Mapping[str, str]) -> str:
        computed = [self.graph.values[v].dtype for v in inputs.values() if v not in self.graph.constants]
        return computed[0] if computed else "float32"

    def empty(self, output: str, shape: Sequence[int], dtype: str) -> str:
        """``output``, a value with a zero dimension: known at import (no elements), so no step makes it; a
        reader of it alone is folded, a copy leaves it out, and an elementwise result is empty again."""
        arr: np.ndarray = np.zeros(tuple(int(d) for d in shape), dtype_of(dtype).host)
        self.fold(output, arr)
        self.declare(output, arr.shape, dtype)
        self.graph.constants[output] = arr
        return output

    def view(self, node: onnx.NodeProto, source: str, output: str, shape: Sequence[int]) -> str:
        src = self.graph.values[source]
        if 0 in shape:
            return self.empty(output, shape, src.dtype)
        self.declare(output, shape, src.dtype)
        self.graph.nodes.append(ViewNode(node.name or node.op_type, source, output, self.where(node)))
        return output

    def copy(self, node: onnx.NodeProto, pieces: Sequence[Piece], output: str, shape: Sequence[int]) -> str:
        dtype = self.graph.values[pieces[0].source].dtype
        if 0 in shape:
            return self.empty(output, shape, dtype)
        self.declare(output, shape, dtype)
        self.graph.nodes.append(CopyNode(node.name or node.op_type, tuple(pieces), output, self.where(node)))
        return output


def tensor_array(t: onnx.TensorProto) -> np.ndarray:
    return numpy_helper.to_array(t)
