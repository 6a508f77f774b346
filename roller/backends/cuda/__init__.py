"""CUDA backend: kernels from the shared C-family plan in CUDA C++, compiled by nvcc (or NVRTC), run through
CuPy where an NVIDIA GPU is present.

float32, float16 and bfloat16 tensors, arithmetic and accumulation in float32; float64 ones in double.
float16/bfloat16 GEMM-shaped ops constructed with matrix instructions (``RProgram.use_matrix``) get the wmma
fragment path.
Nothing here touches the CUDA driver unless a GPU was detected first (roller/backends/cuda/toolchain.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roller.backends import Artifact, Backend
from roller.backends.c_family.launch import launch_json
from roller.backends.c_family.plan import Dialect, KernelPlan, lower
from roller.backends.c_family.render import render
from roller.construction.matrix import MatrixSupport
from roller.construction.splitk import REDUCE_BLOCK, output_tiles, per_split, reduction_tiles, splittable
from roller.runtime.device import Device, Runner

if TYPE_CHECKING:
    from roller.hw import HardwareDesc
    from roller.program import RProgram

TEMPLATES = Path(__file__).parent / "templates"
#: bytes of static shared memory a block may declare; more must be dynamic, with the opt-in attribute
STATIC_SMEM_LIMIT = 48 * 1024
#: byte alignment of each buffer carved out of dynamic shared memory (fragment loads need 32)
DYN_ALIGN = 128

DIALECT = Dialect(
    ctype={"float64": "double", "float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "int64": "long long", "int32": "int", "int8": "signed char", "uint8": "unsigned char", "bool": "unsigned char"},
    unsigned={"int64": "unsigned long long", "int32": "unsigned int", "int8": "unsigned char",
              "uint8": "unsigned char"},
    helper_qual="__device__ inline",
    funcs={"exp": "expf({0})", "log": "logf({0})", "sqrt": "sqrtf({0})", "rsqrt": "rsqrtf({0})",
           "tanh": "tanhf({0})", "erf": "erff({0})", "sigmoid": "({one} / ({one} + expf(-({0}))))",
           "relu": "rl_relu({0})", "abs": "fabsf({0})", "max": "rl_max({0}, {1})", "min": "rl_min({0}, {1})",
           "cos": "cosf({0})", "sin": "sinf({0})", "round": "rintf({0})", "pow": "powf({0}, {1})", "fmod": "fmodf({0}, {1})"},
    # NVRTC has no math.h: spell infinity by its bits
    infinity="__int_as_float(0x7f800000)",
    to_acc="(float)({x})", from_acc="({ctype})({x})", language="CUDA", stage_vector="uint4", stream_bytes=16,
    warp_lanes=32, coalesce_gathers=True)


def dynamic_layout(plan: KernelPlan, scratch: tuple[str, int] | None,
                   stages: int = 1) -> tuple[list[tuple[str, str, int]], int]:
    """(buffers as (name, ctype, byte offset), total bytes) of the staged tiles (and the matrix epilogue's
    scratch) carved out of one dynamic shared allocation. With ``stages`` > 1 each tile is a ring of that many
    (named ``<buffer>_ring``), which the pipelined step loop slices per step."""
    out: list[tuple[str, str, int]] = []
    offset = 0
    items = [(t.smem + ("_ring" if stages > 1 else ""), t.ctype, stages * ring_slot(t.smem_elems, t.ctype)
              * _ctype_bytes(t.ctype) if stages > 1 else t.smem_elems * _ctype_bytes(t.ctype))
             for t in plan.inputs if t.smem]
    if scratch is not None:
        items.append((scratch[0], "float", scratch[1] * 4))
    for name, ctype, nbytes in items:
        out.append((name, ctype, offset))
        offset += -(-nbytes // DYN_ALIGN) * DYN_ALIGN
    return out, offset


def ring_slot(elems: int, ctype: str) -> int:
    """Elements from one ring slot to the next: the staged tile rounded up to DYN_ALIGN bytes, so that every
    slot starts as aligned as the buffer (cp.async needs 16 bytes, fragment loads 32)."""
    size = _ctype_bytes(ctype)
    return -(-elems * size // DYN_ALIGN) * DYN_ALIGN // size


def pipeline_stages(prog: RProgram, plan: KernelPlan) -> int:
    """The ring depth the kernel renders: the program's ``stages`` where every staged tile moves as whole
    16-byte vectors (what one cp.async copies), else 1 (the synchronous staging loop)."""
    if prog.stages <= 1 or prog.reduce_threads > 1 or not plan.staged or not plan.inputs:
        return 1   # a split program's steps are a range of the block's own: the ring walks them all
    if not all(t.smem and t.stage_vec for t in plan.inputs):
        return 1
    return prog.stages


@dataclass(frozen=True)
class SplitPlan:
    """How a split-K program renders: ``factor`` blocks per output tile (``tiles`` of them), each walking
    ``per`` reduction tiles, partials in a float32 workspace [factor, outputs], summed by ``reduce_name``."""

    factor: int
    tiles: int
    per: int
    outputs: int
    reduce_name: str
    reduce_block: int = REDUCE_BLOCK

    @property
    def reduce_grid(self) -> int:
        return -(-self.outputs // self.reduce_block)

    def launch(self) -> dict[str, Any]:
        """launch.json's ``split_k``: the first kernel takes the workspace after its other arguments; the
        second takes (workspace, output)."""
        return {"factor": self.factor, "workspace_bytes": self.factor * self.outputs * 4,
                "workspace_dtype": "float32", "workspace_shape": [self.factor, self.outputs],
                "reduce_kernel": self.reduce_name, "reduce_grid": [self.reduce_grid, 1, 1],
                "reduce_block": [self.reduce_block, 1, 1]}


def split_plan(prog: RProgram, plan: KernelPlan) -> SplitPlan | None:
    """The split-K form of ``prog`` (None when it is not split); ValueError for a split the kernels cannot
    render (construction offers none of those)."""
    s = prog.reduce_threads
    if s == 1:
        return None
    steps = reduction_tiles(prog)
    if s < 1 or not plan.staged or not splittable(prog.expr) or prog.runtime or plan.output.view is not None \
            or plan.epilogue != "rl_r" or plan.acc_ctype != "float" or plan.n_rtiles != steps or s > steps \
            or prog.grid % s:
        raise ValueError(f"{prog.expr.name}: {prog.line()} is not a split-K program the CUDA kernels render")
    return SplitPlan(factor=s, tiles=output_tiles(prog), per=per_split(prog), outputs=prog.expr.output.size,
                     reduce_name=f"{plan.name}_splitk_sum")


def _ctype_bytes(ctype: str) -> int:
    return {"double": 8, "float": 4, "int": 4, "long long": 8, "signed char": 1, "unsigned char": 1}.get(ctype, 2)


class CudaBackend(Backend):
    name = "cuda"
    file_ext = "cu"
    target_pattern = r"sm_\d+[a-z]?"
    target_hint = "a CUDA target like sm_70"
    dtypes = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool")
    typed_bodies = True
    # The wmma fragment path (matrix.py, the template's wmma branch) for the square 16x16x16 shape, which
    # every NVIDIA part since Volta has for float16 and every one since Ampere for bfloat16.
    matrix_support = (MatrixSupport("wmma", "float16", (16, 16, 16)),
                      MatrixSupport("wmma", "bfloat16", (16, 16, 16)))
    cache_env = ("ROLLER_CUDA_COMPILER",)
    # CudaRunner.launch runs the split program's two kernels with a workspace it owns (the single-op runner and
    # the graph executor alike)
    split_k = True
    vector_programs = True

    def render(self, prog: RProgram, hw: HardwareDesc) -> Artifact:
        from roller.backends.cuda.matrix import matrix_plan

        plan = lower(prog, DIALECT, blocked=False)
        mx = matrix_plan(prog, plan, hw)
        smem = plan.smem_bytes + (mx.scratch_elems * 4 if mx else 0)
        dyn: list[tuple[str, str, int]] = []
        dyn_bytes = 0
        pipe = pipeline_stages(prog, plan)
        # a ring always lives in dynamic shared memory: its size is the stages times the step's tiles, mostly
        # past the 48 KiB a static declaration may hold
        if plan.staged and (smem > STATIC_SMEM_LIMIT or pipe > 1):
            dyn, dyn_bytes = dynamic_layout(plan, (mx.scratch, mx.scratch_elems) if mx else None, pipe)
        bf16 = any(t.dtype == "bfloat16" for t in prog.expr.tensors)
        split = split_plan(prog, plan)
        if plan.stream is not None:
            src = render(plan, DIALECT, TEMPLATES, "stream.cu.j2", line=prog.line(), statement=prog.expr.statement(),
                         s=plan.stream, bf16=bf16)
        else:
            src = render(plan, DIALECT, TEMPLATES, "kernel.cu.j2", line=prog.line() + (" | wmma" if mx else ""),
                         statement=prog.expr.statement(), mx=mx, dyn=dyn, bf16=bf16, pipe=pipe if pipe > 1 else 0,
                         ring={t.smem: ring_slot(t.smem_elems, t.ctype) for t in plan.inputs if t.smem}, split=split)
        launch = launch_json(prog, plan, "cuda")
        launch["shared_bytes"] = dyn_bytes or smem
        launch["dynamic_shared_bytes"] = dyn_bytes
        launch["target"] = hw.target
        if pipe > 1:
            launch["stages"] = pipe
        launch["matrix"] = ({"m": mx.m, "n": mx.n, "k": mx.k, "a": mx.a_layout, "b": mx.b_layout}
                            if mx else None)
        if split is not None:
            launch["split_k"] = split.launch()
        return Artifact(plan.name, {f"kernel.{self.file_ext}": src}, launch, main_file=f"kernel.{self.file_ext}",
                        extra={"plan": plan, "matrix": mx, "split": split})

    def can_run_here(self) -> bool:
        from roller.backends.cuda.toolchain import gpu_present

        return gpu_present()[0]

    def why_not_here(self) -> str:
        from roller.backends.cuda.toolchain import gpu_present

        return gpu_present()[1]

    def toolchain_version(self) -> str:
        from roller.backends.cuda.toolchain import version_text

        return version_text()

    def compile(self, art: Artifact, hw: HardwareDesc, workdir: Path | None = None) -> Runner:
        from roller.backends.cuda.launcher import CudaRunner

        return CudaRunner(art, workdir)

    def device(self) -> Device:
        from roller.backends.cuda.launcher import CupyDevice

        return CupyDevice()

    def check_compiles(self, art: Artifact, hw: HardwareDesc, workdir: Path) -> dict[str, Any]:
        from roller.backends.cuda.toolchain import compile_unit

        result = compile_unit(art.source, hw.target, workdir, art.kernel_name)
        usage = result.usage[art.kernel_name]
        return usage.to_json()


BACKEND = CudaBackend()
