"""PoCL settings that roller's OpenCL kernels are written for, applied before the OpenCL runtime starts.

Roller's CPU kernels vectorise inside a work-item (OpenCL vector types along a thread's contiguous run, see
roller/backends/c_family/plan/vector.py). PoCL's default work-group method then also tries to vectorise the loop over
a work-group's items, and on the scaled suite that made the vector kernels 1.27x slower in geomean (up to 3x:
a 7x7 depthwise convolution, 47 vs 152 us), and their times depend on the work-group shape in ways the model
cannot see. ``loops`` runs the work-items one after another as they are written. A value already in the
environment wins: set POCL_WORK_GROUP_METHOD yourself to compare.
"""
from __future__ import annotations

import os

POCL_DEFAULTS = {"POCL_WORK_GROUP_METHOD": "loops"}


def apply_pocl_defaults() -> None:
    """Set roller's PoCL defaults where the environment leaves them unset; PoCL reads them when the first
    OpenCL platform query of the process starts it, so call this before that."""
    for key, value in POCL_DEFAULTS.items():
        os.environ.setdefault(key, value)
