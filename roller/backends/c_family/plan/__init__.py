"""Kernel plan: an rProgram lowered to what every C-family kernel (OpenCL, CUDA, HIP) needs.

The plan is plain data: decode divisors, tile extents, and index expressions as one-line C expressions. The
shared Jinja2 template (``templates/kernel.j2``) lays the kernel out from it; each backend's dialect template
only says how its language spells qualifiers, barriers and thread indices. So the kernels of one rProgram in
every language come from the same plan (and a test compares the plans).

The package, each module importing only those before it:

* ``types``: the plan's dataclasses (``KernelPlan`` and its parts, ``Dialect``);
* ``cexpr``: C expressions (constants, affine indices and their integer types, the body, folds);
* ``axes``: the axes' decode divisors;
* ``access``: tensor plans and scalar reads from global memory, with their bounds tests;
* ``schedule``: every scheduling decision (staging, the threads' runs and order, unrolling, the vector path,
  streamed stores), as plain values;
* ``vector``: the CPU vector path, printed once the schedule chose it;
* ``rows``: row kernels' plans;
* ``lowering``: ``lower``, which asks the schedule and assembles the plan.

The names other packages use are exported here.
"""
from __future__ import annotations

from roller.backends.c_family.plan.cexpr import INT32_MAX, index_types, reach, render_body
from roller.backends.c_family.plan.lowering import lower
from roller.backends.c_family.plan.schedule import Streaming, hoist_divisor
from roller.backends.c_family.plan.types import (
    AxisPlan,
    Dialect,
    DimPlan,
    KernelPlan,
    ReduceVecPlan,
    RowVecPlan,
    StagePlan,
    TensorPlan,
    VecFlavor,
    VecPlan,
    ViewPlan,
)

__all__ = ["INT32_MAX", "AxisPlan", "Dialect", "DimPlan", "KernelPlan", "ReduceVecPlan", "RowVecPlan", "StagePlan",
           "Streaming", "TensorPlan", "VecFlavor", "VecPlan", "ViewPlan", "hoist_divisor", "index_types", "lower",
           "reach", "render_body"]
