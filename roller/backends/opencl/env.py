"""PoCL settings that roller's OpenCL kernels are written for, applied before the OpenCL runtime starts.

Roller's CPU kernels vectorise inside a work-item (OpenCL vector types along a thread's contiguous run, see
roller/backends/c_family/plan/vector.py). PoCL's default work-group method then also tries to vectorise the loop over
a work-group's items, and on the scaled suite that made the vector kernels 1.27x slower in geomean (up to 3x:
a 7x7 depthwise convolution, 47 vs 152 us), and their times depend on the work-group shape in ways the model
cannot see. ``loops`` runs the work-items one after another as they are written.

PoCL also compiles, by default, a work-group function specialised to each launch's grid at the kernel's first
launch, besides the generic one a program's binary holds (``clGetProgramInfo(CL_PROGRAM_BINARIES)`` compiles
that one): every kernel compiled twice, and a program loaded from Roller's cache compiled again at its first
launch. Without specialisation the generic function runs every launch: ResNet-18, MobileNetV2 and a BERT-base
layer ran as fast as with the specialised ones (two processes of each, alternating, 7 rounds each, in
onnxruntime's latency: 1.25-1.26x against 1.26-1.36x, 2.32-2.34x against 2.50-2.57x, 1.29-1.56x against
1.30x, the 1.56 one run's outlier), and a cached program's first launch compiles nothing.

A value already in the environment wins: set either variable yourself to compare.
"""
from __future__ import annotations

import os
import warnings
from typing import Any

from roller.errors import ToolchainError

POCL_DEFAULTS = {"POCL_WORK_GROUP_METHOD": "loops", "POCL_WORK_GROUP_SPECIALIZATION": "0"}


def apply_pocl_defaults() -> None:
    """Set roller's PoCL defaults where the environment leaves them unset; PoCL reads them when the first
    OpenCL platform query of the process starts it, so call this before that."""
    for key, value in POCL_DEFAULTS.items():
        os.environ.setdefault(key, value)


def import_opencl() -> Any:
    """pyopencl, after roller's PoCL defaults are set; ToolchainError naming the install where it is missing."""
    apply_pocl_defaults()
    try:
        import pyopencl as cl
    except ImportError:
        raise ToolchainError("pyopencl is not installed: pip install 'roller[opencl]' "
                             "(and apt-get install pocl-opencl-icd for a CPU device)") from None
    if not os.environ.get("PYOPENCL_COMPILER_OUTPUT"):
        # A build that succeeds with a log holds the compiler's remarks ("loop not unrolled" where a pragma asks
        # more than LLVM's threshold): nothing a user acts on, and pyopencl's warning only says where to look.
        # PYOPENCL_COMPILER_OUTPUT=1 shows them, as pyopencl documents.
        warnings.filterwarnings("ignore", category=cl.CompilerWarning)
    return cl
