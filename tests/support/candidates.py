"""Every candidate of an op, as construction ranks them, run for real on this machine's OpenCL device."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

import roller
from roller.backends import Artifact, get, ordered_inputs
from roller.hw import load
from roller.program import RProgram


def opencl_candidates(op: dict[str, Any], hw: str, x: dict[str, np.ndarray],
                      top_k: int) -> Iterator[tuple[RProgram, Artifact, np.ndarray]]:
    """Each of ``op``'s top-K programs for the description ``hw``, rendered by the OpenCL backend and run with
    the inputs ``x``: (program, artifact, output in the op's shape)."""
    cl, desc = get("opencl"), load(hw)
    shape = roller.load_op(op).output.shape
    for prog in roller.construct(op, hw, top_k=top_k, backend="opencl"):
        art = cl.render(prog, desc)
        yield prog, art, cl.compile(art, desc, None)(ordered_inputs(art.launch, x)).reshape(shape)
