"""Building and running the generated Poplar program where the Poplar SDK is installed.

The SDK (popc, libpoplar, the IPU Model) comes only from Graphcore's download; it is on neither PyPI nor
Debian, so on most machines ``available()`` is False and ``why_unavailable()`` says so. Where ``popc`` is on
PATH (``source <sdk>/enable.sh``), the codelets are compiled with popc, the host program with
``g++ -lpoplar -lpoputil``, and the program runs on the IPU Model (``ROLLER_POPLAR_DEVICE=ipu`` for an attached
IPU). Inputs and the output travel as raw float32 files.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from roller.backends import Artifact
from roller.errors import CompileError, InputError, ToolchainError
from roller.runtime.device import Runner
from roller.settings import settings

INSTALL = ("install the Poplar SDK from Graphcore's support portal and `source <sdk>/enable.sh` (it is not on "
           "PyPI or Debian)")


def why_unavailable() -> str:
    """Empty when the SDK and a host C++ compiler are here, else why not."""
    if shutil.which("popc") is None:
        return f"the Poplar SDK is not installed here (popc is not on PATH): {INSTALL}"
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        return "no host C++ compiler (g++): apt-get install g++"
    return ""


def available() -> bool:
    return not why_unavailable()


def device_kind() -> str:
    kind = settings.poplar.device
    if kind not in ("model", "ipu"):
        raise InputError(f"expected 'model' or 'ipu', got {kind!r}", field="ROLLER_POPLAR_DEVICE")
    return kind


def _run(cmd: list[str], cwd: Path, what: str, timeout: float = 3600) -> str:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as err:
        raise ToolchainError(f"{cmd[0]} not found: {INSTALL}") from err
    except subprocess.TimeoutExpired as err:
        raise CompileError(f"{what} timed out after {timeout:.0f} s in {cwd}: {' '.join(cmd)}") from err
    if proc.returncode != 0:
        log = (proc.stderr or proc.stdout).strip()[-4000:]
        raise CompileError(f"{what} failed (exit {proc.returncode}) in {cwd}\n{log}\nrepro: cd {cwd} && "
                           f"{' '.join(cmd)}")
    return proc.stdout


def build(art: Artifact, workdir: Path) -> Path:
    """Writes the artifact's files into ``workdir`` and compiles codelets and host program; returns workdir."""
    why = why_unavailable()
    if why:
        raise ToolchainError(why)
    plan = json.loads(art.files["graph_plan.json"])
    if not plan["memory"]["on_device"]:
        raise InputError(f"{art.kernel_name}: its tensors exceed the IPU's tile memory (it needs streaming "
                         "memory, which roller does not generate)")
    workdir.mkdir(parents=True, exist_ok=True)
    for name, text in art.files.items():
        (workdir / name).write_text(text, encoding="utf-8")
    _run(["popc", "-O2", "codelets.cpp", "-o", "codelets.gp"], workdir, "popc (codelets)")
    cxx = os.environ.get("CXX", "g++")
    _run([cxx, "-std=c++17", "-O2", "host.cpp", "-o", "host", "-lpoplar", "-lpoputil"], workdir,
         "g++ (host program)")
    return workdir


class PoplarRunner(Runner):
    """The built host program: each call writes the inputs, runs the graph, reads the output back."""

    def __init__(self, art: Artifact, workdir: Path | None = None) -> None:
        self.art = art
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="roller-poplar-"))
        build(art, self.workdir)
        self.inputs: list[str] = art.launch["inputs"]
        self.output: str = art.launch["output"]
        self.out_shape = tuple(art.launch["shapes"][self.output])
        self.last_seconds: float | None = None

    def _run(self, inputs: list[np.ndarray], repeat: int) -> np.ndarray:
        data = self.workdir / "data"
        data.mkdir(exist_ok=True)
        if len(inputs) != len(self.inputs):
            raise InputError(f"{self.art.kernel_name} takes {len(self.inputs)} inputs, got {len(inputs)}")
        for name, x in zip(self.inputs, inputs):
            np.ascontiguousarray(x, dtype=np.float32).tofile(data / f"{name}.bin")
        out = _run(["./host", "--device", device_kind(), "--data", "data", "--codelets", "codelets.gp",
                    "--repeat", str(repeat)], self.workdir, "running the Poplar program")
        for line in out.splitlines():
            if line.startswith("rl_kernel_seconds "):
                self.last_seconds = float(line.split()[1])
        return np.fromfile(data / f"{self.output}.bin", dtype=np.float32).reshape(self.out_shape)

    def __call__(self, inputs: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        y = self._run(inputs, 1)
        if out is not None:
            out[...] = y
            return out
        return y

    def time(self, inputs: list[np.ndarray], repeat: int = 10, warmup: int = 2, cold: bool = False) -> float:
        self.last_seconds = None
        self._run(inputs, repeat)
        if self.last_seconds is None:
            raise CompileError(f"the Poplar program in {self.workdir} printed no rl_kernel_seconds line")
        return self.last_seconds
