"""Roller as an ONNX backend (``onnx.backend.base.Backend``), the ecosystem's standard way to plug a runtime in.

>>> import roller.onnx_backend as backend
>>> rep = backend.prepare(model, device="CPU", hw="pocl-cpu")      # doctest: +SKIP
>>> outputs = rep.run([x])                                         # doctest: +SKIP

``prepare`` compiles the model (``roller.compile_model``) and returns a ``RollerRep`` whose ``run`` takes the
inputs as a list (in the model's input order) or a dict and returns the outputs in order; ``rep.model`` is the
compiled ``roller.models.Model``. ``run_model`` and ``run_node`` prepare and run at once. Devices: ``CPU``
runs on this machine's OpenCL device (PoCL here) with any description's kernels; ``CUDA`` needs an NVIDIA GPU.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from roller.errors import InputError

#: the description used when ``prepare`` is not told one, per ONNX device kind
DEFAULT_HW = {"CPU": "pocl-cpu", "CUDA": "h100"}


class RollerRep(BackendRep):
    def __init__(self, model: Any) -> None:
        self.model = model

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        names = self.model.input_names
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            if len(arrays) != len(names):
                raise InputError(f"the model takes {len(names)} inputs ({', '.join(names)}), got {len(arrays)}")
            feeds = dict(zip(names, arrays))
        out = self.model.run(feeds)
        return namedtupledict("Outputs", self.model.output_names)(*[out[n] for n in self.model.output_names])


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
        ``shapes`` and the rest of ``roller.compile_model``'s."""
        from roller.models import compile_model

        kind = "CUDA" if Device(device).type == DeviceType.CUDA else "CPU"
        hw = kwargs.pop("hw", DEFAULT_HW[kind])
        backend = kwargs.pop("backend", "opencl" if kind == "CPU" else "cuda")
        super().prepare(model, device, **kwargs)
        return RollerRep(compile_model(model, hw=hw, backend=backend, **kwargs))

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
