"""Roller as an ONNX backend (``onnx.backend.base.Backend``), the ecosystem's standard way to plug a runtime in.

>>> import roller.compiler.onnx_backend as backend
>>> rep = backend.prepare(model, device="CPU", hw="pocl-cpu")      # doctest: +SKIP
>>> outputs = rep.run([x])                                         # doctest: +SKIP

``prepare`` compiles the model (``roller.compile_model``) and returns a ``RollerRep`` whose ``run`` takes the
inputs as a list (in the model's input order) or a dict and returns the outputs in order; ``rep.model`` is the
compiled ``roller.compiler.model.Model``. ``run_model`` and ``run_node`` prepare and run at once. Devices: ``CPU``
runs on this machine's OpenCL device (PoCL here) with any description's kernels; ``CUDA`` needs an NVIDIA GPU.

Roller compiles for static shapes. A model that leaves input sizes open, or takes inputs that a translation
needs as constants (the axes, shapes, pads or scales that ONNX lets a caller pass at run time), is therefore
compiled at its first ``run``: with the sizes of the arrays given, and with the values of those inputs folded
into the model as constants, as well as those of integer inputs of a type no kernel holds (int16, uint16,
uint32, uint64; ``specialize=False`` turns all this off: ``prepare`` then refuses such a model). A later run
with other sizes or other values of those inputs compiles again (each specialisation is kept), so the results
are always those of the values given. Integer and bool inputs that kernels read (token ids, masks) stay inputs:
new values compile nothing.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from roller.compiler.inputs import as_model
from roller.errors import InputError
from roller.frontends.onnx.context import NeedsConstant

#: the description used when ``prepare`` is not told one, per ONNX device kind
DEFAULT_HW = {"CPU": "pocl-cpu", "CUDA": "h100"}
#: the element types of inputs that are specialised (folded into the model at the first run): the integer types
#: no kernel holds
SPECIALISED_TYPES = frozenset({onnx.TensorProto.INT16, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32,
                               onnx.TensorProto.UINT64})


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The inputs a caller feeds (an initializer listed as an input is a weight with a default)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _is_static(inp: onnx.ValueInfoProto) -> bool:
    t = inp.type.tensor_type
    return t.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0 for d in t.shape.dim)


def _inputs_behind(model: onnx.ModelProto, name: str) -> list[str]:
    """The graph inputs whose values ``name`` is computed from (itself, where it is one): what to fold so that a
    translation that needs ``name`` as a constant (Pad's pads computed from an integer input) finds one."""
    inputs = {i.name for i in _graph_inputs(model)}
    producer = {o: n for n in model.graph.node for o in n.output}
    found: list[str] = []
    todo, seen = [name], set()
    while todo:
        v = todo.pop()
        if v in seen or not v:
            continue
        seen.add(v)
        if v in inputs:
            found.append(v)
        elif v in producer and producer[v].op_type not in ("Shape", "Size"):   # those read sizes, not values
            todo.extend(producer[v].input)
    return sorted(found)


def compile_checked(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None,
                    **options: Any) -> Any:
    """``roller.compile_model`` of ``proto``, refused (InputError) when a tensor has an element type the
    rendering backend does not declare: kernels of another type would be built from a plan that reads them
    wrongly (the OpenCL backend declares float32 and float16)."""
    from roller.compiler import compile_model
    from roller.compiler.target import Target
    from roller.frontends.onnx import import_model

    graph = import_model(proto, shapes)
    rest = {k: v for k, v in options.items() if k not in ("hw", "backend")}
    target = Target.resolve(options.get("hw"), options.get("backend"))
    be = target.backend
    odd = sorted({v.dtype for v in graph.values.values()} - set(be.dtypes))
    if odd:
        first = next(v for v in graph.values.values() if v.dtype in odd)
        raise InputError(f"the model computes {', '.join(odd)} tensors (e.g. {first.name!r}); the {be.name} backend "
                         f"renders {', '.join(be.dtypes)} only", source=graph.name)
    model = compile_model(graph, target, **rest)
    model.source = None if shapes else proto   # onnxruntime checks the model as given
    return model


def _as_host(array: np.ndarray) -> np.ndarray:
    """numpy types Roller's executor takes: bfloat16 (ml_dtypes) arrays as float32, which is exact and is how
    Roller holds bfloat16 on the host."""
    return array.astype(np.float32) if array.dtype.name == "bfloat16" else array


class RollerRep(BackendRep):
    """A prepared model: compiled now, or at the first run when it needs the inputs (see the module doc)."""

    def __init__(self, proto: onnx.ModelProto, model: Any = None, options: Mapping[str, Any] | None = None) -> None:
        """``model``: compiled already; without it the model compiles at each run's new inputs, with
        ``options`` (``compile_checked``'s keywords)."""
        self._proto = proto
        self._deferred = model is None
        self.model = model  # the roller.compiler.model.Model of the latest run (None until one is compiled)
        self._options = dict(options or {})
        self._compiled: dict[bytes, Any] = {}
        self.input_names = [i.name for i in _graph_inputs(proto)] if model is None else list(model.input_names)
        self._specialised = [i.name for i in _graph_inputs(proto)
                             if i.type.tensor_type.elem_type in SPECIALISED_TYPES] if model is None else []
        self._out_types = {o.name: o.type.tensor_type.elem_type for o in proto.graph.output}

    @property
    def specialised_inputs(self) -> list[str]:
        """The inputs whose values are folded into the model at each run: the integer and boolean ones, and those
        a translation needs as constants (known after the first run)."""
        return list(self._specialised)

    def _feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        names = self.input_names
        if isinstance(inputs, Mapping):
            feeds = {k: np.asarray(v) for k, v in inputs.items()}
        elif not isinstance(inputs, (np.ndarray, list, tuple)):
            raise InputError(f"run() takes the inputs as a list, a tuple or a dict by name ({', '.join(names)}); "
                             f"got {type(inputs).__name__}")
        else:
            arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            if len(arrays) != len(names):
                raise InputError(f"the model takes {len(names)} inputs ({', '.join(names)}), got {len(arrays)}")
            feeds = {n: np.asarray(a) for n, a in zip(names, arrays)}
        missing = [n for n in names if n not in feeds]
        if missing:
            raise InputError(f"missing input {', '.join(missing)}; the model takes {', '.join(names)}")
        return feeds

    def _key(self, feeds: Mapping[str, np.ndarray]) -> bytes:
        key = repr([(n, feeds[n].shape, str(feeds[n].dtype)) for n in self.input_names]).encode()
        return key + b"".join(np.ascontiguousarray(feeds[n]).tobytes() for n in self._specialised)

    def _specialise(self, feeds: Mapping[str, np.ndarray]) -> Any:
        """The compiled model for these inputs' sizes and specialised values (compiled once per distinct key).
        An input a translation needs as a constant (NeedsConstant: Resize's scales, Pad's value...) joins the
        specialised inputs, for this run and the later ones."""
        # an empty input (an empty axes list...) is no value a kernel reads: its (lack of) values are folded
        self._specialised.extend(n for n in self.input_names if feeds[n].size == 0 and n not in self._specialised)
        key = self._key(feeds)
        while key not in self._compiled:
            proto = onnx.ModelProto()
            proto.CopyFrom(self._proto)
            kept = [i for i in proto.graph.input if i.name not in self._specialised]
            del proto.graph.input[:]
            proto.graph.input.extend(kept)
            for n in self._specialised:
                proto.graph.initializer.append(numpy_helper.from_array(np.asarray(feeds[n]), n))
            shapes = {n: list(feeds[n].shape) for n in self.input_names if n not in self._specialised}
            try:
                model = compile_checked(proto, shapes, **self._options)
            except NeedsConstant as err:
                new = [n for n in _inputs_behind(self._proto, err.name) if n not in self._specialised]
                if not new:
                    raise
                self._specialised.extend(new)
                key = self._key(feeds)
                continue
            self._compiled[key] = model
        return self._compiled[key]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        feeds = self._feeds(inputs)
        if self._deferred:
            self.model = self._specialise(feeds)
        model = self.model
        out = model.run({n: _as_host(feeds[n]) for n in model.input_names})
        results = []
        for n in model.output_names:
            y = out[n]
            if self._out_types.get(n) == onnx.TensorProto.BFLOAT16:
                y = y.astype(onnx.helper.tensor_dtype_to_np_dtype(onnx.TensorProto.BFLOAT16))
            results.append(y)
        return namedtupledict("Outputs", model.output_names)(*results)


class RollerBackend(Backend):
    @classmethod
    def supports_device(cls, device: str) -> bool:
        from roller.backends import get

        try:
            kind = "CUDA" if Device(device).type == DeviceType.CUDA else "CPU"
        except Exception:  # noqa: BLE001 - onnx raises its own errors for a malformed device string
            return False
        return get("opencl" if kind == "CPU" else "cuda").can_run_here()

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> RollerRep:
        """Compile ``model``; keywords: ``hw`` (a description, default pocl-cpu for CPU), ``backend``,
        ``shapes``, ``specialize`` (default True: integer inputs and open sizes are settled at the first run)
        and the rest of ``roller.compile_model``'s."""
        if not isinstance(model, onnx.ModelProto):   # the backend API takes a ModelProto; a path or bytes too
            model = as_model(model).proto
        try:
            kind = "CUDA" if Device(device).type == DeviceType.CUDA else "CPU"
        except (AttributeError, TypeError, ValueError):
            raise InputError(f"device {device!r}: expected 'CPU' or 'CUDA' (onnx.backend's device names)",
                             field="device") from None
        hw = kwargs.pop("hw", DEFAULT_HW[kind])
        backend = kwargs.pop("backend", "opencl" if kind == "CPU" else "cuda")
        specialize = bool(kwargs.pop("specialize", True))
        try:
            super().prepare(model, device, **kwargs)   # onnx.checker
        except onnx.checker.ValidationError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else "invalid"
            raise InputError(f"invalid ONNX model: {first}", source=model.graph.name or "<model>") from None
        options = {"hw": hw, "backend": backend, **kwargs}
        inputs = _graph_inputs(model)
        given = set(kwargs.get("shapes") or {})
        deferred = [i.name for i in inputs if i.type.HasField("tensor_type") and
                    (i.type.tensor_type.elem_type in SPECIALISED_TYPES or
                     (not _is_static(i) and i.name not in given))]
        shapes = options.pop("shapes", None)
        if not (deferred and specialize):
            try:
                return RollerRep(model, compile_checked(model, shapes, **options))
            except NeedsConstant as err:
                if not specialize or not _inputs_behind(model, err.name):
                    raise
        return RollerRep(model, options=options)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None, **kwargs: Any) -> tuple[Any, ...]:
        """One node run as a one-node model (its inputs' shapes and types from ``inputs``)."""
        arrays = list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs)
        names = [i for i in node.input]
        if len(arrays) != len([n for n in names if n]):
            raise InputError(f"{node.op_type} takes {len(names)} inputs, got {len(arrays)}")
        given = [n for n in names if n]
        graph_inputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype),
                                                           a.shape) for n, a in zip(given, arrays)]
        outs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o]
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        model = onnx.helper.make_model(onnx.helper.make_graph([node], "node", graph_inputs, outs),
                                       opset_imports=[onnx.helper.make_opsetid("", opset)])
        model = onnx.shape_inference.infer_shapes(model)
        return cls.run_model(model, dict(zip(given, arrays)), device, **kwargs)


prepare = RollerBackend.prepare
run_model = RollerBackend.run_model
run_node = RollerBackend.run_node
supports_device = RollerBackend.supports_device
