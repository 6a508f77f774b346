"""ONNX model -> ``roller.graph.Graph``.

The model is checked with ``onnx.checker``; inputs need static shapes (given in the model, or by ``shapes``);
nodes are translated in order (an ONNX graph is sorted): a node whose inputs are all known at import is
evaluated by ``onnx.reference`` instead, everything else by its translation (``TRANSLATORS``). Anything not
supported is one ``InputError`` naming the node, its op type and what is supported (exit 2).
"""
from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from roller.dtypes import dtype as dtype_of
from roller.errors import InputError, printable
from roller.frontends.onnx.context import DEVICE_TYPES, FOLDERS, OPSETS, TRANSLATORS, Context, tensor_array
from roller.frontends.onnx.qdq import expand_contrib, qdq_to_qlinear
from roller.frontends.onnx.rewrite import drop_unused_outputs, fold_batchnorm, upgrade_opset
from roller.graph.ir import Graph
from roller.graph.passes import remove_dead

#: the largest model file read (protobuf's own limit is 2 GiB; external data is not supported)
MAX_MODEL_BYTES = 2**31 - 1
ModelLike = str | os.PathLike | onnx.ModelProto | bytes


def load_model(model: ModelLike) -> tuple[onnx.ModelProto, str]:
    """(ModelProto, name for messages) from a path, serialised bytes or a ModelProto."""
    proto, source, _ = read_model(model)
    return proto, source


def read_model(model: ModelLike) -> tuple[onnx.ModelProto, str, bytes | None]:
    """``load_model``'s (ModelProto, name), and the bytes it was parsed from (None for a ModelProto): the
    checker reads those instead of serialising the model again (0.7 s of BERT-base's import)."""
    if isinstance(model, onnx.ModelProto):
        return model, model.graph.name or "<model>", None
    if isinstance(model, bytes):
        return _parse(model, "<bytes>"), "<bytes>", model
    path = Path(os.fspath(model))
    try:
        if not stat.S_ISREG(path.stat().st_mode):   # a FIFO would block the read forever, /dev/zero never end it
            raise InputError("not a regular file", source=str(path))
        size = path.stat().st_size
        if size > MAX_MODEL_BYTES:
            raise InputError(f"model file is {size} bytes; at most {MAX_MODEL_BYTES} are read", source=str(path))
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError("no such model file", source=str(path)) from None
    except (IsADirectoryError, PermissionError) as err:
        raise InputError(f"cannot read the model: {err.__class__.__name__}", source=str(path)) from None
    return _parse(data, str(path)), str(path), data


def _parse(data: bytes, source: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as err:  # noqa: BLE001 - protobuf raises its own DecodeError and friends
        raise InputError(f"not an ONNX model ({err.__class__.__name__})", source=source) from None
    if not proto.graph.node and not proto.graph.output:
        raise InputError("not an ONNX model (no graph)", source=source)
    return proto


#: the element types a tensor in a model may hold (numpy_helper reads these; others are refused in one line)
_READABLE = frozenset(onnx.helper.get_all_tensor_dtypes())


def _check_tensors(g: onnx.GraphProto, source: str) -> None:
    """Refuse, naming it, every tensor of the graph (initializers, node attributes, subgraphs) that would be read
    from a file (external data: onnx reads it relative to the working folder, not the model's), that is sparse,
    or whose element type numpy cannot hold: each would otherwise be a traceback or another file's bytes."""
    if g.sparse_initializer:
        name = g.sparse_initializer[0].values.name
        raise InputError(f"sparse initializer {name!r}: sparse tensors are not supported", source=source)
    owners: list[tuple[str, onnx.TensorProto]] = [(f"initializer {t.name!r}", t) for t in g.initializer]
    for node in g.node:
        where = f"node {node.name or node.op_type!r} ({node.op_type}) attribute"
        for a in node.attribute:
            owners += [(f"{where} {a.name!r}", t) for t in ([a.t] if a.HasField("t") else []) + list(a.tensors)]
            if a.HasField("sparse_tensor") or a.sparse_tensors:
                raise InputError(f"{where} {a.name!r}: sparse tensors are not supported", source=source)
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _check_tensors(sub, source)
    for what, t in owners:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raise InputError(f"{what} keeps its data in an external file, which is not supported (and never read "
                             "from outside the model); save the model with the weights inside", source=source)
        if t.data_type not in _READABLE:
            raise InputError(f"{what} has element type {t.data_type}, which ONNX does not define", source=source)


def _check_declared(what: str, info: onnx.ValueInfoProto, init: onnx.TensorProto, source: str) -> None:
    """An initializer against the type and static shape its graph input declares (onnxruntime refuses a model
    where they disagree; taking either would silently run another model)."""
    t = info.type.tensor_type
    if not info.type.HasField("tensor_type"):
        return
    name = onnx.TensorProto.DataType.Name
    if t.elem_type and t.elem_type != init.data_type:
        raise InputError(f"{what} is declared {name(t.elem_type)}, its initializer holds {name(init.data_type)}",
                         source=source)
    if t.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if len(dims) != len(init.dims) or any(d is not None and d != s for d, s in zip(dims, init.dims)):
            shown = [d if d is not None else "?" for d in dims]
            raise InputError(f"{what} is declared with shape {shown}, its initializer has {list(init.dims)}",
                             source=source)


def import_model(model: ModelLike, shapes: Mapping[str, Sequence[int]] | None = None,
                 source: str | None = None, data: bytes | None = None) -> Graph:
    """The graph of ``model``; ``shapes`` gives (or overrides) input shapes by input name; ``source`` names a
    model given as a ModelProto in messages (the file it was read from), and gives an unnamed graph its name;
    ``data``, the bytes such a ModelProto was parsed from, spares serialising it again for the checker."""
    if source is not None and isinstance(model, onnx.ModelProto):
        proto = model
    else:
        proto, source, data = read_model(model)
    parsed = proto
    opset = _opset(proto, source)
    _check_tensors(proto.graph, source)   # before onnx.checker, which looks for external files itself
    if opset < OPSETS[0]:
        proto, opset = upgrade_opset(proto, opset, OPSETS[0], source), OPSETS[0]
    proto = drop_unused_outputs(expand_contrib(proto), opset)
    try:
        onnx.checker.check_model(data if data is not None and proto is parsed else proto)
    except onnx.checker.ValidationError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else "invalid"
        raise InputError(f"invalid ONNX model: {first}", source=source) from None
    proto = qdq_to_qlinear(fold_batchnorm(proto))
    g = proto.graph
    graph = Graph(name=printable(g.name or Path(source).stem or "model"))
    ctx = Context(graph, source, opset)
    for init in g.initializer:
        ctx.fold(init.name, tensor_array(init))
    inits = {t.name: t for t in g.initializer}
    for inp in g.input:
        if inp.name in inits:   # an initializer listed as an input (older exporters): a weight
            _check_declared(f"input {inp.name!r}", inp, inits[inp.name], source)
            continue
        graph.inputs.append(_input(ctx, inp, shapes or {}, source))
    unknown = set(shapes or {}) - set(graph.inputs)
    if unknown:
        raise InputError(f"--shape names no input of the model: {', '.join(sorted(unknown))} (inputs: "
                         f"{', '.join(graph.inputs)})", source=source)
    for node in g.node:
        if node.domain not in ("", "ai.onnx"):
            raise ctx.error(node, f"op domain {node.domain!r} is not supported (only the default ONNX domain)")
        given = [i for i in node.input if i]
        if all(ctx.const(i) is not None for i in given) and node.op_type not in NEVER_FOLD:
            own = FOLDERS.get(node.op_type)
            if own is not None:
                own(ctx, node)
            else:
                _fold(ctx, proto, node)
            continue
        fn = TRANSLATORS.get(node.op_type)
        if fn is None:
            raise ctx.error(node, f"op type {node.op_type} is not supported; supported: "
                                  f"{', '.join(sorted(TRANSLATORS))}")
        fn(ctx, node)
    for out in g.output:
        if out.name not in graph.values:
            c = ctx.folded.get(out.name)
            if c is None:
                raise InputError(f"output {out.name!r} is never computed", source=source)
            if not (np.issubdtype(c.dtype, np.floating) or c.dtype.name in DEVICE_TYPES.values()):
                raise InputError(f"output {out.name!r} is a constant {c.dtype} tensor; outputs are "
                                 f"{', '.join(DEVICE_TYPES.values())}", source=source)
            # A constant output keeps its own name (add_const would pick a fresh one: the name is taken) and its
            # type (float16 stays float16: what the caller gets back).
            kind = c.dtype.name if c.dtype.name in DEVICE_TYPES.values() else "float32"
            ctx.declare(out.name, c.shape, kind)
            graph.constants[out.name] = np.array(c, dtype=dtype_of(kind).host)   # a scalar stays rank 0
        declared = out.type.tensor_type.elem_type if out.type.HasField("tensor_type") else 0
        got = graph.values[out.name].dtype
        if declared in DEVICE_TYPES and DEVICE_TYPES[declared] != got:
            raise InputError(f"output {out.name!r} is declared {onnx.TensorProto.DataType.Name(declared)} but "
                             f"computed as {got} (onnxruntime refuses the model too)", source=source)
        graph.outputs.append(out.name)
    graph = remove_dead(graph)
    graph.check()
    return graph


#: ops that are never evaluated at import even with constant inputs (random, or a view of a weight: cheaper
#: to keep as a view than to copy)
NEVER_FOLD = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"})


def _opset(proto: onnx.ModelProto, source: str) -> int:
    version = None
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            version = imp.version
    if version is None:
        raise InputError("the model imports no default-domain opset", source=source)
    lo, hi = OPSETS
    if version > hi:
        raise InputError(f"opset {version} is newer than this onnx package knows (opsets up to {hi} are read); "
                         "upgrade onnx", source=source)
    if version < 1:
        raise InputError(f"opset {version} is not an opset (opsets {lo}-{hi} are read, older ones upgraded)",
                         source=source)
    return version


def _input(ctx: Context, inp: onnx.ValueInfoProto, shapes: Mapping[str, Sequence[int]], source: str) -> str:
    t = inp.type.tensor_type
    if not inp.type.HasField("tensor_type"):
        raise InputError(f"input {inp.name!r} is not a tensor", source=source)
    if t.elem_type not in DEVICE_TYPES:
        name = onnx.TensorProto.DataType.Name(t.elem_type)
        raise InputError(f"input {inp.name!r} has element type {name}; model inputs are "
                         f"{', '.join(DEVICE_TYPES.values())}", source=source)
    if inp.name in shapes:
        dims = [int(d) for d in shapes[inp.name]]
        if any(d <= 0 for d in dims):
            raise InputError(f"--shape {inp.name}: expected positive sizes, got {dims}", source=source)
        if t.HasField("shape") and len(t.shape.dim) != len(dims):
            raise InputError(f"--shape {inp.name}: the model's input has rank {len(t.shape.dim)}, got {dims}",
                             source=source)
    else:
        if not t.HasField("shape"):
            raise InputError(f"input {inp.name!r} has no shape in the model; give one with --shape "
                             f"{inp.name}=D0,D1,... (shapes={{...}} in Python)", source=source)
        dims = []
        for i, d in enumerate(t.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            else:
                what = f"'{d.dim_param}'" if d.HasField("dim_param") else "unknown"
                raise InputError(f"input {inp.name!r} dimension {i} is {what}; give static sizes with --shape "
                                 f"{inp.name}=D0,D1,... (shapes={{...}} in Python)", source=source)
    return ctx.declare(inp.name, dims, DEVICE_TYPES[t.elem_type])


def _numpy_fold(node: onnx.NodeProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    """The node's outputs by numpy where ONNX's reference implementation gets them wrong, else None: its
    GatherElements fails where the data is longer than the indices on the axis (BERT's token type ids,
    a [1, 512] buffer gathered at [1, 32] positions, as PyTorch's exporter writes it)."""
    if node.op_type != "GatherElements" or len(node.input) != 2 or any(i not in feeds for i in node.input):
        return None
    data, idx = feeds[node.input[0]], feeds[node.input[1]]
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    if data.ndim != idx.ndim or not -data.ndim <= axis < data.ndim or idx.dtype.kind not in "iu":
        return None
    axis %= data.ndim
    wrapped = np.where(idx < 0, idx + data.shape[axis], idx)
    if np.any(wrapped < 0) or np.any(wrapped >= data.shape[axis]) or \
            any(idx.shape[d] > data.shape[d] for d in range(data.ndim) if d != axis):
        return None   # the reference's own error names what is wrong
    trimmed = data[tuple(slice(0, n) if d != axis else slice(None) for d, n in enumerate(idx.shape))]
    return [np.take_along_axis(trimmed, wrapped, axis=axis)]


def _fold(ctx: Context, proto: onnx.ModelProto, node: onnx.NodeProto) -> None:
    """Evaluate a node whose inputs are all constants, with ONNX's reference implementation."""
    feeds: dict[str, np.ndarray] = {}
    for i in node.input:
        c = ctx.const(i) if i else None
        if c is not None:
            feeds[i] = c
    inputs = [onnx.helper.make_tensor_value_info(i, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for i, a in feeds.items()]
    outputs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o]
    model = onnx.helper.make_model(onnx.helper.make_graph([node], "fold", inputs, outputs),
                                   opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
    try:
        # ONNX defines log(0) = -inf and the like; numpy's warnings about them are not the user's business (T5's
        # relative position buckets take the log of a zero distance and discard it with Where).
        with np.errstate(all="ignore"):
            results = _numpy_fold(node, feeds) or ReferenceEvaluator(model).run(None, feeds)
    except Exception as err:  # noqa: BLE001 - the reference raises anything; the node is at fault
        raise ctx.error(node, f"evaluating it at import failed: {err.__class__.__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}") from None
    for name, value in zip([o for o in node.output if o], results):
        ctx.fold(name, np.asarray(value))
