"""Roller: construct tensor kernels from a hardware description instead of searching for them.

Public API: ``roller.reference(op, inputs)``, ``roller.construct(op, hw, top_k)``,
``roller.compile(op, hw=...)``, ``roller.compile_model(model, hw=...)``, ``roller.load(folder)`` (what
``roller build`` wrote), ``roller.Target``; heavier modules are imported on first use so that ``import roller``
stays fast.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "reference": ("roller.ir.reference", "reference"),
    "random_inputs": ("roller.ir.reference", "random_inputs"),
    "load_ops": ("roller.ir", "load_ops"),
    "load_op": ("roller.ir", "load_op"),
    "construct": ("roller.compiler", "construct"),
    "compile": ("roller.compiler", "compile"),
    "compile_model": ("roller.compiler", "compile_model"),
    "load": ("roller.compiler", "load"),
    "Target": ("roller.compiler.target", "Target"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'roller' has no attribute {name!r}")


__all__ = ["Target", "__version__", "compile", "compile_model", "construct", "load", "load_op", "load_ops",
           "random_inputs", "reference"]
