"""``--hw host``: the description of this machine's OpenCL device, measured by ``roller hw probe`` the first
time it is used and cached per device.

The bundled ``pocl-cpu`` describes one particular CPU (an AVX-512 EPYC), so that tests and documents give the
same kernels everywhere; ``host`` is the device the kernels actually run on here (``ROLLER_CL_DEVICE``, else
PoCL), so construction sees its own register-tile throughputs, bandwidths and core count. The file lives in
``<cache>/hw/`` and is keyed by what the measurement depends on: the platform and its version, the device, its
driver, compute units and clock, roller's version, the probe's own code, the probe mode
(``ROLLER_HOST_PROBE``) and the PoCL settings roller runs under. It carries a checksum (``roller.cache``): a
damaged or edited file is probed again, never used. Concurrent first uses probe once (a file lock), which also
keeps two probes from disturbing each other's timings.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from roller import cache
from roller.backends.opencl.env import POCL_DEFAULTS
from roller.errors import InputError, RollerError, ToolchainError
from roller.settings import settings

NAME = "host"
MODES = ("full", "quick")

# Descriptions probed by this process where none can be cached (ROLLER_NO_CACHE, or a cache that cannot be
# written): probed once per process, kept in a folder removed at exit.
_PROCESS: dict[str, Path] = {}
_SCRATCH: list[Path] = []

#: probes run by this process (what the tests count)
probes_run = 0


def mode() -> str:
    """``ROLLER_HOST_PROBE``: ``full`` (default) or ``quick``. Full by default although it takes 20-50 s: the
    quick probe's three plain tile shapes cannot tell construction where the registers run out (on an AVX2
    CPU a 3x3 convolution built from them ran 3.4x slower than from the full table), and it is paid once."""
    value = settings.opencl.host_probe.strip().lower()
    if value not in MODES:
        raise InputError(f"expected one of {', '.join(MODES)}, got {settings.opencl.host_probe!r}",
                         field="ROLLER_HOST_PROBE")
    return value


def _device() -> Any:
    from roller.backends.opencl.launcher import pick_device

    try:
        dev = pick_device()
    except ToolchainError as err:
        raise ToolchainError(f"--hw {NAME} describes this machine's OpenCL device, and there is none: {err}") \
            from None
    if "oclgrind" in dev.platform.name.lower():
        # A simulator runs kernels thousands of times slower than any device: nothing worth measuring, and
        # the full probe would take hours. It is the first platform where pip's pyopencl has no PoCL beside it.
        raise ToolchainError(f"--hw {NAME} describes this machine's OpenCL device, and the one here is the "
                             f"{dev.platform.name.strip()} simulator: apt-get install pocl-opencl-icd (or pip install "
                             "pocl-binary-distribution), or choose a device with ROLLER_CL_DEVICE")
    return dev


def key_parts(dev: Any, probe_mode: str) -> dict[str, Any]:
    """What the cached description depends on (its file name holds a hash of these)."""
    from roller import __version__
    from roller.backends.opencl import probe

    return {
        "platform": dev.platform.name.strip(), "platform_version": dev.platform.version.strip(),
        "device": dev.name.strip(), "driver": str(dev.driver_version).strip(),
        # Two machines can share a device name (and a home folder) with different core counts or clocks. Not
        # the memory size: PoCL derives it from the memory free when the process starts.
        "compute_units": int(dev.max_compute_units), "clock_mhz": int(dev.max_clock_frequency or 0),
        "roller": __version__,
        # The probe's own code is its format: a change to what it measures or writes probes again.
        "probe": hashlib.sha256(Path(probe.__file__).read_bytes()).hexdigest()[:16],
        "mode": probe_mode,
        "pocl": {k: os.environ.get(k, "") for k in sorted(POCL_DEFAULTS)},
    }


def cache_path(dev: Any, probe_mode: str) -> Path:
    """Where the description of ``dev`` is cached: ``<cache>/hw/host-<device>-<key>.yaml``."""
    from roller.backends.opencl.probe import description_name

    key = hashlib.sha256(json.dumps(key_parts(dev, probe_mode), sort_keys=True).encode()).hexdigest()
    device = description_name(dev.name.strip(), "opencl")[:48]
    quick = "-quick" if probe_mode == "quick" else ""
    return cache.descriptions_dir() / f"{NAME}-{device}{quick}-{key[:16]}.yaml"


def _usable(path: Path) -> tuple[bool, str]:
    """(whether the file at ``path`` is an intact description named host, why not if it is damaged)."""
    from roller import hw

    try:
        text = cache.read_checked(path)
    except cache.Damaged as err:
        return False, str(err)
    if text is None:
        return False, ""
    try:
        desc = hw.load_text(text, str(path))
    except InputError as err:
        return False, f"it does not load: {str(err).splitlines()[0]}"
    if desc.name != NAME:
        return False, f"it describes {desc.name!r}"
    return True, ""


def description(name: str = NAME) -> Path:
    """The YAML file of ``--hw host``: the cached one when it is intact, else probed now (one line on stderr)."""
    if name != NAME:
        raise InputError(f"no description {name!r} is measured here (only {NAME!r})", field="--hw")
    from roller.backends.opencl.launcher import import_opencl

    probe_mode = mode()
    import_opencl()
    dev = _device()
    path = cache_path(dev, probe_mode)
    if str(path) in _PROCESS:   # probed by this process already, where it could not be cached
        return _PROCESS[str(path)]
    if not cache.enabled():
        return _uncached(dev, probe_mode, path, "ROLLER_NO_CACHE is set")
    ok, damaged = _usable(path)
    if ok:
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return _uncached(dev, probe_mode, path, f"{path.parent}: {err.strerror or err}")
    with _locked(path.parent / f".{path.name}.lock"):
        # Another process may have probed while this one waited for the lock.
        ok, damaged_now = _usable(path)
        if ok:
            return path
        damaged = damaged or damaged_now
        text, done = _probe(dev, probe_mode, damaged)
        try:
            cache.write_checked(path, text)
        except OSError as err:
            _finish(done, f"not cached ({path}: {err.strerror or err})")
            _PROCESS[str(path)] = _scratch_file(path.name, text)
            return _PROCESS[str(path)]
        _finish(done, f"cached at {path}")
    return path


def _uncached(dev: Any, probe_mode: str, path: Path, why: str) -> Path:
    text, done = _probe(dev, probe_mode)
    _finish(done, f"not cached: {why}")
    _PROCESS[str(path)] = _scratch_file(path.name, text)
    return _PROCESS[str(path)]


def _scratch_file(filename: str, text: str) -> Path:
    if not _SCRATCH:
        folder = Path(tempfile.mkdtemp(prefix="roller-host-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _SCRATCH.append(folder)
    path = _SCRATCH[0] / filename
    path.write_text(text, encoding="utf-8")
    return path


def _probe(dev: Any, probe_mode: str, damaged: str = "") -> tuple[str, str]:
    """Probe ``dev``: (the description's YAML, what to say about the probe). The stderr line's first half goes
    out before (a full probe takes 20-50 s), the caller ends it (``_finish``)."""
    global probes_run
    from roller import hw
    from roller.backends.opencl import probe

    quick = probe_mode == "quick"
    what = f"{dev.name.strip()} ({dev.platform.name.strip()}{', quick' if quick else ''})"
    lead = f"the cached description is damaged ({damaged}); probing {what} again" if damaged else \
        f"probing {what}, once for this device"
    # The one line a user sees the first time a build names no description (host is then the default).
    print(f"roller: --hw {NAME} (this machine's own description, the default): {lead}... ", end="",
          file=sys.stderr, flush=True)
    busy = _busy()
    try:
        with _quiet_stderr():
            result = probe.probe(quick=quick, log=lambda _msg: None)
        probes_run += 1
        text = result.to_yaml(NAME)
        hw.load_text(text, "<probe>")   # the probe's own output must load; a failure is a bug in the probe
    except BaseException:
        print("failed", file=sys.stderr, flush=True)
        raise
    header = (f"# --hw {NAME}: this machine's OpenCL device, probed by roller on first use ({probe_mode} probe) "
              "and cached.\n# The line above is a checksum: an edited file is probed again; to change values, "
              "copy the file and use --hw COPY.yaml.\n" + (f"# Probed at a {busy}.\n" if busy else ""))
    return header + text, f"probed in {result.seconds:.1f} s" + (f" ({busy})" if busy else "")


def _busy() -> str:
    """Other work on the machine slows what the probe measures (the time the other cores take to join most of
    all), and the result is cached: a load average above the core count is worth a word in the line."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):   # no load average on this system
        return ""
    cores = os.cpu_count() or 1
    if load <= cores:
        return ""
    return f"load average {load:.1f} on {cores} cores: the figures may be low"


def _finish(done: str, where: str) -> None:
    print(f"{done}, {where}", file=sys.stderr, flush=True)


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """PoCL's compiler writes its warnings ("2 warnings generated.") to file descriptor 2 itself, and pyopencl
    warns of the same builds: while the probe runs both go to a scratch file, so that the first use of
    ``--hw host`` prints one line. Replayed if the probe fails with a bug, where they may explain it."""
    import warnings

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as scratch, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            os.dup2(scratch.fileno(), 2)
            try:
                yield
            except Exception as err:
                if not isinstance(err, RollerError):
                    sys.stderr.flush()
                    scratch.seek(0)
                    os.write(saved, scratch.read())
                raise
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)


@contextmanager
def _locked(lock: Path) -> Iterator[None]:
    """An exclusive lock on ``lock`` (created if needed) while the block runs; none where the system has no
    flock or the file cannot be opened (then two first uses may both probe, which only costs time)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
