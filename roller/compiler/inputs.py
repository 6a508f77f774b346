"""What the user gave, read once and named by its kind: ``load_input(x)`` is an ``OpInput`` (ops at fixed
sizes), a ``SymbolicInput`` (one op with symbolic sizes), a ``ModelInput`` (an ONNX model or a graph) or a
``BuiltInput`` (a folder ``roller build`` wrote). ``roller.compile``, ``roller.compile_model``, ``roller.load``
and the ``build``, ``run`` and ``compare`` commands dispatch on the kind, so that no file is read twice.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from roller.errors import InputError, printable
from roller.graph.ir import Graph
from roller.ir.opfile import parse_ops, read_op_file
from roller.ir.symbolic import SymbolicOp, parse_symbolic
from roller.ir.tensor_expr import TensorExpr

#: file suffixes read as models, not op files
MODEL_SUFFIXES = (".onnx",)


@dataclass(frozen=True)
class OpInput:
    ops: list[TensorExpr]
    source: str | None = None


@dataclass(frozen=True)
class SymbolicInput:
    op: SymbolicOp
    source: str | None = None


@dataclass(frozen=True)
class ModelInput:
    proto: Any = None  # onnx.ModelProto, or None for a graph given as it is
    graph: Graph | None = None
    source: str | None = None  # the file it was read from, for messages and the graph's name
    data: bytes | None = None  # the bytes ``proto`` was parsed from, for the ONNX checker (None: not kept)

    @property
    def name(self) -> str:
        if self.graph is not None:
            return self.graph.name
        return printable(str(self.proto.graph.name or (Path(self.source).stem if self.source else "model")))


@dataclass(frozen=True)
class BuiltInput:
    folder: Path
    kind: str  # "kernel", "kernel set" or "model" (roller.compiler.artifact)


Input = OpInput | SymbolicInput | ModelInput | BuiltInput


def is_model_path(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() in MODEL_SUFFIXES


def load_input(x: Any) -> Input:
    """``x`` read once and named by its kind: a TensorExpr or op dict, an op file, an ONNX file, bytes or
    ModelProto, a ``roller.graph.Graph``, or a folder written by ``roller build``. InputError (exit 2) names the
    file and what is wrong with it."""
    if isinstance(x, TensorExpr):
        return OpInput([x])
    if isinstance(x, Graph):
        return ModelInput(graph=x)
    if isinstance(x, bytes) or _is_proto(x):
        from roller.frontends.onnx import load_model

        proto, _ = load_model(x)
        return ModelInput(proto=proto)
    if isinstance(x, dict):
        sym = parse_symbolic(x, None)
        return SymbolicInput(sym) if sym is not None else OpInput(parse_ops(x, None))
    if not isinstance(x, (str, os.PathLike)):
        raise InputError(f"expected an op (dict, TensorExpr or op.json path), an ONNX model (path, bytes or "
                         f"ModelProto), a roller.graph.Graph or a build folder, got {type(x).__name__}")
    path = Path(x)
    if path.is_dir():
        from roller.compiler.artifact import kind_of

        return BuiltInput(path, kind_of(path))
    if is_model_path(path):
        from roller.frontends.onnx import load_model

        proto, source = load_model(path)
        return ModelInput(proto=proto, source=source)
    doc, source = read_op_file(path)
    sym = parse_symbolic(doc, source)
    return SymbolicInput(sym, source) if sym is not None else OpInput(parse_ops(doc, source), source)


def as_model(x: Any) -> ModelInput:
    """``x`` read as a model whatever its name: a path (any suffix), bytes, a ModelProto, a Graph, or a
    ModelInput already read."""
    if isinstance(x, ModelInput):
        return x
    if isinstance(x, Graph):
        return ModelInput(graph=x)
    if not (isinstance(x, (str, os.PathLike, bytes)) or _is_proto(x)):
        raise InputError(f"expected a model: an ONNX file's path, its bytes, an onnx.ModelProto or a "
                         f"roller.graph.Graph; got {type(x).__name__}")
    from roller.frontends.onnx.importer import read_model

    proto, source, data = read_model(x)
    return ModelInput(proto=proto, source=source if isinstance(x, (str, os.PathLike)) else None, data=data)


def checked_shapes(shapes: Any, proto: Any) -> dict[str, list[int]] | None:
    """``shapes`` (input name -> its sizes, each a positive integer) checked against ``proto``'s inputs: a
    one-line InputError for anything else (a float or bool size would otherwise be truncated or taken as 1)."""
    if shapes is None:
        return None
    if not isinstance(shapes, Mapping):
        raise InputError(f"expected input names mapped to their sizes ({{'x': [1, 3, 224, 224]}}), got "
                         f"{type(shapes).__name__}", field="shapes")
    inits = {i.name for i in proto.graph.initializer}
    inputs = [i.name for i in proto.graph.input if i.name not in inits]
    out: dict[str, list[int]] = {}
    for name, dims in shapes.items():
        if name not in inputs:
            raise InputError(f"{name!r} is not an input of the model (inputs: {', '.join(inputs)})",
                             field=f"shapes.{name}")
        if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence) or \
                not all(isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) and d > 0
                        for d in dims):
            raise InputError(f"expected a list of positive integer sizes, got {dims!r}", field=f"shapes.{name}")
        out[str(name)] = [int(d) for d in dims]
    return out


def _is_proto(x: Any) -> bool:
    return type(x).__name__ == "ModelProto" and hasattr(x, "graph")
