"""The machine code of a compiled kernel, read with cuobjdump: what a kernel claims to do (cp.async pipelines,
16-byte accesses, tensor-core MMAs, no spills) asserted on the instructions the GPU will run, without a GPU.

cuobjdump and the nvdisasm it runs ship with the CUDA toolkit and on PyPI (``nvidia-cuda-cuobjdump``,
``nvidia-cuda-nvdisasm``, in the dev extras); a cubin from nvcc 13 needs version 13 or newer.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from roller.errors import ToolchainError

#: an instruction line of cuobjdump -sass: ``/*0040*/  @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;``
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def tool_path(name: str) -> str | None:
    """``name`` (cuobjdump, nvdisasm) from CUDA_HOME, PATH, or the ``nvidia-cuda-<name>`` wheel beside this
    interpreter."""
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / name).exists():
            return str(Path(home) / "bin" / name)
    found = shutil.which(name)
    if found:
        return found
    for site in map(Path, sys.path):
        for wheel in sorted(site.glob(f"nvidia/cu*/bin/{name}"), reverse=True):
            return str(wheel)
    return None


def available() -> bool:
    """Whether SASS can be read here: cuobjdump disassembles through nvdisasm."""
    return tool_path("cuobjdump") is not None and tool_path("nvdisasm") is not None


def instructions(cubin: Path, kernel: str | None = None) -> list[str]:
    """The opcodes (with their modifiers, e.g. ``LDG.E.128``) of ``cubin``'s kernels, or of ``kernel`` alone,
    in program order."""
    tool, disasm = tool_path("cuobjdump"), tool_path("nvdisasm")
    if tool is None or disasm is None:
        raise ToolchainError("cuobjdump or nvdisasm not found: install nvidia-cuda-cuobjdump and "
                             "nvidia-cuda-nvdisasm, or the CUDA toolkit")
    cmd = [tool, "-sass", *(["-fun", kernel] if kernel else []), str(cubin)]
    env = {**os.environ, "NVDISASM_PATH": str(Path(disasm).parent)}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise ToolchainError(f"cuobjdump {cubin.name}: {proc.stderr.strip().splitlines()[-1:] or proc.returncode}")
    # ``@!PT`` (predicated on never) instructions are placeholders ptxas emits after cp.async commits: never run
    return [m.group(1) for m in map(_INSTRUCTION.search, proc.stdout.splitlines()) if m and "@!PT " not in m.group(0)]


def count(ops: list[str], prefix: str) -> int:
    """How many opcodes are ``prefix`` or ``prefix`` with more modifiers: ``LDG.E.128`` counts
    ``LDG.E.128.CONSTANT``, ``BAR.SYNC`` counts ``BAR.SYNC.DEFER_BLOCKING``, ``LDG`` every global load."""
    return sum(op == prefix or op.startswith(prefix + ".") for op in ops)
