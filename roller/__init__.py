"""Roller: construct tensor kernels from a hardware description instead of searching for them.

Public API: ``roller.reference(op, inputs)``, ``roller.construct(op, hw, top_k)``, ``roller.compile(op, hw=...)``;
heavier modules are imported on first use so that ``import roller`` stays fast.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "reference": ("roller.numpy_reference", "reference"),
    "random_inputs": ("roller.numpy_reference", "random_inputs"),
    "load_ops": ("roller.ir", "load_ops"),
    "load_op": ("roller.ir", "load_op"),
    "construct": ("roller.api", "construct"),
    "compile": ("roller.api", "compile"),
    "compile_model": ("roller.models", "compile_model"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'roller' has no attribute {name!r}")


__all__ = ["__version__", "compile", "compile_model", "construct", "load_op", "load_ops", "random_inputs",
           "reference"]
