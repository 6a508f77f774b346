"""A kernel database: every kernel a build needed (sources, launch, the top-K rPrograms with their predicted
times, measured times where candidates were timed) and every compiled binary and compile report, in one
SQLite file, the paper's NNFusion ``kernel_cache.db`` without a script per model.

``roller build --db FILE`` records what its builds use or store in the cache (``recording``: the cache names
each entry and result in a journal file, ``ROLLER_CACHE_JOURNAL``, compiler processes included) and then copies those into FILE
(``export``), adding to what FILE already holds; ``ROLLER_KERNEL_DB=FILE`` makes the cache read it where it
misses (``roller.cache``). The file is written beside itself and renamed into place: a reader sees the old
file or the new one.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roller import cache
from roller.errors import InputError
from roller.settings import CacheSettings

_JOURNAL_VAR = CacheSettings.journal.env


@dataclass
class Exported:
    kernels: int
    results: int
    total_kernels: int


@contextlib.contextmanager
def recording() -> Iterator[Path]:
    """A journal file named in the cache's journal variable while the block runs (processes started in it
    inherit it); its path, removed afterwards."""
    fd, name = tempfile.mkstemp(prefix="roller-journal-", suffix=".txt")
    os.close(fd)
    before = os.environ.get(_JOURNAL_VAR)
    os.environ[_JOURNAL_VAR] = name
    try:
        yield Path(name)
    finally:
        if before is None:
            os.environ.pop(_JOURNAL_VAR, None)
        else:
            os.environ[_JOURNAL_VAR] = before
        Path(name).unlink(missing_ok=True)


def _journal_items(journal: Path) -> tuple[list[str], list[tuple[str, str]]]:
    entries: dict[str, None] = {}
    results: dict[tuple[str, str], None] = {}
    for line in journal.read_text(errors="replace").splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "entry":
            entries[words[1]] = None
        elif len(words) == 3 and words[0] == "result":
            results[(words[1], words[2])] = None
    return list(entries), list(results)


def _kernel_row(key: str, files: dict[str, str]) -> tuple[Any, ...]:
    body = json.loads(files[cache.MANIFEST])["body"]
    parts = body.get("parts", {})
    programs = json.loads(files["programs.json"])
    chosen = programs[int(body["chosen"])]
    predicted = (chosen.get("prediction") or {}).get("time_ms")
    timed = json.loads(files["eval.json"]).get("candidates", []) if "eval.json" in files else []
    measured = next((c.get("measured_ms") for c in timed if c.get("rank") == int(body["chosen"]) + 1), None)
    return (key, str(parts.get("op_name", body.get("kernel_name", ""))), str(parts.get("op_hash", "")),
            str(chosen.get("hw", "")), str(parts.get("hw_hash", "")),
            str(parts.get("backend", "")), str(parts.get("toolchain", "")), str(chosen.get("line", "")),
            predicted, measured, json.dumps(files))


def export(journal: Path, db: Path) -> Exported:
    """Copy every cache entry and result the journal names into the database ``db`` (made if absent, added to
    if present), written beside it and renamed into place."""
    entries, results = _journal_items(journal)
    if db.exists() and not db.is_file():
        raise InputError("exists and is not a file", field="--db", source=str(db))
    try:
        fd, name = tempfile.mkstemp(prefix=f".{db.name}.", suffix=".part", dir=db.parent if str(db.parent) else ".")
        os.close(fd)
    except OSError as err:
        raise InputError(f"cannot write there: {err.strerror or err}", field="--db", source=str(db)) from None
    part = Path(name)
    try:
        lock = _locked(db)
    except OSError as err:
        part.unlink(missing_ok=True)
        raise InputError(f"cannot lock the kernel database: {err.strerror or err}", field="--db",
                         source=str(db)) from None
    try:
        if db.exists():
            cache.open_db(db, field="--db").close()   # another kind of file is refused, not replaced
            shutil.copyfile(db, part)
        else:
            part.unlink()
        con = cache.open_db(part, write=True)
        try:
            n_kernels = n_results = 0
            for key in entries:
                files = cache.entry_files(key)
                if files is not None:
                    con.execute("INSERT OR REPLACE INTO kernels VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                                _kernel_row(key, files))
                    n_kernels += 1
            for kind, key in results:
                stored = cache.result_files(kind, key)
                if stored is not None:
                    con.execute("INSERT OR REPLACE INTO results VALUES (?,?,?,?)", (kind, key, *stored))
                    n_results += 1
            total = int(con.execute("SELECT COUNT(*) FROM kernels").fetchone()[0])
            con.commit()
        finally:
            con.close()
        os.replace(part, db)
    except (OSError, sqlite3.Error) as err:
        raise InputError(f"cannot write the kernel database: {err}", field="--db", source=str(db)) from None
    finally:
        part.unlink(missing_ok=True)
        lock.close()
    return Exported(n_kernels, n_results, total)


def _locked(db: Path) -> Any:
    """An exclusive lock on ``<db>.lock`` for the copy-add-rename: two builds adding to one database at once
    would otherwise each rename their copy over the other's, and one's kernels would be lost."""
    import fcntl

    fh = open(db.with_name(db.name + ".lock"), "a")  # noqa: SIM115 - held until the caller closes it
    fcntl.flock(fh, fcntl.LOCK_EX)
    return fh
