"""OpenCL backend: kernels from the shared C-family plan, run through pyopencl (PoCL on this machine)."""
from __future__ import annotations

import os
from pathlib import Path

from roller.backends import Artifact, Backend
from roller.errors import InputError
from roller.backends.c_family.launch import launch_json
from roller.backends.c_family.plan import Dialect, lower
from roller.backends.c_family.render import render

TEMPLATES = Path(__file__).parent / "templates"

DIALECT = Dialect(
    ctype={"float32": "float", "float16": "ushort"},
    funcs={"exp": "exp({0})", "log": "log({0})", "sqrt": "sqrt({0})", "rsqrt": "rsqrt({0})", "tanh": "tanh({0})",
           "erf": "erf({0})", "sigmoid": "({one} / ({one} + exp(-({0}))))", "relu": "rl_relu{v}({0})",
           "abs": "fabs({0})", "max": "rl_max{v}({0}, {1})", "min": "rl_min{v}({0}, {1})"},
    to_acc="(float)({x})", from_acc="({ctype})({x})", vector_loads=True, wide_int="long", wide_uint="ulong",
    conversions={"ushort": ("rl_h2f({x})", "rl_f2h({x})")}, language="OpenCL C")


class OpenCLBackend(Backend):
    name = "opencl"
    serves = ("opencl",)
    file_ext = "cl"
    dtypes = ("float32", "float16")

    def render(self, prog, hw) -> Artifact:  # type: ignore[no-untyped-def]
        if prog.use_matrix:
            # A matrix program's register-level tile is one warp's fragment tile, not a thread's: the scalar
            # plan would index it wrongly.
            raise InputError(f"{prog.expr.name}: the program for {hw.name} uses warp-level matrix instructions, "
                             "which the OpenCL backend does not render; use the description's own backend",
                             field="--backend")
        mapping = os.environ.get("ROLLER_CL_MAPPING")  # "blocked" / "strided": override for experiments
        plan = lower(prog, DIALECT, blocked=None if not mapping else mapping == "blocked")
        src = render(plan, DIALECT, TEMPLATES, "kernel.cl.j2", line=prog.line(), statement=prog.expr.statement())
        launch = launch_json(prog, plan, "opencl")
        return Artifact(plan.name, {f"kernel.{self.file_ext}": src}, launch, main_file=f"kernel.{self.file_ext}",
                        extra={"plan": plan})

    def can_run_here(self) -> bool:
        from roller.backends.opencl.launcher import available

        return available()

    def why_not_here(self) -> str:
        from roller.backends.opencl.launcher import why_unavailable

        return why_unavailable()

    def compile(self, art: Artifact, hw, workdir: Path | None = None):  # type: ignore[no-untyped-def]
        from roller.backends.opencl.launcher import CLRunner

        return CLRunner(art, workdir)

    def check_compiles(self, art: Artifact, hw, workdir: Path) -> dict:  # type: ignore[no-untyped-def]
        runner = self.compile(art, hw, workdir)
        return runner.info()


BACKEND = OpenCLBackend()
