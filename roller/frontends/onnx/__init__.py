"""ONNX import (opsets 11 to the onnx package's newest) on the ``onnx`` package: ``import_model(model, shapes=None)``.

Translations live by kind of op: ``elementwise`` (arithmetic with broadcasting, activations), ``nn``
(convolutions, matrix products, pooling, reductions), ``normalize`` (softmax and the normalisations),
``tensor`` (views, copies, transposes, padding, resizing), ``attention`` and ``losses``; ``rewrite`` folds batch norms into
convolutions first.
"""
from __future__ import annotations

from roller.frontends.onnx import attention, elementwise, losses, nn, normalize, tensor  # noqa: F401 - they register
from roller.frontends.onnx.context import TRANSLATORS
from roller.frontends.onnx.importer import ModelLike, import_model, load_model

__all__ = ["TRANSLATORS", "ModelLike", "import_model", "load_model", "supported_ops"]


def supported_ops() -> list[str]:
    """The ONNX op types (default domain) the importer translates."""
    return sorted(TRANSLATORS)
