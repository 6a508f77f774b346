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
import pkgutil
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from roller.errors import InputError

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


class Runner(abc.ABC):
    """A compiled kernel on a device: call it with numpy inputs, time it, or launch it on device buffers."""

    @abc.abstractmethod
    def __call__(self, inputs: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """Run once on ``inputs`` (in launch.json's argument order); the output array."""

    @abc.abstractmethod
    def time(self, inputs: list[np.ndarray], repeat: int = 10, warmup: int = 2, cold: bool = False) -> float:
        """Median kernel time in seconds; with ``cold``, with the device's caches overwritten before each run
        where the backend can do that (OpenCL), as they are hot otherwise."""

    def launch(self, buffers: list[Any]) -> Any:
        """Enqueue one run on ``buffers`` of this backend's ``Device`` (inputs in argument order, then the
        output), after everything enqueued before; returns the launch's event where the device has one."""
        raise NotImplementedError(f"{type(self).__name__} cannot launch on device buffers")

    def with_launch(self, blocks: int, shapes: Sequence[tuple[int, ...]], scalars: Sequence[int] = ()) -> Runner:
        """This kernel launched on its first ``blocks`` blocks, with arguments of ``shapes`` (the inputs as it
        reads them, padded where it reads a padded copy, then the output) and, where given, ``scalars`` for its
        int parameters (launch.json's ``scalars``: a kernel with runtime extents takes the symbol's value): how a
        shape-generic kernel (``roller.construction.generic``) runs a size below the one it was built for."""
        raise NotImplementedError(f"{type(self).__name__} launches the grid it was built with only")


class Device(abc.ABC):
    """The memory of one device on this machine and the queue its work runs in, in order: what a graph
    executor needs to keep data on the device between kernels. Counts what crosses to and from the host."""

    def __init__(self) -> None:
        self.uploads = self.downloads = 0
        self.uploaded_bytes = self.downloaded_bytes = 0

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The device, in words."""

    @abc.abstractmethod
    def alloc(self, nbytes: int) -> Any:
        """A buffer of ``nbytes`` (uninitialised)."""

    def upload(self, buf: Any, array: np.ndarray) -> None:
        """Copy a contiguous host array (already in the buffer's storage type) into ``buf``."""
        self.uploads += 1
        self.uploaded_bytes += array.nbytes
        self._upload(buf, array)

    def download(self, buf: Any, array: np.ndarray) -> None:
        """Copy ``buf`` into a contiguous host array of its storage type, after all work enqueued before."""
        self.downloads += 1
        self.downloaded_bytes += array.nbytes
        self._download(buf, array)

    @abc.abstractmethod
    def _upload(self, buf: Any, array: np.ndarray) -> None: ...

    @abc.abstractmethod
    def _download(self, buf: Any, array: np.ndarray) -> None: ...

    @abc.abstractmethod
    def copy(self, dst: Any, src: Any, src_offset: int, dst_offset: int, region: tuple[int, int, int],
             src_pitches: tuple[int, int], dst_pitches: tuple[int, int]) -> None:
        """A strided device-to-device copy, in order with the kernels: ``region`` is (bytes per row, rows,
        slices), pitches in bytes (row, slice)."""

    @abc.abstractmethod
    def finish(self) -> None:
        """Wait for everything enqueued."""


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
    #: ``parallelism`` keys a description of this backend must give (optional for the others)
    required_parallelism: ClassVar[tuple[str, ...]] = ()
    #: environment variables (``roller.settings``) that change what it renders or compiles: part of the
    #: cache key of every kernel it builds
    cache_env: ClassVar[tuple[str, ...]] = ()
    #: True when kernels of every description can run through it on a CPU here (shown in hints)
    runs_any_description: ClassVar[bool] = False
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
        from roller.errors import ToolchainError

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
    parallelism keys it requires. ``scripts/update_schema.py`` writes these into the file; a test checks it."""
    rules: list[dict[str, Any]] = []
    for b in sorted(registry().values(), key=lambda b: b.name):
        then: dict[str, Any] = {"target": {"pattern": f"^(?:{b.target_pattern})$"}}
        if b.required_parallelism:
            then["parallelism"] = {"required": list(b.required_parallelism)}
        rules.append({"$comment": f"backend {b.name}", "if": {"properties": {"backend": {"const": b.name}},
                                                              "required": ["backend"]},
                      "then": {"properties": then}})
    return names(), rules


def runs_here_instead() -> list[str]:
    """Backends that run any description's kernels on this machine's CPU (for hints)."""
    return [b.name for b in registry().values() if b.runs_any_description]
