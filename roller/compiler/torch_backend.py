"""PyTorch's front door: ``torch.compile(module, backend="roller")`` and ``roller.compile_model(module,
example_inputs=...)``.

A graph reaches Roller as ONNX, through PyTorch's own exporter (``torch.onnx.export(..., dynamo=True)``: the
one that exports ViT and Swin, with integer inputs and outputs kept), then goes the way of an ONNX file. Under
``torch.compile`` the graph is one of dynamo's subgraphs, whose module state (parameters and buffers) arrives as
inputs: it is bound into the exported model as constants, so that Roller folds and lays out the weights as it
does a file's, and a call whose state has changed since (an optimiser step, ``load_state_dict``) builds again.
A subgraph Roller refuses (an operator it does not support, a size left open, a tensor on another device, a
gradient wanted) runs in eager PyTorch, with one warning saying why; the rest of the module still runs here.
Inference only: Roller's results carry no autograd history.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from roller.compiler.torch_export import export_onnx, import_torch
from roller.errors import InputError, RollerError

# The options ``torch.compile(..., options={...})`` passes on, and their meaning in ``roller.compile_model``.
OPTIONS = ("hw", "backend", "top_k", "fuse", "evaluate", "cache")


class EagerFallbackWarning(UserWarning):
    """A graph handed to Roller runs in eager PyTorch instead; the message says why."""


def _state_slots(gm: Any) -> list[int]:
    """Positions of ``gm``'s inputs that are module state (parameters and buffers), as dynamo records where
    each input came from."""
    slots = []
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(places):
        arg = node.meta.get("grapharg")
        name = arg.source.name if arg is not None and getattr(arg, "source", None) is not None else ""
        if "._parameters[" in name or "._buffers[" in name:
            slots.append(i)
    return slots


def _bound(gm: Any, state: dict[int, Any], count: int) -> Any:
    """``gm`` with its module state fixed: an nn.Module whose inputs are the rest, and whose state ONNX export
    writes as initializers."""
    module: Any = import_torch().nn.Module

    class Bound(module):
        def __init__(self) -> None:
            super().__init__()
            self.gm = gm
            for i, t in state.items():
                self.register_buffer(f"state_{i}", t.detach())

        def forward(self, *given: Any) -> Any:
            rest = iter(given)
            return self.gm(*[getattr(self, f"state_{i}") if i in state else next(rest) for i in range(count)])

    return Bound().eval()


def _output_count(gm: Any) -> int | None:
    """How many values ``gm`` returns, where it returns a flat tuple or list of them."""
    out = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if out is None or not out.args or not isinstance(out.args[0], (tuple, list)):
        return None
    return len(out.args[0])


class TorchGraph:
    """A graph of torch tensors built by Roller for one description: called with its (non-state) inputs as
    torch tensors, it returns what the graph returns, as torch tensors."""

    def __init__(self, module: Any, example_inputs: Sequence[Any], options: Mapping[str, Any],
                 state: dict[int, Any] | None = None) -> None:
        from roller.compiler import compile_model

        self.state = state or {}
        self._stamp = self._stamps()
        self.count = len(example_inputs)
        given = [x for i, x in enumerate(example_inputs) if i not in self.state]
        target = _bound(module, self.state, self.count) if self.state else module
        self.model = compile_model(export_onnx(target, given), **options)
        self.names = list(self.model.input_names)
        if len(self.names) != len(given):
            raise InputError(f"the exported graph takes {len(self.names)} inputs where the module takes "
                             f"{len(given)} (an input the graph does not read)")
        returned = _output_count(module) if hasattr(module, "graph") else None
        if returned is not None and returned != len(self.model.output_names):
            raise InputError(f"the graph returns {returned} values, its ONNX export {len(self.model.output_names)} "
                             "(a value that is not a tensor)")

    def _stamps(self) -> list[tuple[int, int]]:
        return [(t.data_ptr(), t._version) for t in self.state.values()]

    def stale(self) -> bool:
        """Whether the module state bound in has changed since the build (an optimiser step)."""
        return self._stamps() != self._stamp

    def __call__(self, *args: Any) -> Any:
        torch = import_torch()
        feeds = {}
        rest = [a for i, a in enumerate(args) if i not in self.state]
        for name, x in zip(self.names, rest):
            feeds[name] = x.detach().contiguous().numpy()
        out = self.model.run(feeds)
        return tuple(torch.from_numpy(np.ascontiguousarray(out[n])) for n in self.model.output_names)


def _options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    given = dict(options or {})
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise InputError(f"unknown option {unknown[0]!r} for backend='roller' (options: {', '.join(OPTIONS)})",
                         field=f"options.{unknown[0]}")
    given.setdefault("progress", False)
    return given


def dynamo_backend(gm: Any, example_inputs: list[Any], options: Mapping[str, Any] | None = None,
                   mode: str | None = None) -> Callable[..., Any]:
    """The ``torch.compile`` backend "roller" (registered in the package's ``torch_dynamo_backends`` entry
    points): ``gm``'s graph built by Roller, or ``gm`` itself, with one EagerFallbackWarning, where Roller
    refuses it. ``options``: hw, backend, top_k, fuse, evaluate and cache, as ``roller.compile_model`` takes
    them (hw: the description; default this machine's)."""
    opts = _options(options)
    torch = import_torch()
    why = _refused(example_inputs, torch)
    if why is not None:
        return _eager(gm, why)
    slots = set(_state_slots(gm))
    try:
        return CompiledGraph(gm, TorchGraph(gm, example_inputs, opts, {i: example_inputs[i] for i in slots}),
                             slots, opts)
    except RollerError as err:
        return _eager(gm, str(err))


class CompiledGraph:
    """What the backend returns for a graph Roller built: called as dynamo calls the graph. ``graph`` is the
    build (a ``TorchGraph``), replaced when the module state bound into it has changed."""

    def __init__(self, gm: Any, graph: TorchGraph, slots: set[int], options: Mapping[str, Any]) -> None:
        self.gm, self.graph, self.slots, self.options = gm, graph, slots, options

    def __call__(self, *args: Any) -> Any:
        torch = import_torch()
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for i, a in enumerate(args) if i not in self.slots):
            return self.gm(*args)   # a gradient is wanted through an input: Roller's results carry none
        if self.graph.stale():   # built again around the state this call passes
            self.graph = TorchGraph(self.gm, args, self.options, {i: args[i] for i in self.slots})
        return self.graph(*args)


def _refused(example_inputs: Sequence[Any], torch: Any) -> str | None:
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            return (f"input {i} is a {type(x).__name__}: a size left open (Roller's PyTorch path takes fixed sizes; "
                    "torch.compile(..., dynamic=False) builds each size)")
        if x.device.type != "cpu":
            return f"input {i} is on {x.device} (Roller's PyTorch path takes CPU tensors)"
    return None


def _eager(gm: Any, why: str) -> Callable[..., Any]:
    short = why.split("; supported:")[0]   # an unsupported op's message lists every supported one
    warnings.warn(f"roller: this graph runs in eager PyTorch: {short}", EagerFallbackWarning, stacklevel=2)
    return gm.forward
