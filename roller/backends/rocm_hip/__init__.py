"""HIP backend (ROCm): kernels from the shared C-family plan, compile-checked with hipcc, run through hip-python.

The kernel of an rProgram is the OpenCL one in HIP spelling (same ``KernelPlan``, dialect template
``templates/kernel.hip.j2``), except float16 GEMM-shaped programs on descriptions that list a float16 matrix
instruction: those use MFMA (``mfma.py``, ``templates/kernel_mfma.hip.j2``). No AMD GPU is needed to build
or compile-check; running needs ROCm and hip-python (``launcher.py``).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roller.backends import Artifact, Backend
from roller.backends.c_family.launch import launch_json
from roller.backends.c_family.plan import Dialect, lower
from roller.backends.c_family.render import render
from roller.backends.rocm_hip.hipcc import ARCH_VGPRS
from roller.backends.rocm_hip.mfma import BUILTINS
from roller.construction.matrix import MatrixSupport
from roller.errors import InputError
from roller.perf.micro import register_cap as unit_register_cap
from roller.perf.traffic import TileGeometry
from roller.runtime.device import Runner

if TYPE_CHECKING:
    from roller.hw import HardwareDesc
    from roller.program import RProgram

TEMPLATES = Path(__file__).parent / "templates"

# Device math in HIP: the float overloads of the C library (clang's HIP headers map them to OCML).
# float16 elements are _Float16 (clang's native half type: no header type, and the MFMA builtins take its
# vectors); they are widened to the float accumulator on load, so all arithmetic is float (double in a kernel
# that holds a float64 tensor: Dialect.for_float64).
DIALECT = Dialect(
    ctype={"float64": "double", "float32": "float", "float16": "_Float16", "int64": "long long", "int32": "int", "int8": "signed char", "uint8": "unsigned char", "bool": "unsigned char"},
    unsigned={"int64": "unsigned long long", "int32": "unsigned int", "int8": "unsigned char",
              "uint8": "unsigned char"},
    helper_qual="__device__ inline",
    funcs={"exp": "expf({0})", "log": "logf({0})", "sqrt": "sqrtf({0})", "rsqrt": "rsqrtf({0})",
           "tanh": "tanhf({0})", "erf": "erff({0})", "sigmoid": "({one} / ({one} + expf(-({0}))))",
           "relu": "rl_relu({0})", "abs": "fabsf({0})", "max": "rl_max({0}, {1})", "min": "rl_min({0}, {1})",
           "cos": "cosf({0})", "sin": "sinf({0})", "round": "rintf({0})", "pow": "powf({0}, {1})", "fmod": "fmodf({0}, {1})"},
    to_acc="(float)({x})", from_acc="({ctype})({x})", language="HIP")


# Unrolling the reduction-step loop lets the compiler load the next steps' fragments early: each unrolled step
# keeps one more set of fragments live. Up to this many steps, as far as the registers allow.
MAX_K_UNROLL = 8


def register_cap(block: int, hw: HardwareDesc) -> int:
    """Vector registers one lane may use when a block of ``block`` threads is resident: the unit's share
    (what the compiler enforces from __launch_bounds__), and no more than the architecture's VGPRs."""
    return min(unit_register_cap(block, hw), ARCH_VGPRS)


def k_unroll(prog: RProgram, hw: HardwareDesc) -> int:
    """How many reduction steps to unroll: the most (a power of two up to MAX_K_UNROLL) whose extra live
    fragments still fit the lane's register share on top of the model's estimate. Without this, a large
    register tile unrolled 8 times spilled on gfx906 (119 suite C8 on mi50: 31 VGPRs spilled; unrolled once,
    79 VGPRs and no spill against the model's 78)."""
    geo = TileGeometry(prog.expr)
    step = tuple(1 if r else s for s, r in zip(prog.thread_tile.shape, geo.reduce_mask))
    frags = -(-sum(math.prod(geo.region(t, step)) * t.itemsize for t in geo.inputs) // 4)
    need = prog.prediction.registers_per_thread if prog.prediction else 0
    cap = register_cap(prog.block, hw)
    u = MAX_K_UNROLL
    while u > 1 and need + (u - 1) * frags > cap:
        u //= 2
    return u


class HipBackend(Backend):
    name = "hip"
    file_ext = "hip"
    target_pattern = r"gfx[0-9a-f]{3,4}"
    target_hint = "an AMD target like gfx906"
    dtypes = ("float64", "float32", "float16", "int64", "int32", "int8", "uint8", "bool")
    typed_bodies = True
    matrix_support = tuple(MatrixSupport("mfma", dtype, (m, n, k)) for dtype, m, n, k in BUILTINS)
    cache_env = ("ROLLER_HIPCC",)

    def render(self, prog: RProgram, hw: HardwareDesc) -> Artifact:
        from roller.backends.rocm_hip import mfma

        if not self.matches_target(hw.target):
            # The target reaches the kernel's comment and hipcc's command line (--backend hip on a description
            # of another backend).
            raise InputError(f"expected an AMD GPU target such as gfx906 or gfx90a for the HIP backend, got "
                             f"{hw.target!r}", source=hw.source or None, field="target")
        main = f"kernel.{self.file_ext}"
        context: dict[str, Any] = {"line": prog.line(), "statement": prog.expr.statement(), "hw_name": hw.name,
                                   "target": hw.target, "wavefront": hw.parallelism.warp_size,
                                   "k_unroll": k_unroll(prog, hw)}
        # Threads own strided runs (what coalesces a wavefront), as on every GPU description.
        plan = lower(prog, DIALECT, blocked=False)
        mplan = mfma.plan_for(prog, hw, plan)
        if mplan is not None:
            src = render(plan, DIALECT, TEMPLATES, "kernel_mfma.hip.j2", m=mplan, **context)
        else:
            src = render(plan, DIALECT, TEMPLATES, "kernel.hip.j2", **context)
        launch = launch_json(prog, plan, self.name)
        launch["wavefront_size"] = hw.parallelism.warp_size
        launch["target"] = hw.target
        launch["matrix_instruction"] = mplan.instruction.name if mplan is not None else None
        return Artifact(plan.name, {main: src}, launch, main_file=main, extra={"plan": plan, "mfma": mplan})

    def can_run_here(self) -> bool:
        from roller.backends.rocm_hip.launcher import available

        return available()

    def why_not_here(self) -> str:
        from roller.backends.rocm_hip.launcher import why_unavailable

        return why_unavailable()

    def toolchain_version(self) -> str:
        """What compiles the kernels (part of the build cache's key); ``none`` without hipcc."""
        from roller.backends.rocm_hip.hipcc import version

        return version()

    def compile(self, art: Artifact, hw: HardwareDesc, workdir: Path | None = None) -> Runner:
        from roller.backends.rocm_hip.launcher import HipRunner

        return HipRunner(art, hw, workdir)

    def check_compiles(self, art: Artifact, hw: HardwareDesc, workdir: Path) -> dict[str, Any]:
        from roller.backends.rocm_hip.hipcc import check_artifacts

        return check_artifacts([art], hw, workdir)[art.kernel_name]


BACKEND = HipBackend()
