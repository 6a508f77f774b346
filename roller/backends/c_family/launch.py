"""launch.json: what host code needs to call a generated C-family kernel."""
from __future__ import annotations

from typing import Any

import numpy as np

from roller.backends.c_family.plan import KernelPlan
from roller.dtypes import dtype
from roller.program import RProgram, pad_value_json


def launch_json(prog: RProgram, plan: KernelPlan, backend: str) -> dict[str, Any]:
    """Grid, block, and the arguments in order. An input read from a padded copy (``RProgram.pads``) says so:
    its ``shape`` is the padded buffer's, ``pad`` gives the tensor's own shape, the padding before and after
    each dimension and the value around it (the launchers here pad host arrays themselves)."""
    expr = prog.expr
    src = expr.source or expr
    pads = prog.pads

    def argument(name: str, shape: tuple[int, ...], dtype: str) -> dict[str, Any]:
        arg: dict[str, Any] = {"name": name, "role": "input", "shape": list(shape), "dtype": dtype}
        if name in pads:
            arg["pad"] = {"shape": list(src.tensor(name).storage_shape), "before": [b for b, _ in pads[name]],
                          "after": [a for _, a in pads[name]], "value": pad_value_json(src.pad_value)}
        return arg

    return {
        "kernel": plan.name,
        "backend": backend,
        "grid": [prog.grid, 1, 1],
        "block": [prog.block, 1, 1],
        "global_size": [prog.grid * prog.block, 1, 1],
        "shared_bytes": plan.smem_bytes,
        "arguments": [argument(t.name, t.storage_shape, t.dtype) for t in expr.inputs]
        + [{"name": expr.output.name, "role": "output", "shape": list(expr.output.storage_shape),
            "dtype": expr.output.dtype}],
        "rprogram": prog.line(),
        # int arguments after the buffers, with the value the grid above is for (RProgram.runtime: the symbol's
        # value; a launch at another value takes another grid, roller.construction.symbol_args)
        "scalars": [{"name": name, "type": "int", "value": runtime_value(prog)} for name in plan.scalars],
    }


def runtime_value(prog: RProgram) -> int:
    """The symbol's value ``prog.expr`` is at, for a program with runtime extents (each such axis runs to
    factor times it)."""
    values = {prog.expr.axis(a).extent // f for a, f in prog.runtime}
    if len(values) != 1 or any(prog.expr.axis(a).extent % f for a, f in prog.runtime):
        raise ValueError(f"{prog.expr.name}: runtime axes {prog.runtime} disagree on the symbol's value")
    return values.pop()


def padded_inputs(launch: dict[str, Any], inputs: list[Any]) -> list[Any]:
    """Host inputs in a launch's argument order, each input its launch.json ``pad`` asks for padded (a copy
    with the pad value around the tensor); the others as given."""
    from roller.program import pad_input

    out: list[Any] = []
    for spec, arr in zip([a for a in launch["arguments"] if a["role"] == "input"], inputs):
        pad = spec.get("pad")
        if pad is not None and tuple(getattr(arr, "shape", ())) == tuple(pad["shape"]):
            host: np.ndarray = np.asarray(arr, dtype=dtype(spec.get("dtype", "float32")).host)
            arr = pad_input(host, tuple(zip(pad["before"], pad["after"])), float(pad["value"]))
        out.append(arr)
    return out
