"""On-disk cache of built kernels: construction + rendering (+ evaluation) results, keyed by content.

Location: ``$ROLLER_CACHE_DIR``, else ``~/.cache/roller`` (``$XDG_CACHE_HOME/roller`` when that is set);
``ROLLER_NO_CACHE=1`` disables it. One entry is one folder ``<dir>/entries/<key>/`` holding the rendered files,
``launch.json``, ``programs.json`` (the top-K rPrograms, best predicted first), ``eval.json`` when the entry was
chosen by measurement, and ``entry.json``: the key's parts, the chosen candidate, and a sha256 of every other
file (plus one of its own body). An entry that fails any check (bad JSON, missing file, checksum mismatch) is
removed and rebuilt, never used. Entries are built in ``<dir>/tmp/`` and renamed into place, so a reader sees
a whole entry or none.

The key is a sha256 over: the source op's content hash and name (the kernel is named after the op), the
description's content hash, the backend, the toolchain version (e.g. the OpenCL platform and driver version;
``none`` where the backend cannot run here), ``roller.__version__``, ``top_k``, whether candidates were
evaluated, and the environment variables that change rendering.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from roller.backends import Backend

FORMAT = 1
MANIFEST = "entry.json"
# Environment variables that change what a backend renders or how it compiles: part of the key.
RENDER_ENV = ("ROLLER_CL_MAPPING", "ROLLER_CL_FAST_MATH")


def enabled() -> bool:
    return os.environ.get("ROLLER_NO_CACHE", "").strip().lower() not in ("1", "true", "yes", "on")


def cache_dir() -> Path:
    env = os.environ.get("ROLLER_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "roller"


def _entries_dir(root: Path | None = None) -> Path:
    return (root or cache_dir()) / "entries"


_TOOLCHAIN: dict[str, str] = {}


def toolchain_version(backend: "Backend") -> str:
    """What compiles the kernels here: the backend's ``toolchain_version()`` when it has one; for OpenCL the
    platform, version, device and driver picked by the launcher; ``none`` where the backend cannot run here."""
    memo = f"{backend.name}|{os.environ.get('ROLLER_CL_DEVICE', '')}"
    if memo in _TOOLCHAIN:
        return _TOOLCHAIN[memo]
    version = "none"
    hook = getattr(backend, "toolchain_version", None)
    if callable(hook):
        version = str(hook())
    elif backend.name == "opencl":
        try:
            if backend.can_run_here():
                from roller.backends.opencl.launcher import pick_device

                dev = pick_device()
                version = f"{dev.platform.name} | {dev.platform.version} | {dev.name} | {dev.driver_version}"
        except Exception:  # noqa: BLE001 - no device: render-only
            version = "none"
    if os.environ.get("ROLLER_CL_DEVICE"):
        version += f" | device {os.environ['ROLLER_CL_DEVICE']}"
    _TOOLCHAIN[memo] = version
    return version


def key_parts(op_hash: str, op_name: str, hw_hash: str, backend: str, toolchain: str, top_k: int,
              evaluated: bool) -> dict[str, Any]:
    from roller import __version__

    return {"format": FORMAT, "op_hash": op_hash, "op_name": op_name, "hw_hash": hw_hash, "backend": backend,
            "toolchain": toolchain, "roller": __version__, "top_k": top_k, "evaluated": bool(evaluated),
            "env": {k: os.environ[k] for k in RENDER_ENV if os.environ.get(k)}}


def make_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Entry:
    """What a cache entry holds (and what ``store`` writes)."""

    files: dict[str, str]  # rendered files, name -> text (main file first)
    main_file: str
    kernel_name: str
    launch: dict[str, Any]
    programs: list[dict[str, Any]]  # RProgram.to_json() of the top-K, best predicted first
    chosen: int = 0
    evaluation: dict[str, Any] | None = None  # eval.json when chosen by measurement
    parts: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


class Damaged(Exception):
    pass


def _read_regular(path: Path) -> bytes:
    """The bytes of ``path`` if it is a regular file (not a link, a FIFO, a device or a folder); Damaged
    otherwise. Opened without blocking and without following links, so that a FIFO planted in an entry cannot
    hang a lookup and a link cannot make it read elsewhere."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        raise Damaged(f"missing or unreadable {path.name}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Damaged(f"{path.name} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    except OSError:
        raise Damaged(f"unreadable {path.name}") from None
    finally:
        os.close(fd)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(_read_regular(path))
    except (ValueError, UnicodeDecodeError):
        raise Damaged(f"bad JSON in {path.name}") from None


def _load_entry(folder: Path) -> Entry:
    doc = _read_json(folder / MANIFEST)
    if not isinstance(doc, dict) or not isinstance(doc.get("body"), dict) or "sha256" not in doc:
        raise Damaged("bad manifest")
    body = doc["body"]
    if _sha(json.dumps(body, sort_keys=True).encode()) != doc["sha256"]:
        raise Damaged("manifest checksum mismatch")
    if body.get("format") != FORMAT:
        raise Damaged("old format")
    sums = body.get("files")
    if not isinstance(sums, dict) or not sums:
        raise Damaged("bad manifest")
    data: dict[str, bytes] = {}
    for name, digest in sums.items():
        if "/" in name or name.startswith("."):
            raise Damaged(f"bad file name {name!r}")
        blob = _read_regular(folder / name)
        if _sha(blob) != digest:
            raise Damaged(f"checksum mismatch in {name}")
        data[name] = blob
    try:
        rendered = {n: data[n].decode("utf-8") for n in body["rendered"]}
        launch = json.loads(data["launch.json"])
        programs = json.loads(data["programs.json"])
        evaluation = json.loads(data["eval.json"]) if "eval.json" in data else None
        chosen = int(body["chosen"])
        main_file = body["main_file"]
        kernel_name = body["kernel_name"]
    except (KeyError, ValueError, TypeError, UnicodeDecodeError):
        raise Damaged("inconsistent entry") from None
    if main_file not in rendered or not isinstance(programs, list) or not 0 <= chosen < len(programs):
        raise Damaged("inconsistent entry")
    return Entry(rendered, main_file, kernel_name, launch, programs, chosen, evaluation, body.get("parts", {}),
                 folder)


def _remove(folder: Path) -> bool:
    """Take an entry out of the way first (rename), then delete it, so nobody reads it half-deleted. An entry
    that is not a folder (a file, a link, a FIFO where one was expected) is unlinked. True when it is gone."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            os.unlink(folder)
            return True
    except FileNotFoundError:
        return True
    except OSError:
        return False
    trash = folder.parent.parent / "tmp" / f"trash-{folder.name}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.rename(folder, trash)
    except OSError:
        trash = folder
    shutil.rmtree(trash, ignore_errors=True)
    return not os.path.lexists(folder)


def _own_folder(path: Path) -> bool:
    """Make ``path`` (one of the cache's own folders) a folder: something else in its place is removed.
    False when that cannot be done (then the cache is not writable)."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return True


#: what the last lookup did, for tests and ``-v``: "hit", "miss", "damaged: ...", "disabled"
last_event = ""


def lookup(key: str) -> Entry | None:
    """The entry under ``key``, or None (absent, disabled, or damaged: a damaged entry is removed)."""
    global last_event
    if not enabled():
        last_event = "disabled"
        return None
    folder = _entries_dir() / key
    if not os.path.lexists(folder):
        last_event = "miss"
        return None
    try:
        entry = _load_entry(folder)
    except Damaged as err:
        last_event = f"damaged: {err}"
        _remove(folder)
        return None
    last_event = "hit"
    return entry


def store(key: str, entry: Entry) -> Path | None:
    """Write an entry atomically (built in ``tmp/``, renamed into place). Returns its folder, or None when the
    cache is disabled or not writable (a cache that cannot be written never fails a build)."""
    if not enabled():
        return None
    root = cache_dir()
    tmp_root = root / "tmp"
    if not (_own_folder(tmp_root) and _own_folder(_entries_dir(root))):
        return None
    try:
        tmp = Path(tempfile.mkdtemp(prefix="entry-", dir=tmp_root))
    except OSError:
        return None
    try:
        blobs: dict[str, bytes] = {n: t.encode("utf-8") for n, t in entry.files.items()}
        blobs["launch.json"] = json.dumps(entry.launch, indent=2).encode()
        blobs["programs.json"] = json.dumps(entry.programs, indent=2).encode()
        if entry.evaluation is not None:
            blobs["eval.json"] = json.dumps(entry.evaluation, indent=2).encode()
        for name, blob in blobs.items():
            (tmp / name).write_bytes(blob)
        body = {"format": FORMAT, "key": key, "parts": entry.parts, "created": time.time(),
                "rendered": list(entry.files), "main_file": entry.main_file, "kernel_name": entry.kernel_name,
                "chosen": entry.chosen, "files": {n: _sha(b) for n, b in blobs.items()}}
        manifest = {"body": body, "sha256": _sha(json.dumps(body, sort_keys=True).encode())}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        final = _entries_dir(root) / key
        if os.path.lexists(final):
            _remove(final)
        try:
            os.rename(tmp, final)
        except OSError:  # another process stored the same entry meanwhile: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        entry.path = final
        return final
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return None


def info() -> dict[str, Any]:
    root = cache_dir()
    entries = 0
    total = 0
    folder = _entries_dir(root)
    if folder.is_dir():
        for child in folder.iterdir():
            if child.is_dir():
                entries += 1
    if root.is_dir():
        for dirpath, _, files in os.walk(root):
            for f in files:
                try:
                    total += os.lstat(os.path.join(dirpath, f)).st_size
                except OSError:
                    pass
    return {"dir": str(root), "enabled": enabled(), "entries": entries, "bytes": total}


def clear() -> int:
    """Remove every entry (and leftovers of interrupted writes); returns the number of entries removed.
    InputError (naming the first one left) when some cannot be removed, e.g. a read-only cache."""
    from roller.errors import InputError

    root = cache_dir()
    n = 0
    left: list[Path] = []
    folder = _entries_dir(root)
    try:
        children = list(folder.iterdir()) if folder.is_dir() else []
    except OSError as err:
        raise InputError(f"cannot list the cache's entries: {err.strerror or err}", source=str(folder),
                         field="cache clear") from None
    for child in children:
        entry = child.is_dir() and not child.is_symlink()
        if _remove(child):
            n += entry
        else:
            left.append(child)
    shutil.rmtree(root / "tmp", ignore_errors=True)
    shutil.rmtree(root / "failed", ignore_errors=True)  # kernels kept for the repro of a compile failure
    if left:
        raise InputError(f"removed {n} cache entr{'y' if n == 1 else 'ies'}, but {len(left)} could not be removed "
                         f"(e.g. {left[0].name}): is the cache read-only?", source=str(folder), field="cache clear")
    return n
