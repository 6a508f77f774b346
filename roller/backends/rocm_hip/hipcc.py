"""Compile checks with hipcc, no AMD GPU needed: many kernels per hipcc call, resource usage from its remarks.

``check_artifacts(arts, hw, workdir)`` writes every kernel to ``workdir``, compiles all of them as one
translation unit (``hipcc -c -save-temps --offload-arch=<target> -Rpass-analysis=kernel-resource-usage``: one
clang start and one set of HIP headers for the lot), reads the per-kernel remarks (VGPRs, AGPRs, SGPRs,
spills, scratch, LDS, occupancy) and the number of ``v_mfma`` instructions in each kernel's device assembly,
and returns them by kernel name. Reports are cached by a hash of the kernel sources, the
flags and the hipcc version, under ``<roller cache>/hip-check/`` (``ROLLER_NO_CACHE=1`` turns it off).

``HIP_PLATFORM=amd`` goes into the environment of the hipcc process only: without it hipcc picks nvcc
whenever a CUDA toolkit is installed. Debian 12's hipcc is ROCm 5.2 (clang 15): it knows gfx906, gfx908,
gfx90a and gfx940 but not gfx942, so MI300X kernels (gfx942) are checked for gfx940, the same CDNA3 ISA
(``SUBSTITUTES``).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roller import cache
from roller.errors import CompileError, ToolchainError
from roller.settings import settings

if TYPE_CHECKING:
    from roller.backends import Artifact
    from roller.hw import HardwareDesc

INSTALL = "apt-get install hipcc"
FLAGS = ("-save-temps", "-O3", "-Rpass-analysis=kernel-resource-usage")
# Targets ROCm 5.2's clang cannot compile for, and the nearest one it can: gfx940 is the first CDNA3 part
# and shares gfx942's instruction set (MFMA shapes included), so register and LDS usage carry over.
SUBSTITUTES = {"gfx942": "gfx940"}
# SGPRs a wave can use on GFX9 (GCN5, CDNA1-3): 102 addressable, plus VCC, FLAT_SCRATCH and XNACK_MASK
# (2 each), which LLVM includes in the count it reports. Hardware descriptions do not carry this number.
SGPR_LIMIT = {"gfx9": 108, "gfx10": 106, "gfx11": 106}
# Vector registers one wave can address (v0-v255) on every AMD target; gfx90a and later also have as many AGPRs,
# in one file with the VGPRs, which descriptions count in max_registers_per_thread.
ARCH_VGPRS = 256
LDS_ALIGN = 16
#: most hipcc processes at once (CI machines have 2 cores; each clang is single-threaded)
MAX_JOBS = 2
# clang prints "FILE:L:C: remark: KEY: VALUE [-Rpass...]", or with -save-temps "remark: FILE:L:C: KEY: VALUE ..."
_REMARK = re.compile(r"^(?:remark: (?P<f1>[^:\n]+):\d+:\d+:|(?P<f2>[^:\n]+):\d+:\d+: remark:)"
                     r"\s+(?P<key>[^:]+?):\s+(?P<val>\S+)\s+\[-Rpass-analysis")
_ERROR_FILE = re.compile(r"^(?P<file>[^:\n]+):\d+:\d+: (?:fatal )?error:", re.MULTILINE)
# Back-end errors (LDS over the limit...) name the function, not a source line.
_ERROR_FUNC = re.compile(r"error: .* in function '(?P<name>\w+)'")
_KEYS = {"Function Name": "name", "SGPRs": "sgprs", "VGPRs": "vgprs", "AGPRs": "agprs",
         "ScratchSize [bytes/lane]": "scratch_bytes", "Occupancy [waves/SIMD]": "occupancy",
         "SGPRs Spill": "sgpr_spills", "VGPRs Spill": "vgpr_spills", "LDS Size [bytes/block]": "lds_bytes"}

_VERSION: dict[str, str] = {}


def find() -> str:
    """The hipcc to use: ``$ROLLER_HIPCC`` or the one on PATH; ToolchainError naming the install command."""
    exe = settings.hip.hipcc or shutil.which("hipcc")
    if not exe or not os.access(exe, os.X_OK):
        where = f" ($ROLLER_HIPCC={settings.hip.hipcc})" if settings.hip.hipcc else ""
        raise ToolchainError(f"hipcc not found{where}: {INSTALL} (Debian 12: ROCm 5.2's HIP compiler, no GPU needed)")
    return exe


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["HIP_PLATFORM"] = "amd"
    return env


def version() -> str:
    """hipcc's version text, or ``none`` when there is no hipcc (a build only renders: it needs none)."""
    try:
        exe = find()
    except ToolchainError:
        return "none"
    if exe not in _VERSION:
        try:
            out = subprocess.run([exe, "--version"], env=environment(), capture_output=True, text=True, check=False,
                                 timeout=120)
            text = " | ".join(line.strip() for line in out.stdout.splitlines()
                              if line.startswith("HIP version") or "clang version" in line)
        except (OSError, subprocess.SubprocessError):
            text = ""
        _VERSION[exe] = text or "unknown"
    return _VERSION[exe]


def compile_target(hw: HardwareDesc) -> str:
    """The --offload-arch for a description (its target, or the substitute hipcc 5.2 knows)."""
    return SUBSTITUTES.get(hw.target, hw.target)


def arch_flags(hw: HardwareDesc, arch: str | None = None) -> list[str]:
    """--offload-arch (the description's target, or ``arch``: a device present here), and on RDNA (gfx10+,
    where both widths exist) the wavefront width the description states."""
    arch = arch or compile_target(hw)
    flags = [f"--offload-arch={arch}"]
    if _family(arch) != "gfx9":
        flags.append("-mwavefrontsize64" if hw.parallelism.warp_size == 64 else "-mno-wavefrontsize64")
    return flags


def sgpr_limit(hw: HardwareDesc) -> int:
    return SGPR_LIMIT.get(_family(hw.target), SGPR_LIMIT["gfx9"])


def _family(target: str) -> str:
    m = re.match(r"gfx(\d+?)(\d{2}|\d[0-9a-f])$", target)
    return f"gfx{m.group(1)}" if m else "gfx9"


@dataclass
class Unit:
    """One hipcc call: kernels for one target."""

    label: str
    arts: list[Artifact]
    hw: HardwareDesc
    workdir: Path


def check_artifacts(arts: Sequence[Artifact], hw: HardwareDesc, workdir: Path,
                    label: str | None = None) -> dict[str, dict[str, Any]]:
    """Compile ``arts`` for ``hw`` in one hipcc call; resource usage per kernel name (see module doc)."""
    return check_units([Unit(label or hw.name, list(arts), hw, Path(workdir))])[0]


def check_units(units: Sequence[Unit], jobs: int = MAX_JOBS) -> list[dict[str, dict[str, Any]]]:
    """Several hipcc calls, at most ``jobs`` at once; results in the order of ``units``."""
    find()
    if len(units) <= 1 or jobs <= 1:
        return [_check_unit(u) for u in units]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_check_unit, units))


def _check_unit(unit: Unit) -> dict[str, dict[str, Any]]:
    names = [a.kernel_name for a in unit.arts]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"kernel names repeat in one translation unit: {', '.join(dup)}")
    flags = [*arch_flags(unit.hw), *FLAGS]
    key = _key(unit, flags)
    cached = cache.load_result("hip-check", key)
    if isinstance(cached, dict):
        return cached
    folder = unit.workdir / unit.label
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for art in unit.arts:
        path = folder / f"{art.kernel_name}.{art.main_file.rsplit('.', 1)[-1]}"
        path.write_text(art.source, encoding="utf-8")
        # The unit holds the sources themselves (not #includes) so that its hash is their content; #line
        # makes diagnostics and remarks name each kernel's own file.
        parts.append(f'#line 1 "{path}"\n{art.source}')
    tu = folder / "unit.hip"
    tu.write_text("".join(parts), encoding="utf-8")
    # -save-temps keeps the device assembly (in the working folder), where the MFMA instructions are counted.
    cmd = [find(), "-c", *flags, tu.name, "-o", "unit.o"]
    try:
        proc = subprocess.run(cmd, env=environment(), capture_output=True, text=True, check=False, timeout=1800,
                              cwd=folder)
    except subprocess.TimeoutExpired:
        raise CompileError(f"hipcc took over 30 minutes on {tu}\nrepro: {_repro(cmd, folder)}") from None
    log = proc.stderr + proc.stdout
    if proc.returncode != 0:
        paths = {a.kernel_name: str(folder / f"{a.kernel_name}.{a.main_file.rsplit('.', 1)[-1]}") for a in unit.arts}
        bad = set(_ERROR_FILE.findall(log)) | {paths[n] for n in _ERROR_FUNC.findall(log) if n in paths}
        # Only diagnostics: remarks are the resource report, and back-end errors repeat a location note.
        errors = [line for line in log.splitlines() if "remark:" not in line
                  and "could not determine the original source location" not in line]
        tail = "\n".join(errors[:60])
        named = sorted(bad) or [str(tu)]
        raise CompileError(f"hipcc failed for {compile_target(unit.hw)} ({unit.hw.name}, {len(unit.arts)} kernels "
                           f"in one unit)\n{tail}\nkernel: {', '.join(named)}\nrepro: {_repro(cmd, folder)}")
    report = parse_remarks(log)
    asm = folder / f"unit-hip-amdgcn-amd-amdhsa-{compile_target(unit.hw)}.s"
    counts = count_matrix_instructions(asm.read_text(), set(names)) if asm.exists() else {}
    for name, n in counts.items():
        if name in report:
            report[name]["mfma"] = n
    for temp in folder.glob("unit-*"):
        if temp.suffix in (".cui", ".bc", ".o", ".out"):
            temp.unlink()  # preprocessed sources and bitcode: large, and nothing reads them
    missing = [n for n in names if n not in report]
    if missing:
        raise CompileError(f"hipcc reported no resource usage for {', '.join(missing)} ({unit.hw.name})\n"
                           f"repro: {_repro(cmd, folder)}")
    result = {n: report[n] for n in names}
    cache.store_result("hip-check", key, {n: {k: v for k, v in r.items() if k != "file"} for n, r in result.items()})
    return result


def count_matrix_instructions(asm: str, names: set[str]) -> dict[str, int]:
    """v_mfma instructions per kernel in device assembly: proof that a matrix kernel issues them."""
    counts = dict.fromkeys(names, 0)
    current = None
    for line in asm.splitlines():
        m = re.match(r"^(\w+):", line)
        if m and m.group(1) in names:
            current = m.group(1)
        elif line.startswith(".Lfunc_end"):
            current = None
        elif current is not None and line.strip().startswith("v_mfma"):
            counts[current] += 1
    return counts


def parse_remarks(log: str) -> dict[str, dict[str, Any]]:
    """Per kernel: the numbers of clang's kernel-resource-usage remarks, plus the file that defines it."""
    out: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in log.splitlines():
        m = _REMARK.match(line)
        if not m or m["key"] not in _KEYS:
            continue
        field = _KEYS[m["key"]]
        if field == "name":
            current = {"file": m["f1"] or m["f2"], "agprs": 0}
            out[m["val"]] = current
        elif current is not None:
            current[field] = int(m["val"])
    return out


def limits_report(usage: dict[str, Any], hw: HardwareDesc, block: int, smem_bytes: int,
                  n_buffers: int) -> list[str]:
    """What in ``usage`` breaks the description's limits (empty when nothing does).

    Registers: VGPRs (plus AGPRs where the file is unified, gfx90a and later) within
    ``max_registers_per_thread``; the block's waves, spread over the unit's SIMDs, within the unit's register
    file; SGPRs within the ISA's count; no spills or scratch. LDS: what the compiler allocated equals the
    kernel plan's staging buffers and fits ``capacity_per_block_bytes``."""
    par = hw.parallelism
    problems = []
    unified = compile_target(hw) not in ("gfx906", "gfx908") and _family(hw.target) == "gfx9"
    vregs = usage["vgprs"] + (usage.get("agprs", 0) if unified else 0)
    if vregs > par.max_registers_per_thread:
        problems.append(f"{vregs} vector registers > max_registers_per_thread {par.max_registers_per_thread}")
    if not unified and usage.get("agprs", 0) > par.max_registers_per_thread:
        problems.append(f"{usage['agprs']} AGPRs > {par.max_registers_per_thread}")
    waves = -(-block // par.warp_size)
    per_simd = -(-waves // max(1, par.sub_partitions))
    simd_regs = par.registers_per_unit // max(1, par.sub_partitions)
    if per_simd * vregs * par.warp_size > simd_regs:
        problems.append(f"block of {block} threads ({per_simd} waves per SIMD) x {vregs} registers x "
                        f"{par.warp_size} lanes > {simd_regs} registers per SIMD")
    if usage["sgprs"] > sgpr_limit(hw):
        problems.append(f"{usage['sgprs']} SGPRs > {sgpr_limit(hw)}")
    for key in ("vgpr_spills", "sgpr_spills", "scratch_bytes"):
        if usage.get(key, 0):
            problems.append(f"{key} = {usage[key]}")
    cap = next((m.capacity_per_block_bytes for m in hw.memory if m.scope == "block"), None) or 0
    if usage["lds_bytes"] > cap:
        problems.append(f"LDS {usage['lds_bytes']} B > capacity_per_block_bytes {cap}")
    # The compiler aligns each __shared__ array (to 16 bytes at most), so LDS may exceed their sum by that.
    if not smem_bytes <= usage["lds_bytes"] <= smem_bytes + LDS_ALIGN * n_buffers:
        problems.append(f"LDS {usage['lds_bytes']} B is not the plan's {n_buffers} staging buffers "
                        f"({smem_bytes} B, up to {LDS_ALIGN}-byte alignment each)")
    if usage.get("occupancy", 1) < 1:
        problems.append("occupancy 0 waves/SIMD: the kernel cannot launch")
    return problems


def _repro(cmd: list[str], cwd: Path | None = None) -> str:
    where = f"cd {shlex.quote(str(cwd))} && " if cwd else ""
    return where + "HIP_PLATFORM=amd " + " ".join(shlex.quote(c) for c in cmd)


def _key(unit: Unit, flags: list[str]) -> str:
    return cache.result_key(json.dumps([version(), flags, compile_target(unit.hw)]),
                            *(part for art in unit.arts for part in (art.kernel_name, art.source)))


#: hipcc runs that built a code object in this process (``code_object``; a cached one counts none)
CODE_OBJECT_BUILDS = {"count": 0}


def code_object(art: Artifact, hw: HardwareDesc, arch: str, folder: Path) -> bytes:
    """``art`` compiled for ``arch`` (``--genco``: the code object ``hipModuleLoadData`` takes), from Roller's
    checksummed cache where an earlier build kept it, else by hipcc and then kept; CompileError with the log and
    a repro where hipcc fails."""
    flags = ["--genco", "-O3", *arch_flags(hw, arch)]
    key = cache.result_key("hip-code-object", version(), arch, " ".join(flags), art.kernel_name, art.source)
    doc = cache.load_result("hip-code-object", key)
    digest = doc.get("sha256") if isinstance(doc, dict) else None
    stored = cache.load_blob("hip-code-object", key, digest) if isinstance(digest, str) else None
    if stored is not None:
        return stored
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / art.main_file
    src.write_text(art.source, encoding="utf-8")
    co = folder / f"{art.kernel_name}-{arch}.co"
    cmd = [find(), *flags, str(src), "-o", str(co)]
    try:
        proc = subprocess.run(cmd, env=environment(), capture_output=True, text=True, check=False, timeout=600)
    except subprocess.TimeoutExpired:
        raise CompileError(f"hipcc took over 10 minutes on {art.kernel_name} ({arch})\nrepro: {_repro(cmd)}") from None
    if proc.returncode != 0:
        raise CompileError(f"hipcc failed for {art.kernel_name} ({arch})\n{proc.stderr.strip()[-4000:]}\n"
                           f"kernel: {src}\nrepro: {_repro(cmd)}")
    CODE_OBJECT_BUILDS["count"] += 1
    data = co.read_bytes()
    cache.store_result("hip-code-object", key, {"sha256": cache.store_blob("hip-code-object", key, data)})
    return data
