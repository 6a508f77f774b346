"""A constant input stored in another layout than the one its operator reads: what construction chooses
(``roller.construction.layout``) and the graph's weight packing applies. It lives in the IR so that both layers
share it without importing each other."""
from __future__ import annotations

import dataclasses

import numpy as np

from roller.ir.tensor_expr import TensorExpr


@dataclasses.dataclass(frozen=True)
class PackedLayout:
    """``expr`` reads ``tensor`` stored as ``numpy.transpose(weights, perm)``, with ``axis`` as its last
    spatial axis (the CPU kernels' vector axis). Blocked (``block`` > 0): the weights' dimension ``split`` is
    first split into (``size / block``, ``block``) and ``perm`` orders the dimensions after the split."""
    expr: TensorExpr
    tensor: str
    perm: tuple[int, ...]
    axis: str
    split: int = 0
    block: int = 0

    def apply(self, weights: np.ndarray) -> np.ndarray:
        """The weights in this layout."""
        if self.block:
            shape = weights.shape
            d = self.split
            weights = weights.reshape(shape[:d] + (shape[d] // self.block, self.block) + shape[d + 1:])
        return np.ascontiguousarray(np.transpose(weights, self.perm))

    @property
    def tag(self) -> str:
        """A short name of the layout (for the packed constant's name)."""
        return (f"b{self.block}." if self.block else "") + "".join(map(str, self.perm))
