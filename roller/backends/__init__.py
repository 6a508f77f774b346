"""Backend contract and registry.

A backend turns an rProgram into source, compiles it, and (where the device is here) runs and times it.
Backends live in the sub-packages of ``roller.backends``; each defines ``BACKEND``, an instance of a
``Backend`` subclass that declares, once, every fact about it the rest of Roller needs: the description
``backend`` value it serves, the target pattern those descriptions must match, the settings that change what
it builds (part of the cache key), the dtypes and matrix instructions it renders, and its toolchain's version.
The registry finds them by scanning the package, so the core never names one: the hardware loader asks the
registry which ``backend`` values and targets are valid, construction is handed a backend's matrix
capabilities as a parameter.
"""
from __future__ import annotations

import abc
import importlib
import os
import pkgutil
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from roller.errors import InputError, ToolchainError
from roller.runtime.device import Device, Runner

if TYPE_CHECKING:
    from roller.construction.matrix import MatrixSupport
    from roller.hw import HardwareDesc
    from roller.program import RProgram


@dataclass
class Artifact:
    """What rendering produced: the files a build writes, and the launch description."""

    kernel_name: str
    files: dict[str, str]  # file name -> text (kernel source first)
    launch: dict[str, Any]  # grid, block, argument order, shapes, dtypes
    main_file: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def source(self) -> str:
        return self.files[self.main_file]


class Backend(abc.ABC):
    """One code generator and its toolchain. Subclasses declare the class attributes below and implement the
    abstract methods; nothing outside the subclass restates these facts."""

    #: the backend's name (``--backend NAME``) and the ``backend`` value of the descriptions it serves
    name: ClassVar[str]
    #: the file extension of the kernel source it writes
    file_ext: ClassVar[str]
    #: a regular expression every description of this backend's ``target`` must match in full, and what that
    #: looks like in words ("a CUDA target like sm_70")
    target_pattern: ClassVar[str]
    target_hint: ClassVar[str]
    #: element types it renders
    dtypes: ClassVar[tuple[str, ...]] = ("float32",)
    #: matrix instructions it renders (construction offers matrix programs for these only)
    matrix_support: ClassVar[tuple[MatrixSupport, ...]] = ()
    #: whether it renders and launches split-K programs (``RProgram.reduce_threads`` > 1: a second kernel that
    #: sums partials from a workspace, roller/construction/splitk.py); construction offers them only then
    split_k: ClassVar[bool] = False
    #: whether it renders vector grid-stride programs (``RProgram.vector`` > 1, roller/construction/stream.py);
    #: construction offers them only then
    vector_programs: ClassVar[bool] = False
    #: ``parallelism`` keys a description of this backend must give (optional for the others)
    required_parallelism: ClassVar[tuple[str, ...]] = ()
    #: environment variables (``roller.settings``) that change what it renders or compiles: part of the
    #: cache key of every kernel it builds
    cache_env: ClassVar[tuple[str, ...]] = ()
    #: True when kernels of every description can run through it on a CPU here (shown in hints)
    runs_any_description: ClassVar[bool] = False
    #: whether it renders typed bodies (integer and bool element types, ``roller.ir.types``); the others refuse
    #: such an op in one line before constructing it
    typed_bodies: ClassVar[bool] = False
    #: whether it renders row kernels (``TensorExpr.stages``: one-kernel softmax and layer norm); the fusion
    #: pass builds them only for backends that do
    row_kernels: ClassVar[bool] = True
    #: whether its kernels decode the block index with the leading axis outermost and can be launched on a
    #: prefix of their grid (``Runner.with_launch``): what a shape-generic kernel set needs
    sub_grid: ClassVar[bool] = True
    #: names of descriptions it measures on this machine instead of reading them from a file (``--hw host``):
    #: ``roller.hw.load`` resolves them through ``local_description``
    local_names: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def render(self, prog: RProgram, hw: HardwareDesc) -> Artifact:
        """The files and launch description of ``prog`` on ``hw``."""

    @abc.abstractmethod
    def can_run_here(self) -> bool:
        """True when a device of this backend is present on this machine."""

    def why_not_here(self) -> str:
        return f"no {self.name} device on this machine"

    def toolchain_version(self) -> str:
        """What compiles the kernels here (part of the cache key); ``none`` where nothing can."""
        return "none"

    @abc.abstractmethod
    def compile(self, art: Artifact, hw: HardwareDesc, workdir: Path | None = None) -> Runner:
        """The kernel compiled for this machine's device."""

    def compile_many(self, arts: Sequence[Artifact], hw: HardwareDesc, jobs: int | None = None,
                     use_cache: bool = True) -> list[Runner]:
        """Each kernel compiled for this machine's device and ready for its first launch (``Runner.prepare``),
        ``jobs`` at a time (compilers run outside the interpreter's lock); a backend whose compiler does better
        with many kernels at once, or that keeps compiled code in Roller's cache (``use_cache``), overrides it."""
        def one(art: Artifact) -> Runner:
            runner = self.compile(art, hw, None)
            runner.prepare()
            return runner

        workers = max(1, min(len(arts) or 1, jobs or os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, arts))

    @abc.abstractmethod
    def check_compiles(self, art: Artifact, hw: HardwareDesc, workdir: Path) -> dict[str, Any]:
        """Compile without running (for devices absent here); returns resource usage."""

    def local_description(self, name: str) -> Path:
        """The YAML file of the description ``name`` (one of ``local_names``) of this machine's device,
        measured the first time and cached; ToolchainError where there is no such device."""
        raise InputError(f"the {self.name} backend measures no description named {name!r}", field="--hw")

    def device(self) -> Device:
        """This machine's device of this backend, for executors that keep data on it; ToolchainError
        where there is none (or where the backend cannot yet keep data on it)."""
        raise ToolchainError(f"the {self.name} backend cannot run a model on this machine: "
                             f"{self.why_not_here() or 'it has no device executor'}")

    def matches_target(self, target: str) -> bool:
        return re.fullmatch(self.target_pattern, target) is not None


def _discover() -> dict[str, Backend]:
    found: dict[str, Backend] = {}
    pkg_path = [str(Path(__file__).parent)]
    for info in pkgutil.iter_modules(pkg_path):
        if not info.ispkg or info.name.startswith("_") or info.name == "c_family":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        backend = getattr(module, "BACKEND", None)
        if isinstance(backend, Backend):
            found[backend.name] = backend
    return found


_REGISTRY: dict[str, Backend] | None = None


def registry() -> dict[str, Backend]:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _discover()
    return _REGISTRY


def names() -> list[str]:
    return sorted(registry())


def get(name: str) -> Backend:
    reg = registry()
    if name not in reg:
        raise InputError(f"unknown backend {name!r}; expected one of {', '.join(sorted(reg))}",
                         field="--backend")
    return reg[name]


def for_hw(hw: HardwareDesc, name: str | None = None) -> Backend:
    """The backend named, or the one serving the description's ``backend`` field."""
    if name:
        return get(name)
    found = registry().get(hw.backend)
    if found is None:
        raise InputError(f"no backend serves {hw.backend!r} (description {hw.name})", field="backend")
    return found


def schema_rules() -> tuple[list[str], list[dict[str, Any]]]:
    """What the JSON schema for editors (roller/hwdesc/schema.json) says about backends, derived from the
    declarations: the ``backend`` values, and per backend an ``if``/``then`` rule on the target and the
    parallelism keys it requires. ``scripts/update_schema.py`` writes these into the file; a test checks it, and
    the hardware loader reads them from there (``roller.hw.rules``)."""
    rules: list[dict[str, Any]] = []
    for b in sorted(registry().values(), key=lambda b: b.name):
        then: dict[str, Any] = {"target": {"pattern": f"^(?:{b.target_pattern})$", "description": b.target_hint}}
        if b.required_parallelism:
            then["parallelism"] = {"required": list(b.required_parallelism)}
        rules.append({"$comment": f"backend {b.name}", "if": {"properties": {"backend": {"const": b.name}},
                                                              "required": ["backend"]},
                      "then": {"properties": then}})
    return names(), rules


def runs_here_instead() -> list[str]:
    """Backends that run any description's kernels on this machine's CPU (for hints)."""
    return [b.name for b in registry().values() if b.runs_any_description]


def ordered_inputs(launch: Mapping[str, Any], bound: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Inputs in the kernel's argument order (launch.json), from arrays by tensor name."""
    return [bound[a["name"]] for a in launch["arguments"] if a.get("role") == "input"]


def require_device(backend: Backend, hw: HardwareDesc | None = None, why: str = "") -> None:
    """ToolchainError (exit 5) unless ``backend`` can run kernels on this machine."""
    if backend.can_run_here():
        return
    reason = backend.why_not_here() or f"no {backend.name} device on this machine"
    instead = [name for name in runs_here_instead() if name != backend.name]
    hint = ""
    if instead:
        hint = (f" (the {instead[0]} backend runs every description's kernels on this machine's device: add "
                f"--backend {instead[0]})")
    target = f" for {hw.name}" if hw is not None else ""
    raise ToolchainError(f"{why or 'running kernels'} needs the {backend.name} backend{target} on this "
                         f"machine: {reason}{hint}")
