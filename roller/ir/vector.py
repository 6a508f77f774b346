"""How a thread's run of outputs along the vector axis becomes vectors on a CPU: one rule for the C-family
lowering (roller/backends/c_family/plan.py), the probe's register-tile kernels and the model's edge term."""
from __future__ import annotations

VECTOR_WIDTHS = (16, 8, 4, 2)  # the C-family vector types' sizes (3 is padded to 4 in memory: not useful here)


def vector_width(run: int) -> int:
    """The widest vector that divides a thread's run along the vector axis, or 0: the scalar loop."""
    return next((w for w in VECTOR_WIDTHS if run % w == 0), 0)
