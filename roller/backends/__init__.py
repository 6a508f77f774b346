"""Backend contract and registry.

A backend turns an rProgram into source, compiles it, and (where the device is here) runs and times it.
Backends live in the sub-packages of ``roller.backends``; each defines ``BACKEND``, an instance of a
``Backend`` subclass. The registry finds them by scanning the package, so the core never names one.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from roller.errors import InputError

if TYPE_CHECKING:
    from roller.construct.rtile import RProgram
    from roller.hw import HardwareDesc


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


class Runner:
    """A compiled kernel on a device: call it with numpy inputs, time it."""

    def __call__(self, inputs: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        raise NotImplementedError

    def time(self, inputs: list[np.ndarray], repeat: int = 10, warmup: int = 2) -> float:
        """Median kernel time in seconds."""
        raise NotImplementedError


class Backend:
    name: str = ""
    #: the ``backend`` values of hardware descriptions this backend serves
    serves: tuple[str, ...] = ()
    file_ext: str = ""
    dtypes: tuple[str, ...] = ("float32",)

    def render(self, prog: "RProgram", hw: "HardwareDesc") -> Artifact:
        raise NotImplementedError

    def can_run_here(self) -> bool:
        """True when a device of this backend is present on this machine."""
        return False

    def why_not_here(self) -> str:
        return f"no {self.name} device on this machine"

    def compile(self, art: Artifact, hw: "HardwareDesc", workdir: Path | None = None) -> Runner:
        raise NotImplementedError

    def check_compiles(self, art: Artifact, hw: "HardwareDesc", workdir: Path) -> dict[str, Any]:
        """Compile without running (for devices absent here); returns resource usage."""
        raise NotImplementedError


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


def for_hw(hw: "HardwareDesc", name: str | None = None) -> Backend:
    """The backend named, or the one serving the description's ``backend`` field."""
    if name:
        return get(name)
    for b in registry().values():
        if hw.backend in b.serves:
            return b
    raise InputError(f"no backend serves {hw.backend!r} (description {hw.name})", field="backend")
