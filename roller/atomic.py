"""Writing a file so that readers see the old contents or the new, never a half-written file."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it over ``path`` (a rename within one
    folder is atomic). On any failure the temporary file is removed and ``path`` is left as it was."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.resolve().parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# -- folders built beside their destination --------------------------------------------------------------------
# ``roller build`` and ``roller compare`` write their output into ``.<DIR>.tmp-<pid>-<random>`` beside DIR and
# rename it into place at the end, so that a failed run leaves DIR as it was. A run killed by SIGKILL cannot
# remove its folder; the next run into the same DIR does (the pid in the name says whether its owner still runs).
_STALE_LEGACY_S = 3600  # a folder from before pids were in the names: stale once untouched for an hour


def _owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def sweep_stale(target: str | Path) -> list[Path]:
    """Remove the staging folders of ``target`` that runs killed before finishing left beside it (first moving
    back into ``target`` any earlier output such a run had moved aside). Returns the folders removed."""
    import shutil
    import time

    dest = Path(target)
    parent = dest.resolve().parent
    removed: list[Path] = []
    try:
        candidates = list(parent.glob(f".{dest.name}.tmp-*"))
    except OSError:
        return removed
    for folder in candidates:
        rest = folder.name[len(f".{dest.name}.tmp-"):]
        pid_text = rest.split("-", 1)[0]
        try:
            if pid_text.isdigit():
                if int(pid_text) == os.getpid() or _owner_alive(int(pid_text)):
                    continue
            elif time.time() - folder.lstat().st_mtime < _STALE_LEGACY_S:
                continue
            if not folder.is_dir() or folder.is_symlink():
                continue
            if rest.endswith("-old") and not dest.exists() and not dest.is_symlink():
                os.rename(folder, dest)  # a whole earlier output moved aside: it is the output again
                continue
            for old in folder.glob(".old-*"):  # killed between moving an output aside and moving its new one in
                final = dest / old.name[len(".old-"):]
                if dest.is_dir() and not final.exists() and not final.is_symlink():
                    os.rename(old, final)
        except OSError:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            removed.append(folder)
    return removed


def staging_dir(target: str | Path) -> Path:
    """A new private folder beside ``target`` to build it in (after sweeping stale ones); OSError when the
    parent cannot be written."""
    dest = Path(target)
    parent = dest.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(dest)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-{os.getpid()}-", dir=parent))


def exchange(a: str | Path, b: str | Path) -> bool:
    """Swap two existing paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the system or file
    system cannot, and the caller falls back to two renames."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = renameat2(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), rename_exchange)
    return rc == 0
