"""The element types Roller knows, in one table: name, bytes, kind, and the numpy types on each side of a kernel.

``host`` is the numpy type a user's array has and the reference computes in; ``storage`` is what a device
buffer holds. They differ for bfloat16, which numpy has no type for (users pass float32, and a backend that
stores bfloat16 passes the upper 16 bits of each float32, rounded to nearest even, as uint16), and for bool,
which a device holds as one byte, 0 or 1. ``kind`` says how a kernel computes with the type: floating-point
types in float32 (float64 in float64: a kernel that holds a float64 tensor computes every float value in float64,
on backends that have it), integer ones in their own width (wrapping on overflow, as ONNX and numpy do), bool as 0 or 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    itemsize: int
    host: type
    storage: type
    ops: bool  # an op's tensors may have it (the others appear only in descriptions' compute peaks)
    kind: str = "float"  # float | int | uint | bool

    @property
    def integral(self) -> bool:
        return self.kind != "float"

    def to_storage(self, array: np.ndarray) -> np.ndarray:
        """``array`` (of the host type) as a contiguous buffer of the storage type."""
        if self.name == "bfloat16":
            bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
            rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
            # a NaN stays a NaN, made quiet (rounding a NaN whose payload is in the low half would give infinity)
            nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
            return np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint16)
        return np.ascontiguousarray(array, dtype=self.storage)

    def from_storage(self, array: np.ndarray) -> np.ndarray:
        """A buffer of the storage type back as the host type."""
        if self.name == "bfloat16":
            return (np.asarray(array, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
        return np.asarray(array, dtype=self.host)


DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("float64", 8, np.float64, np.float64, ops=True),
    DType("float32", 4, np.float32, np.float32, ops=True),
    DType("float16", 2, np.float16, np.float16, ops=True),
    DType("bfloat16", 2, np.float32, np.uint16, ops=True),
    DType("int64", 8, np.int64, np.int64, ops=True, kind="int"),
    DType("int32", 4, np.int32, np.int32, ops=True, kind="int"),
    DType("int8", 1, np.int8, np.int8, ops=True, kind="int"),
    DType("uint8", 1, np.uint8, np.uint8, ops=True, kind="uint"),
    DType("bool", 1, np.bool_, np.uint8, ops=True, kind="bool"),
)}
#: what an op's tensors may be
OP_DTYPES = tuple(n for n, d in DTYPES.items() if d.ops)


def dtype(name: str) -> DType:
    """The table entry; KeyError for a name that is not in it."""
    return DTYPES[name]
