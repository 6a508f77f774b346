"""Graphcore IPU backend: rPrograms as Poplar graphs.

``render`` lays the rProgram out as a graph plan (``plan.py``: one MultiVertex per block tile, spread over
the IPU tiles) and writes the codelets, the plan (JSON, and a C++ header the host program builds the graph
from), the host program and a Makefile (``codegen.py`` with the templates in ``templates/``). Running needs
the Poplar SDK (``launcher.py``); without it, the codelets can still be compiled and run on the host against
``standin/poplar_standin.h`` (``hostrun.py``, used by the tests).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from roller.backends import Artifact, Backend
from roller.backends.ipu_poplar.codegen import render_all
from roller.backends.ipu_poplar.plan import plan
from roller.errors import InputError, ToolchainError
from roller.runtime.device import Runner

if TYPE_CHECKING:
    from roller.hw import HardwareDesc
    from roller.program import RProgram


class PoplarBackend(Backend):
    name = "poplar"
    file_ext = "cpp"
    target_pattern = r"ipu\d+"
    target_hint = "an IPU target like ipu2"
    dtypes = ("float32",)
    # worker contexts per tile: the graph plan gives each tile's vertices that many workers
    required_parallelism = ("hardware_threads_per_unit",)
    cache_env = ("ROLLER_POPLAR_DEVICE",)
    # A row kernel's stages would need a vertex that walks its rows' columns several times: not rendered yet
    row_kernels = False
    # A Poplar program maps every block to an IPU tile when the graph is built: no grid to shorten at a call.
    sub_grid = False

    def render(self, prog: RProgram, hw: HardwareDesc) -> Artifact:
        if prog.expr.stages:
            raise InputError(f"{prog.expr.name}: the poplar backend does not render row kernels (an op with "
                             "per-row stages, such as a one-kernel softmax); write the stages as separate ops",
                             field="expr")
        if prog.runtime:
            # A Poplar graph maps every vertex to a tile when it is built: its extents are those of its build.
            raise InputError(f"{prog.expr.name}: the poplar backend builds for one size; this program takes "
                             f"{', '.join(a for a, _ in prog.runtime)} as kernel arguments", field="runtime_axes")
        gp = plan(prog, hw)
        files = render_all(gp, prog.expr)
        expr = prog.expr
        launch: dict[str, Any] = {
            "kernel": gp.codelet, "backend": self.name, "target": gp.target,
            "tiles": gp.tiles, "vertices": gp.vertices, "compute_sets": gp.rounds,
            "workers_per_vertex": gp.threads,
            "inputs": [t.name for t in expr.inputs], "output": expr.output.name,
            "shapes": {t.name: list(t.storage_shape) for t in expr.tensors},
            "arguments": [{"name": t.name, "role": "input", "shape": list(t.storage_shape), "dtype": t.dtype}
                          for t in expr.inputs]
            + [{"name": expr.output.name, "role": "output", "shape": list(expr.output.storage_shape),
                "dtype": expr.output.dtype}],
            "build": "make (needs the Poplar SDK: popc, libpoplar)",
            "run": "./host --device model|ipu --data DIR --codelets codelets.gp",
            "rprogram": prog.line(),
        }
        return Artifact(gp.codelet, files, launch, main_file="codelets.cpp", extra={"plan": gp})

    def can_run_here(self) -> bool:
        from roller.backends.ipu_poplar.launcher import available

        return available()

    def why_not_here(self) -> str:
        from roller.backends.ipu_poplar.launcher import why_unavailable

        return why_unavailable() or "the Poplar SDK is here"

    def compile(self, art: Artifact, hw: HardwareDesc, workdir: Path | None = None) -> Runner:
        from roller.backends.ipu_poplar.launcher import PoplarRunner

        return PoplarRunner(art, workdir)

    def check_compiles(self, art: Artifact, hw: HardwareDesc, workdir: Path) -> dict[str, Any]:
        from roller.backends.ipu_poplar.launcher import build, why_unavailable

        why = why_unavailable()
        if why:
            raise ToolchainError(why)
        build(art, Path(workdir))
        return {"vertices": art.launch["vertices"], "compute_sets": art.launch["compute_sets"]}


BACKEND = PoplarBackend()
