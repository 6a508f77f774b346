"""A ``torch.nn.Module`` as an ONNX model, by PyTorch's own exporter: what ``roller.compile_model`` does with a
module, and what the ``torch.compile`` backend (``roller.compiler.torch_backend``) does with each graph."""
from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from typing import Any

from roller.errors import InputError


def import_torch() -> Any:
    """The torch module; a one-line InputError where PyTorch is not installed."""
    try:
        import torch
    except ImportError:
        raise InputError("PyTorch is not installed: pip install 'roller[torch]'") from None
    return torch


def is_torch_module(x: Any) -> bool:
    """Whether ``x`` is a ``torch.nn.Module`` (without importing torch where the caller never did)."""
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.nn.Module)


def export_onnx(module: Any, example_inputs: Sequence[Any]) -> bytes:
    """``module`` called on ``example_inputs`` as an ONNX model (bytes), by PyTorch's dynamo exporter; a
    one-line InputError where it cannot be exported."""
    torch = import_torch()
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise InputError(f"example input {i} is a {type(x).__name__}: Roller takes tensors only",
                             field=f"example_inputs[{i}]")
        if x.device.type != "cpu":
            raise InputError(f"example input {i} is on {x.device}: Roller takes CPU tensors",
                             field=f"example_inputs[{i}]")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(module, tuple(example_inputs), dynamo=True, verbose=False)
    except Exception as err:  # noqa: BLE001 - the exporter raises many kinds; each means no ONNX form
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise InputError(f"torch.onnx.export failed: {first[:300]}") from None
    buf = io.BytesIO()
    import onnx

    onnx.save_model(program.model_proto, buf)
    return buf.getvalue()
