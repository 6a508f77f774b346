"""On-disk cache of what Roller builds, keyed by content: kernels (construction + rendering (+ evaluation)),
and the compile results of toolchains (``load_result`` / ``store_result``: the nvcc and hipcc reports).

Location: ``$ROLLER_CACHE_DIR``, else ``~/.cache/roller`` (``$XDG_CACHE_HOME/roller`` when that is set);
``ROLLER_NO_CACHE=1`` disables it (``roller.settings``). One kernel entry is one folder
``<dir>/entries/<key>/`` holding the rendered files,
``launch.json``, ``programs.json`` (the top-K rPrograms, best predicted first), ``eval.json`` when the entry was
chosen by measurement, and ``entry.json``: the key's parts, the chosen candidate, and a sha256 of every other
file (plus one of its own body). An entry that fails any check (bad JSON, missing file, checksum mismatch) is
removed and rebuilt, never used. Entries are built in ``<dir>/tmp/`` and renamed into place, so a reader sees
a whole entry or none.

The key is a sha256 over: the source op's content hash and name (the kernel is named after the op), the
description's content hash, the backend, the toolchain version (``Backend.toolchain_version``, e.g. the
platform and driver of the device kernels run on; ``none`` where the backend cannot run here), ``roller.__version__``,
a hash of Roller's own code (every ``.py``, template and description file of the package: a change to the
construction, the model or a template builds kernels anew, where the version alone kept serving those the
old code built), ``top_k``, whether candidates were evaluated, and the settings the backend declares in
``cache_env``.

A compile result is one JSON file ``<dir>/results/<kind>/<key[:2]>/<key>.json`` holding the document and its
checksum; one that fails the checksum is ignored and overwritten. A result may keep a binary beside it
(``<key>.bin``, its sha256 in the document: the binary a runner loads), which ``load_blob`` returns only when
it matches. ``clear`` removes the results with the entries.

A kernel database (``roller build --db FILE``, written by ``roller.kernel_db``; ``ROLLER_KERNEL_DB=FILE`` to
read it) is a tier below: an entry or result the cache lacks is looked up there, checked as a local one is, and
copied into the cache. ``ROLLER_CACHE_JOURNAL=FILE`` names every entry and result a process used or stored in
that file, one line each, appended (so compiler processes add theirs): what a build needed, for the database.

Descriptions measured on this machine (a backend's ``local_names``, e.g. ``--hw host``) are YAML files in
``<dir>/hw/``, readable and loadable as they are: ``write_checked`` puts a checksum of the rest of the file on
its first line (a YAML comment), and ``read_checked`` refuses a file whose checksum does not match.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from roller.atomic import write_atomic
from roller.settings import current, settings


class Backend(Protocol):
    """What the cache needs of a backend (``roller.backends.Backend`` has it)."""

    @property
    def name(self) -> str: ...

    @property
    def cache_env(self) -> tuple[str, ...]: ...

    def toolchain_version(self) -> str: ...


FORMAT = 1
MANIFEST = "entry.json"


def enabled() -> bool:
    return not settings.cache.disabled and not _unsafe(cache_dir())


_WARNED: set[str] = set()


def _unsafe(root: Path) -> str:
    """Why the cache folder must not be used (another user owns it, or others may write into it: they could
    plant kernels this user would run), or "" when it is the user's own. Said once per folder, as pip does."""
    try:
        st = os.stat(root)
    except OSError:
        return ""   # not made yet: ``store`` makes it, readable by its owner only
    why = ""
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        why = f"owned by another user (uid {st.st_uid})"
    elif st.st_mode & 0o002:   # by anyone (a group-writable one is common where each user has a group)
        why = f"writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    if why and str(root) not in _WARNED:
        import warnings

        from roller.errors import UnsafeCacheWarning

        _WARNED.add(str(root))
        warnings.warn(f"the kernel cache {root} is {why}: it is not used (chmod go-w it, or set ROLLER_CACHE_DIR "
                      "to a folder of your own)", UnsafeCacheWarning, stacklevel=3)
    return why


def cache_dir() -> Path:
    return settings.cache.dir


def _entries_dir(root: Path | None = None) -> Path:
    return (root or cache_dir()) / "entries"


_TOOLCHAIN: dict[str, str] = {}


def toolchain_version(backend: Backend) -> str:
    """``backend.toolchain_version()``, asked once per process and per value of the backend's settings."""
    memo = json.dumps([backend.name, current(backend.cache_env)], sort_keys=True)
    if memo not in _TOOLCHAIN:
        _TOOLCHAIN[memo] = str(backend.toolchain_version())
    return _TOOLCHAIN[memo]


def key_parts(op_hash: str, op_name: str, hw_hash: str, backend: Backend, top_k: int,
              evaluated: bool) -> dict[str, Any]:
    """What a kernel entry's key is made of (``make_key``)."""
    from roller import __version__

    return {"format": FORMAT, "op_hash": op_hash, "op_name": op_name, "hw_hash": hw_hash,
            "backend": backend.name, "toolchain": toolchain_version(backend), "roller": __version__,
            "code": code_hash(), "top_k": top_k, "evaluated": bool(evaluated), "env": current(backend.cache_env)}


_CODE_HASH: list[str] = []


def code_hash() -> str:
    """sha256 over Roller's own files that decide what a kernel is (every ``.py``, ``.j2`` and ``.yaml`` of the
    package, by path and content), computed once per process (a few milliseconds)."""
    if not _CODE_HASH:
        root = Path(__file__).resolve().parent
        h = hashlib.sha256()
        for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".j2", ".yaml") and p.is_file()):
            h.update(str(path.relative_to(root)).encode())
            h.update(b"\0")
            h.update(path.read_bytes())
        _CODE_HASH.append(h.hexdigest())
    return _CODE_HASH[0]


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


def remove(folder: Path) -> bool:
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


def _make_root() -> bool:
    """The cache folder made, readable and writable by its owner only, before anything is written into it;
    False when it cannot be."""
    try:
        cache_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return False
    return True


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
    if os.path.islink(_entries_dir()):   # entries that are not the cache's own folder: never read through
        last_event = "damaged: the entries folder is a link"
        return None
    if os.path.lexists(folder):
        last_event = "hit"
    elif _adopt_from_db(key, folder):
        last_event = "hit (kernel database)"
    else:
        last_event = "miss"
        return None
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            raise Damaged("not a folder (a link or a file)")
        entry = _load_entry(folder)
    except Damaged as err:
        last_event = f"damaged: {err}"
        remove(folder)
        return None
    _journal("entry", key)
    return entry


def store(key: str, entry: Entry) -> Path | None:
    """Write an entry atomically (built in ``tmp/``, renamed into place). Returns its folder, or None when the
    cache is disabled or not writable (a cache that cannot be written never fails a build)."""
    if not enabled():
        return None
    root = cache_dir()
    tmp_root = root / "tmp"
    if not _make_root():
        return None
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
            remove(final)
        try:
            os.rename(tmp, final)
        except OSError:  # another process stored the same entry meanwhile: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        entry.path = final
        _journal("entry", key)
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
    hw_dir = root / "hw"
    measured = sorted(str(p) for p in hw_dir.glob("*.yaml")) if hw_dir.is_dir() else []
    return {"dir": str(root), "enabled": enabled(), "entries": entries, "bytes": total, "descriptions": measured}


def clear() -> int:
    """Remove every entry (and leftovers of interrupted writes); returns the number of entries removed.
    InputError (naming the first one left) when some cannot be removed, e.g. a read-only cache."""
    from roller.errors import InputError

    root = cache_dir()
    n = 0
    left: list[Path] = []
    folder = _entries_dir(root)
    for own in (folder, root / "tmp", root / "failed", root / "results"):
        if os.path.islink(own):   # a link in place of one of the cache's folders: the link goes, not its target
            try:
                os.unlink(own)
            except OSError:
                left.append(own)
    try:
        children = list(folder.iterdir()) if folder.is_dir() else []
    except OSError as err:
        raise InputError(f"cannot list the cache's entries: {err.strerror or err}", source=str(folder),
                         field="cache clear") from None
    for child in children:
        entry = child.is_dir() and not child.is_symlink()
        if remove(child):
            n += entry
        else:
            left.append(child)
    shutil.rmtree(root / "tmp", ignore_errors=True)
    shutil.rmtree(root / "failed", ignore_errors=True)  # kernels kept for the repro of a compile failure
    shutil.rmtree(root / "results", ignore_errors=True)  # compile reports and cubins: rebuilt on demand
    if left:
        raise InputError(f"removed {n} cache entr{'y' if n == 1 else 'ies'}, but {len(left)} could not be removed "
                         f"(e.g. {left[0].name}): is the cache read-only?", source=str(folder), field="cache clear")
    return n


# -- compile results (toolchain reports) ----------------------------------------------------------------------

def result_key(*parts: str) -> str:
    """A key over ``parts`` (each one separated, so no two different part lists share a key)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _result_path(kind: str, key: str) -> Path:
    return cache_dir() / "results" / kind / key[:2] / f"{key}.json"


def load_result(kind: str, key: str) -> Any | None:
    """The document stored under (``kind``, ``key``), or None: absent, disabled, unreadable or damaged."""
    if not enabled():
        return None
    path = _result_path(kind, key)
    body = _checked_result(path)
    if body is None and _adopt_result_from_db(kind, key, path):
        body = _checked_result(path)
    if body is not None:
        _journal("result", kind, key)
    return body


def _checked_result(path: Path) -> Any | None:
    try:
        doc = json.loads(_read_regular(path))
    except (Damaged, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or "body" not in doc or doc.get("format") != FORMAT:
        return None
    if doc.get("sha256") != _sha(json.dumps(doc["body"], sort_keys=True).encode()):
        return None
    return doc["body"]


def store_result(kind: str, key: str, body: Any) -> None:
    """Store a JSON document atomically; a cache that cannot be written only costs time, so nothing is
    raised."""
    if not enabled():
        return
    path = _result_path(kind, key)
    doc = {"format": FORMAT, "sha256": _sha(json.dumps(body, sort_keys=True).encode()), "body": body}
    try:
        _make_root()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(doc).encode())
    except OSError:
        return
    _journal("result", kind, key)


def store_blob(kind: str, key: str, data: bytes) -> str:
    """Store ``data`` beside the document (``kind``, ``key``) and return its sha256, which the document keeps
    so that ``load_blob`` can tell a damaged file; nothing is raised when the cache cannot be written."""
    digest = _sha(data)
    if enabled():
        try:
            path = _result_path(kind, key).with_suffix(".bin")
            _make_root()
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, data)
        except OSError:
            pass
    return digest


def load_blob(kind: str, key: str, digest: str) -> bytes | None:
    """The bytes ``store_blob`` kept for (``kind``, ``key``) if their sha256 is ``digest``, else None."""
    if not enabled():
        return None
    try:
        data = _read_regular(_result_path(kind, key).with_suffix(".bin"))
    except Damaged:
        return None
    return data if _sha(data) == digest else None


# -- the journal and the kernel database tier -----------------------------------------------------------------

#: the kernel database's layout (``roller.kernel_db`` writes it): ``kernels.files`` is a JSON object of an
#: entry folder's files (name -> text, ``entry.json`` with its checksums among them), ``results.doc`` a compile
#: result's stored JSON and ``results.blob`` the binary beside it
DB_FORMAT = "roller-kernel-db 1"
DB_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS kernels(key TEXT PRIMARY KEY, op_name TEXT NOT NULL, op_hash TEXT NOT NULL,
    description TEXT NOT NULL, hw_hash TEXT NOT NULL, backend TEXT NOT NULL, toolchain TEXT NOT NULL,
    line TEXT NOT NULL, predicted_ms REAL, measured_ms REAL, files TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results(kind TEXT NOT NULL, key TEXT NOT NULL, doc TEXT NOT NULL, blob BLOB,
    PRIMARY KEY(kind, key));
"""


def _journal(*words: str) -> None:
    """One line naming what was used or stored, appended to ``ROLLER_CACHE_JOURNAL``'s file (a line of a few
    hundred bytes is one write: lines of concurrent processes do not interleave)."""
    path = settings.cache.journal
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (" ".join(words) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def open_db(path: Path, write: bool = False, field: str = "ROLLER_KERNEL_DB") -> sqlite3.Connection:
    """A connection to the kernel database at ``path`` (read-only unless ``write``, which makes its tables);
    InputError naming the file and ``field`` when it is not one."""
    from roller.errors import InputError

    def refused(why: str) -> InputError:
        return InputError(why, source=str(path), field=field)

    if not write and not path.is_file():
        raise refused("no such kernel database (roller build --db FILE writes one)")
    try:
        con = sqlite3.connect(f"file:{path}?mode={'rwc' if write else 'ro'}", uri=True, timeout=30)
        if write:
            con.executescript(DB_SCHEMA)
            con.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (DB_FORMAT,))
        row = con.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
    except sqlite3.Error as err:
        raise refused(f"not a Roller kernel database ({err})") from None
    if row is None or row[0] != DB_FORMAT:
        con.close()
        raise refused(f"not a Roller kernel database of this version (format {row[0] if row else 'none'!r}, "
                      f"expected {DB_FORMAT!r})")
    return con


def _db_row(query: str, args: tuple[str, ...]) -> tuple[Any, ...] | None:
    path = settings.cache.db
    if not path:
        return None
    con = open_db(Path(path).expanduser())
    try:
        row = con.execute(query, args).fetchone()
    except sqlite3.Error:
        row = None   # a damaged database costs a rebuild, as a damaged entry does
    finally:
        con.close()
    return tuple(row) if row is not None else None


def _adopt_from_db(key: str, final: Path) -> bool:
    """Copy the database's entry ``key`` into the cache (checked as ``lookup`` checks an entry); whether it is
    there now."""
    row = _db_row("SELECT files FROM kernels WHERE key = ?", (key,))
    if row is None or not (_make_root() and _own_folder(cache_dir() / "tmp") and _own_folder(_entries_dir())):
        return False
    try:
        files = json.loads(row[0])
        tmp = Path(tempfile.mkdtemp(prefix="entry-", dir=cache_dir() / "tmp"))
    except (ValueError, TypeError, OSError):
        return False
    try:
        if not isinstance(files, dict) or MANIFEST not in files:
            return False
        for name, text in files.items():
            if not isinstance(name, str) or "/" in name or name.startswith(".") or not isinstance(text, str):
                return False
            (tmp / name).write_text(text, encoding="utf-8")
        _load_entry(tmp)   # every checksum, as for a local entry
        if json.loads(files[MANIFEST])["body"].get("key") != key:
            return False
        os.rename(tmp, final)
        return True
    except (Damaged, OSError, ValueError, KeyError, TypeError):
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _adopt_result_from_db(kind: str, key: str, path: Path) -> bool:
    """Copy the database's result (``kind``, ``key``) and its binary into the cache; whether it was there."""
    row = _db_row("SELECT doc, blob FROM results WHERE kind = ? AND key = ?", (kind, key))
    if row is None or not isinstance(row[0], str):
        return False
    try:
        _make_root()
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(row[1], bytes):
            write_atomic(path.with_suffix(".bin"), row[1])
        write_atomic(path, row[0].encode())
    except OSError:
        return False
    return True


def entry_files(key: str) -> dict[str, str] | None:
    """The files of the cache's entry ``key`` as stored (name -> text), checked; None when absent or damaged."""
    folder = _entries_dir() / key
    try:
        _load_entry(folder)
        names = [MANIFEST, *json.loads(_read_regular(folder / MANIFEST))["body"]["files"]]
        return {n: _read_regular(folder / n).decode("utf-8") for n in names}
    except (Damaged, ValueError, KeyError, UnicodeDecodeError):
        return None


def result_files(kind: str, key: str) -> tuple[str, bytes | None] | None:
    """The stored document of result (``kind``, ``key``) as text and the binary beside it, if checked."""
    path = _result_path(kind, key)
    if _checked_result(path) is None:
        return None
    try:
        blob: bytes | None = _read_regular(path.with_suffix(".bin"))
    except Damaged:
        blob = None
    return _read_regular(path).decode("utf-8"), blob


# -- checksummed text files (descriptions measured here) ----------------------------------------------------

CHECKED_PREFIX = "# roller-cache sha256="


def descriptions_dir() -> Path:
    """Where descriptions measured on this machine are kept."""
    return cache_dir() / "hw"


def write_checked(path: Path, text: str) -> None:
    """Write ``text`` atomically with a first line ``# roller-cache sha256=<hex>`` over the rest, so that a
    truncated or edited file is detected; OSError when it cannot be written."""
    _make_root()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (f"{CHECKED_PREFIX}{_sha(text.encode())}\n{text}").encode())


def read_checked(path: Path) -> str | None:
    """The text ``write_checked`` wrote (without its checksum line), None when there is no file; Damaged when
    the file is not a regular file, or its checksum line is missing or does not match."""
    if not os.path.lexists(path):
        return None
    blob = _read_regular(path)
    head, sep, rest = blob.partition(b"\n")
    try:
        line = head.decode("ascii")
    except UnicodeDecodeError:
        raise Damaged("bad checksum line") from None
    if not sep or not line.startswith(CHECKED_PREFIX):
        raise Damaged("no checksum line")
    if line[len(CHECKED_PREFIX):] != _sha(rest):
        raise Damaged("checksum mismatch")
    try:
        return rest.decode("utf-8")
    except UnicodeDecodeError:
        raise Damaged("not UTF-8") from None
