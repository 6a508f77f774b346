"""Every ``ROLLER_*`` environment variable, declared once: name, type, default and meaning.

Values are read from the environment at each access (``settings.cache.dir``), not at import, so a test or a
long-lived process that changes the environment sees the change. ``roller.settings.describe()`` lists them
all (docs/cli.md's table is this list). Backends name the variables that change what they build in their
``cache_env``; those values are part of every cache key.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar, overload

T = TypeVar("T")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Knob(Generic[T]):
    """One environment variable: read it with ``group.attribute``."""

    env: str
    default: T
    doc: str

    def raw(self) -> str | None:
        value = os.environ.get(self.env)
        return value if value is not None and value.strip() != "" else None

    def parse(self, raw: str) -> T:
        if isinstance(self.default, bool):
            word = raw.strip().lower()
            if word not in _TRUE + _FALSE:   # a typo would otherwise switch the setting off without a word
                from roller.errors import InputError

                raise InputError(f"{self.env}={raw!r}: expected one of {', '.join(_TRUE + _FALSE)}")
            return (word in _TRUE)  # type: ignore[return-value]
        return raw.strip() if isinstance(self.default, str) or self.default is None else raw  # type: ignore[return-value]

    @overload
    def __get__(self, obj: None, owner: type) -> Knob[T]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> T: ...

    def __get__(self, obj: object | None, owner: type) -> Knob[T] | T:
        if obj is None:
            return self
        raw = self.raw()
        return self.default if raw is None else self.parse(raw)


class CacheSettings:
    disabled: Knob[bool] = Knob("ROLLER_NO_CACHE", False, "1/true/yes/on turns the kernel cache off")
    dir_override: Knob[str | None] = Knob("ROLLER_CACHE_DIR", None,
                                          "the cache folder (default $XDG_CACHE_HOME/roller or ~/.cache/roller)")
    db: Knob[str | None] = Knob("ROLLER_KERNEL_DB", None,
                                "a kernel database (roller build --db FILE) read when the cache misses: its "
                                "kernels and compiled binaries are copied into the cache")
    journal: Knob[str | None] = Knob("ROLLER_CACHE_JOURNAL", None,
                                     "a file every cache entry and compile result used or stored is named in "
                                     "(set by roller build --db for itself and its compiler processes)")

    @property
    def dir(self) -> Path:
        if self.dir_override:
            return Path(self.dir_override).expanduser()
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
        return base / "roller"


class OpenCLSettings:
    device: Knob[str | None] = Knob("ROLLER_CL_DEVICE", None,
                                    "the OpenCL device: 'platform substring[:device index]' (default: PoCL)")
    fast_math: Knob[bool] = Knob("ROLLER_CL_FAST_MATH", False, "1 builds kernels with -cl-fast-relaxed-math")
    mapping: Knob[str | None] = Knob("ROLLER_CL_MAPPING", None,
                                     "'blocked' or 'strided': force how work-items map to a block tile")
    host_probe: Knob[str] = Knob("ROLLER_HOST_PROBE", "full",
                                 "'full' or 'quick': how --hw host measures this machine the first time "
                                 "(quick: seconds instead of a minute, coarser tables; cached apart)")


class CudaSettings:
    compiler: Knob[str | None] = Knob("ROLLER_CUDA_COMPILER", None,
                                      "'nvcc' or 'nvrtc': force the compiler of the compile checks")


class HipSettings:
    hipcc: Knob[str | None] = Knob("ROLLER_HIPCC", None, "the hipcc executable (default: hipcc on PATH)")


class PoplarSettings:
    device: Knob[str] = Knob("ROLLER_POPLAR_DEVICE", "model", "'model' (IPU Model) or 'ipu' for the host program")


class RuntimeSettings:
    poison: Knob[bool] = Knob("ROLLER_POISON", False,
                              "1 fills every buffer a model's run writes with 0xFF bytes (NaN, or -1) before the "
                              "run: a read of memory nothing wrote shows as NaN (slower; for testing)")


class CompileSettings:
    block_channels: Knob[bool] = Knob("ROLLER_BLOCK_CHANNELS", True,
                                      "0 keeps every activation of a model in its own layout: no channels stored "
                                      "in blocks on CPUs (roller.graph.blocking; for comparisons)")


class FarmSettings:
    scheduler: Knob[str | None] = Knob("ROLLER_SCHEDULER", None,
                                       "a Dask scheduler's address (tcp://host:8786): roller compare builds on its "
                                       "workers (the same as --scheduler)")


class TestSettings:
    update_golden: Knob[bool] = Knob("ROLLER_UPDATE_GOLDEN", False, "1 rewrites the tests' golden files")


class Settings:
    cache = CacheSettings()
    opencl = OpenCLSettings()
    cuda = CudaSettings()
    hip = HipSettings()
    poplar = PoplarSettings()
    runtime = RuntimeSettings()
    compile = CompileSettings()
    farm = FarmSettings()
    tests = TestSettings()


settings = Settings()


def knobs() -> list[Knob[object]]:
    """Every declared variable, in declaration order."""
    out: list[Knob[object]] = []
    for group in vars(Settings).values():
        for value in vars(type(group)).values():
            if isinstance(value, Knob):
                out.append(value)
    return out


def describe() -> list[tuple[str, str]]:
    """(variable, meaning) of every declared variable."""
    return [(k.env, k.doc) for k in knobs()]


def current(names: tuple[str, ...]) -> dict[str, str]:
    """The set values of the named variables (unset ones left out): what goes into a cache key."""
    known = {k.env for k in knobs()}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KeyError(f"undeclared settings {unknown}")
    return {n: os.environ[n] for n in names if os.environ.get(n)}
