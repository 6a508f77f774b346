"""Run a generated HIP kernel on the CPU, for tests on machines without an AMD GPU.

The kernel source, unchanged, is compiled as host C++ with clang++ (installed with hipcc) against a stand-in
``hip/hip_runtime.h`` (``emulation/``): one CPU thread per HIP thread, ``__syncthreads`` a barrier, blocks run
in turn, and the MFMA builtins emulated per wavefront from AMD's documented lane layouts. It checks what the
compile checks cannot: that the HIP source computes the right values, the MFMA fragment loads and result
stores included. It says nothing about timing, and runs only small ops (a barrier across hundreds of threads
on a few cores is slow).
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from roller.backends import Artifact
from roller.backends.c_family.render import environment
from roller.backends.rocm_hip import DIALECT, TEMPLATES
from roller.dtypes import dtype
from roller.errors import CompileError, ToolchainError

SHIM = Path(__file__).parent / "emulation"
COMPILERS = ("clang++-15", "clang++")


def compiler() -> str:
    for name in COMPILERS:
        exe = shutil.which(name)
        if exe:
            return exe
    raise ToolchainError("clang++ not found: apt-get install clang-15 (hipcc depends on it)")


def run(art: Artifact, inputs: list[np.ndarray], workdir: Path | None = None, timeout: float = 600,
        grid: int | None = None, scalars: Sequence[int] | None = None) -> np.ndarray:
    """The kernel's output for ``inputs`` (launch.json order), computed on CPU threads; on launch.json's grid
    and with its scalar arguments' values, or on ``grid`` blocks with ``scalars`` (a kernel with runtime
    extents at another size)."""
    folder = Path(workdir or tempfile.mkdtemp(prefix="roller-hip-emu-"))
    folder.mkdir(parents=True, exist_ok=True)
    launch = art.launch
    args = launch["arguments"]
    kernel = folder / art.main_file
    kernel.write_text(art.source, encoding="utf-8")

    def spec(a: dict) -> dict:
        return {"ctype": DIALECT.ctype[a["dtype"]], "size": int(np.prod(a["shape"], dtype=np.int64))}

    block = int(launch["block"][0])
    harness = environment(TEMPLATES).get_template("harness.cpp.j2").render(
        name=art.kernel_name, kernel_file=kernel.name, grid=int(launch["grid"][0]) if grid is None else grid,
        block=block, scalars=[int(a["value"]) for a in launch.get("scalars", [])] if scalars is None else
        [int(v) for v in scalars],
        waves=-(-block // int(launch.get("wavefront_size") or 64)),
        inputs=[spec(a) for a in args[:-1]], output=spec(args[-1]))
    main = folder / "harness.cpp"
    main.write_text(harness, encoding="utf-8")
    exe = folder / "harness"
    cmd = [compiler(), "-std=c++20", "-O1", "-pthread", "-w", f"-I{SHIM}", str(main), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout)
    if proc.returncode != 0:
        raise CompileError(f"host build of {art.kernel_name} for emulation failed\n{proc.stderr[-4000:]}\n"
                           f"kernel: {kernel}\nrepro: {' '.join(cmd)}")
    files = []
    for i, (a, x) in enumerate(zip(args[:-1], inputs)):
        path = folder / f"in{i}.bin"
        dtype(a["dtype"]).to_storage(x).tofile(path)
        files.append(str(path))
    out_path = folder / "out.bin"
    proc = subprocess.run([str(exe), *files, str(out_path)], capture_output=True, text=True, check=False,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"emulated run of {art.kernel_name} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    out = args[-1]
    kind = dtype(out["dtype"])
    return kind.from_storage(np.fromfile(out_path, dtype=kind.storage)).reshape(out["shape"])
