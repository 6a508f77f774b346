"""launch.json: what host code needs to call a generated C-family kernel."""
from __future__ import annotations

from typing import Any

from roller.backends.c_family.plan import KernelPlan
from roller.program import RProgram


def launch_json(prog: RProgram, plan: KernelPlan, backend: str) -> dict[str, Any]:
    expr = prog.expr
    return {
        "kernel": plan.name,
        "backend": backend,
        "grid": [prog.grid, 1, 1],
        "block": [prog.block, 1, 1],
        "global_size": [prog.grid * prog.block, 1, 1],
        "shared_bytes": plan.smem_bytes,
        "arguments": [{"name": t.name, "role": "input", "shape": list(t.storage_shape), "dtype": t.dtype}
                      for t in expr.inputs]
        + [{"name": expr.output.name, "role": "output", "shape": list(expr.output.storage_shape),
            "dtype": expr.output.dtype}],
        "rprogram": prog.line(),
    }
