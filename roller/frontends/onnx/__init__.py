"""ONNX import (opsets 11 to the onnx package's newest) on the ``onnx`` package: ``import_model(model, shapes=None)``.

Translations live by kind of op: ``elementwise`` (arithmetic with broadcasting, activations, casts), ``logic``
(comparisons, bool logic, Where, Mod), ``nn`` (convolutions, matrix products, pooling, reductions),
``normalize`` (softmax and the normalisations), ``tensor`` (views, copies, transposes, padding, resizing),
``positions`` (CumSum, ArgMax/ArgMin, Trilu, TopK), ``scatter`` (ScatterND, ScatterElements), ``quantize``
(QuantizeLinear, DequantizeLinear and the integer operators), ``attention`` and ``losses``; ``rewrite`` folds
batch norms into convolutions first, ``qdq`` turns a QDQ model's quantized products into integer operators.
"""
from __future__ import annotations

from roller.frontends.onnx import (  # noqa: F401 - they register
    attention,
    elementwise,
    logic,
    losses,
    nn,
    normalize,
    positions,
    quantize,
    scatter,
    tensor,
)
from roller.frontends.onnx.context import TRANSLATORS
from roller.frontends.onnx.importer import ModelLike, import_model, load_model

__all__ = ["TRANSLATORS", "ModelLike", "import_model", "load_model", "supported_ops"]


def supported_ops() -> list[str]:
    """The ONNX op types (default domain) the importer translates."""
    return sorted(TRANSLATORS)
