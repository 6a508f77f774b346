"""The axes' decode: how block ids, thread ids and register-tile points split into axis coordinates.

Both lowerings (``lowering.py`` for reductions, ``rows.py`` for row kernels) set the same divisors on their
axis plans here. Which spatial axis the threads follow is decided in ``schedule.py`` (``read_axis``) and only
applied here.
"""
from __future__ import annotations

from roller.backends.c_family.plan.types import AxisPlan


def decode(spatial: list[AxisPlan], fastest: str | None = None) -> None:
    """Set the spatial axes' decode divisors. The last axis varies fastest (in block ids, thread ids and register
    points alike), so that adjacent threads work on adjacent output elements of the innermost dimension; with
    ``fastest``, that axis varies fastest in thread ids instead (a streamed output: ``schedule.read_axis``)."""
    div_b = div_j = 1
    for ax in reversed(spatial):
        ax.bdiv, ax.jdiv = div_b, div_j
        div_b *= ax.blocks
        div_j *= ax.thread
    div_t = 1
    inner_first = spatial[::-1]
    for ax in [a for a in inner_first if a.name == fastest] + [a for a in inner_first if a.name != fastest]:
        ax.tdiv = div_t
        div_t *= ax.threads


def runtime_axes(axes: list[AxisPlan], runtime: dict[str, int]) -> None:
    """Give the axes whose extent is a kernel argument their C expressions (extent, block count), and every
    axis outside one of them its decode divisor as an expression (the product of the inner axes' block
    counts, some known only at launch). ``axes`` are in decode order, the last varying fastest."""
    const = 1
    inner: list[str] = []
    for ax in reversed(axes):
        if inner:
            ax.bdiv_c = " * ".join(inner + ([str(const)] if const != 1 else []))
        if ax.name in runtime:
            ax.extent_c = f"rl_e_{ax.name}"
            ax.blocks_c = f"rl_nb_{ax.name}"
            inner.append(ax.blocks_c)
        else:
            const *= ax.blocks
