"""OpenCL backend: kernels from the shared C-family plan, run through pyopencl (PoCL on this machine)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roller.backends import Artifact, Backend
from roller.backends.c_family.launch import launch_json
from roller.backends.c_family.plan import Dialect, Streaming, lower
from roller.backends.c_family.render import render
from roller.errors import InputError
from roller.runtime.device import Device, Runner
from roller.settings import settings

if TYPE_CHECKING:
    from roller.hw import HardwareDesc
    from roller.program import RProgram

TEMPLATES = Path(__file__).parent / "templates"

DIALECT = Dialect(
    ctype={"float64": "double", "float32": "float", "float16": "ushort", "bfloat16": "rl_bf16", "int64": "long", "int32": "int", "int8": "char", "uint8": "uchar", "bool": "uchar"},
    unsigned={"int64": "ulong", "int32": "uint", "int8": "uchar", "uint8": "uchar"},
    funcs={"exp": "exp({0})", "log": "log({0})", "sqrt": "sqrt({0})", "rsqrt": "rsqrt({0})", "tanh": "tanh({0})",
           "erf": "erf({0})", "sigmoid": "({one} / ({one} + exp(-({0}))))", "relu": "rl_relu{v}({0})",
           "abs": "fabs({0})", "max": "rl_max{v}({0}, {1})", "min": "rl_min{v}({0}, {1})",
           "cos": "cos({0})", "sin": "sin({0})", "round": "rint({0})", "pow": "pow({0}, {1})", "fmod": "fmod({0}, {1})"},
    to_acc="(float)({x})", from_acc="({ctype})({x})", vector_loads=True, wide_int="long", wide_uint="ulong",
    wide_index=True, streaming_store="__builtin_nontemporal_store({v}, (__global {vtype}*)({ptr}))",
    conversions={"ushort": ("rl_h2f({x})", "rl_f2h({x})"), "rl_bf16": ("rl_bf2f({x})", "rl_f2bf({x})")},
    vector_io={"ushort": ("rl_h2f_v(vload{w}(0, {ptr}))", "vstore{w}(rl_f2h_v({v}), 0, {ptr})"),
               "rl_bf16": ("rl_bf2f_v(vload{w}(0, {ptr}))", "vstore{w}(rl_f2bf_v({v}), 0, {ptr})")},
    language="OpenCL C")


def streaming(hw: HardwareDesc) -> Streaming | None:
    """When kernels store past the caches (``HardwareDesc.streamed_from``): in vectors of whole transactions."""
    least = hw.streamed_from()
    return None if least is None else Streaming(least, hw.memory[0].transaction_bytes)


class OpenCLBackend(Backend):
    name = "opencl"
    file_ext = "cl"
    target_pattern = r"[A-Za-z0-9][A-Za-z0-9_.+-]*"
    target_hint = "an OpenCL target name like pocl-cpu"
    dtypes = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool")
    typed_bodies = True
    cache_env = ("ROLLER_CL_MAPPING", "ROLLER_CL_FAST_MATH", "ROLLER_CL_DEVICE")
    runs_any_description = True
    local_names = ("host",)

    def render(self, prog: RProgram, hw: HardwareDesc) -> Artifact:
        if prog.use_matrix:
            # Construction hands this backend no matrix program (it declares no matrix_support); one built for
            # another backend has a warp's fragment tile as its register tile, which the scalar plan would
            # index wrongly.
            raise InputError(f"{prog.expr.name}: the program for {hw.name} uses matrix instructions, which the "
                             "OpenCL backend does not render; use the description's own backend",
                             field="--backend")
        mapping = settings.opencl.mapping  # "blocked" / "strided": override for experiments
        plan = lower(prog, DIALECT, blocked=None if not mapping else mapping == "blocked",
                     streaming=streaming(hw))
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

    def toolchain_version(self) -> str:
        """The platform, its version, the device and its driver that the launcher picks; ``none`` without one."""
        from roller.backends.opencl.launcher import device_version

        return device_version()

    def compile(self, art: Artifact, hw: HardwareDesc, workdir: Path | None = None) -> Runner:
        from roller.backends.opencl.launcher import CLRunner

        return CLRunner(art, workdir)

    def compile_many(self, arts: Sequence[Artifact], hw: HardwareDesc, jobs: int | None = None,
                     use_cache: bool = True) -> list[Runner]:
        """One program for all the kernels the cache holds no program of (PoCL builds one at a time whatever
        the threads: opencl/programs.py)."""
        from roller.backends.opencl.launcher import compile_many

        return list(compile_many(arts, None, use_cache, jobs))

    def check_compiles(self, art: Artifact, hw: HardwareDesc, workdir: Path) -> dict[str, Any]:
        from roller.backends.opencl.launcher import CLRunner

        return CLRunner(art, workdir).info()

    def local_description(self, name: str) -> Path:
        """``--hw host``: this machine's OpenCL device, probed the first time and cached (opencl/host.py)."""
        from roller.backends.opencl.host import description

        return description(name)

    def device(self) -> Device:
        from roller.backends.opencl.launcher import CLDevice

        return CLDevice()


BACKEND = OpenCLBackend()
