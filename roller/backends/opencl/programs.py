"""A model's kernels compiled as one OpenCL program, and the compiled program kept in Roller's cache.

Where the time of a cold build went on PoCL (3.1, this machine's 2 cores): every ``clBuildProgram`` costs
about 0.55 s whatever the source holds (clang, and linking PoCL's kernel library into the module), and each
kernel's work-group function (compiled at its first launch, or when the binary is asked for) 0.03-0.3 s more.
PoCL serialises its LLVM work behind one lock, so building kernels in parallel threads gained nothing: 31
kernels took 31 builds one after another. One program holding 31 copies of a 3x3 convolution built in 1.1 s,
where one copy alone took 0.55-0.63 s (31 programs: about 17 s at that rate, not timed as such).

The compiled program (``clGetProgramInfo(CL_PROGRAM_BINARIES)``: PoCL serialises the module and the
work-group functions compiled so far) goes into the cache, with one index entry per kernel naming the program
that holds it, so that a warm build, or one where a single layer changed, compiles only the kernels no stored
program holds. Asking for the binary compiles each kernel's generic work-group function, the one PoCL launches
when it does not specialise them (``POCL_WORK_GROUP_SPECIALIZATION=0``, set by ``env.py``); a program loaded
from its binary then launches without compiling anything, even with PoCL's own cache empty.

``COUNTS`` counts what the device compiler did in this process (tests and ``bench/compile_time.py`` read it).
"""
from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roller import cache
from roller.backends import Artifact
from roller.backends.opencl.env import POCL_DEFAULTS, import_opencl
from roller.errors import CompileError

#: bump when what a stored program holds, or how it is keyed, changes
FORMAT = "1"
#: this process's device compiles: programs built from source, the kernels in them, programs loaded from the
#: cache, and kernels taken from those
COUNTS = {"source_builds": 0, "kernels_compiled": 0, "binary_loads": 0, "kernels_loaded": 0}
_COUNT_LOCK = threading.Lock()


def count(**more: int) -> None:
    with _COUNT_LOCK:
        for k, v in more.items():
            COUNTS[k] += v


@dataclass(frozen=True)
class BuildSite:
    """Where programs are built: the context and device (pyopencl's), the build options, and ``environment``,
    what a compiled program depends on besides its source (``environment()``)."""

    ctx: Any
    dev: Any
    options: tuple[str, ...]
    environment: str


def environment(options: Sequence[str], device: str) -> str:
    """``device`` (its platform, version, name and driver), the build options, and the PoCL settings that
    change the code it generates."""
    env = " ".join(f"{k}={os.environ.get(k, '')}" for k in sorted({*POCL_DEFAULTS, "POCL_EXTRA_BUILD_FLAGS"}))
    return f"{device} | {' '.join(options)} | {env}"


def kernel_key(art: Artifact, on: BuildSite) -> str:
    return cache.result_key("opencl-kernel", FORMAT, on.environment, art.kernel_name, art.source)


def build_error(art: Artifact, workdir: Path | None, err: Exception) -> CompileError:
    """The error of a kernel that failed to compile: the compiler's log, where its source is kept, and a
    command that repeats the failure."""
    path = _keep_source(art, workdir)
    script = (f"import pyopencl as cl; ctx=cl.create_some_context(False); "
              f"cl.Program(ctx, open({str(path)!r}).read()).build()")
    repro = shlex.join(["python", "-c", script])  # quoted for any path a shell might mangle
    return CompileError(f"OpenCL build of {art.kernel_name} failed\n{str(err).strip()}\nkernel: {path}\n"
                        f"repro: {repro}")


def _keep_source(art: Artifact, workdir: Path | None) -> Path:
    """Where a kernel that failed to compile is kept for the repro command: in ``workdir`` when given, else as
    one file per distinct source in the kernel cache's ``failed/`` folder (``roller cache clear`` empties it),
    so that failures leave no temporary folder behind and the same failure twice keeps one file."""
    if workdir is not None:
        folder = Path(workdir)
        path = folder / art.main_file
    else:
        digest = hashlib.sha256(art.source.encode()).hexdigest()[:12]
        folder = cache.cache_dir() / "failed"
        path = folder / f"{art.kernel_name}-{digest}.{art.main_file.rsplit('.', 1)[-1]}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(art.source)
    except OSError:  # an unwritable cache: the shared temporary folder, still one file per source
        folder = Path(tempfile.gettempdir()) / "roller-failed-kernels"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / path.name
        path.write_text(art.source)
    return path


#: an entry of a program: the artifact and the name its kernel has there
Entry = tuple[Artifact, str]


def entries(arts: Sequence[Artifact]) -> list[Entry]:
    """Each artifact with a name unique in one program: its own, or, for a second kernel of a name (the top-K
    candidates of one operator all have its name), ``<name>__r<n>``."""
    taken = {a.kernel_name for a in arts}
    seen: set[str] = set()
    out = []
    for art in arts:
        name = art.kernel_name
        if name in seen:
            n = 1
            while f"{art.kernel_name}__r{n}" in taken:
                n += 1
            name = f"{art.kernel_name}__r{n}"
            taken.add(name)
        seen.add(name)
        out.append((art, name))
    return out


def program_source(program: Sequence[Entry]) -> str:
    """The kernels' sources one after another (their helpers are guarded, so each is defined once). A kernel
    named otherwise in the program is renamed by the preprocessor, token by token inside its own source only; a
    name that was also some other identifier there fails to compile together, and is then built alone."""
    parts = []
    for art, name in program:
        if name == art.kernel_name:
            parts.append(art.source)
        else:
            parts.append(f"#define {art.kernel_name} {name}\n{art.source}\n#undef {art.kernel_name}")
    return "\n".join(parts)


def load_cached(arts: Sequence[Artifact], on: BuildSite) -> dict[str, tuple[Any, str]]:
    """kernel key -> (the program, loaded from its stored binary, that holds the kernel; its name there), for
    each artifact whose program the cache has; each stored program loaded once."""
    cl = import_opencl()
    loaded: dict[str, Any] = {}
    out: dict[str, tuple[Any, str]] = {}
    for art in arts:
        key = kernel_key(art, on)
        index = cache.load_result("opencl-kernel", key)
        pkey = index.get("program") if isinstance(index, dict) else None
        entry = index.get("entry") if isinstance(index, dict) else None
        if not isinstance(pkey, str) or not isinstance(entry, str):
            continue
        if pkey not in loaded:
            loaded[pkey] = None
            doc = cache.load_result("opencl-program", pkey)
            digest = doc.get("binary_sha256") if isinstance(doc, dict) else None
            binary = cache.load_blob("opencl-program", pkey, digest) if isinstance(digest, str) else None
            if binary is not None:
                try:
                    loaded[pkey] = cl.Program(on.ctx, [on.dev], [binary]).build(options=list(on.options))
                    count(binary_loads=1)
                except (cl.Error, ValueError):   # a binary this driver no longer takes: built again
                    loaded[pkey] = None
        prg = loaded[pkey]
        if prg is not None and entry in prg.kernel_names.split(";"):
            out[key] = (prg, entry)
            count(kernels_loaded=1)
    return out


def split(program: Sequence[Entry], parts: int) -> list[list[Entry]]:
    """``program`` in at most ``parts`` programs of about equal compile work (a kernel's source length stands for
    its work-group function's compile time), largest first into the lightest part; each part keeps the order."""
    bins: list[list[int]] = [[] for _ in range(max(1, min(parts, len(program))))]
    load = [0] * len(bins)
    for i in sorted(range(len(program)), key=lambda i: -len(program[i][0].source)):
        j = load.index(min(load))
        bins[j].append(i)
        load[j] += len(program[i][0].source)
    return [[program[i] for i in sorted(b)] for b in bins if b]


#: kernels a child process must have to be worth starting (it costs ~0.8 s: Python, PoCL, clang's fixed cost)
MIN_PER_PROCESS = 4


def build_all(arts: Sequence[Artifact], on: BuildSite, workdir: Path | None, use_cache: bool,
              jobs: int | None = None) -> dict[str, tuple[Any, str]]:
    """kernel key -> (program, the kernel's name there), for ``arts`` (distinct kernels), built from source:
    split over ``jobs`` processes where there are enough kernels for that to pay (PoCL compiles one kernel at a
    time in a process: this one builds the first part while child processes build the others and hand back
    their binaries)."""
    jobs = max(1, jobs or os.cpu_count() or 1)
    parts = split(entries(arts), min(jobs, len(arts) // MIN_PER_PROCESS))
    with ThreadPoolExecutor(max_workers=len(parts) or 1) as pool:
        futures = [pool.submit(build, part, on, workdir, use_cache, i > 0) for i, part in enumerate(parts)]
        built = [f.result() for f in futures]
    return {kernel_key(art, on): found[i] for part, found in zip(parts, built) for i, (art, _) in enumerate(part)}


def build(program: Sequence[Entry], on: BuildSite, workdir: Path | None, use_cache: bool, in_child: bool = False
          ) -> list[tuple[Any, str]]:
    """(program, name) of each entry: one program built from source (``in_child``: by a child process, whose
    binary is loaded here), every kernel's work-group function compiled, and stored in the cache with an index
    entry per kernel. Where the whole fails to build, each kernel is built alone: the one that fails raises its
    CompileError (``build_error``); if none does, they run from their own programs."""
    cl = import_opencl()
    source = program_source(program)
    binary = _child_build(source, on) if in_child else None
    prg = None
    if binary is not None:
        try:
            prg = cl.Program(on.ctx, [on.dev], [binary]).build(options=list(on.options))
        except (cl.Error, ValueError):   # another device's binary: built here instead
            prg = None
    if prg is None or binary is None:
        try:
            prg = cl.Program(on.ctx, source).build(options=list(on.options))
        except cl.RuntimeError as err:
            if len(program) == 1 and program[0][1] == program[0][0].kernel_name:
                raise build_error(program[0][0], workdir, err) from None
            return [found for art, _ in program
                    for found in build([(art, art.kernel_name)], on, workdir, use_cache)]
        # The binary: PoCL compiles each kernel's work-group function to make it (what the first launch would
        # otherwise compile, one kernel at a time).
        binary = bytes(prg.binaries[0])
    count(source_builds=1, kernels_compiled=len(program))
    if use_cache and cache.enabled():
        pkey = cache.result_key("opencl-program", FORMAT, on.environment, source)
        digest = cache.store_blob("opencl-program", pkey, binary)
        cache.store_result("opencl-program", pkey, {"kernels": [name for _, name in program],
                                                    "binary_sha256": digest})
        for art, name in program:
            cache.store_result("opencl-kernel", kernel_key(art, on), {"program": pkey, "entry": name})
    return [(prg, name) for _, name in program]


#: seconds a child's compile may take before this process builds its part itself (DenseNet-121's half: 20 s)
CHILD_TIMEOUT_S = 600
#: what a child process runs: pyopencl alone (importing Roller took most of a child's second), the device
#: named by platform name and version and its index there; PoCL's settings come with the environment
CHILD = """
import sys
import pyopencl as cl
platform, version, index, source, binary, *options = sys.argv[1:]
dev = [p for p in cl.get_platforms() if p.name == platform and p.version == version][0].get_devices()[int(index)]
ctx = cl.Context([dev])
with open(source, encoding="utf-8") as f:
    prg = cl.Program(ctx, f.read()).build(options=options)
with open(binary, "wb") as f:
    f.write(prg.binaries[0])
"""


def _child_build(source: str, on: BuildSite) -> bytes | None:
    """The program's binary, built by a child process on ``on``'s device; None where that fails (the caller
    then builds it here, and reports a compile error there)."""
    dev = on.dev
    index = dev.platform.get_devices().index(dev)
    with tempfile.TemporaryDirectory(prefix="roller-cl-") as tmp:
        src, out = Path(tmp) / "program.cl", Path(tmp) / "program.bin"
        src.write_text(source, encoding="utf-8")
        try:
            done = subprocess.run([sys.executable, "-c", CHILD, dev.platform.name, dev.platform.version, str(index),
                                   str(src), str(out), *on.options], capture_output=True, check=False,
                                  timeout=CHILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0 or not out.is_file():
            return None
        return out.read_bytes()
