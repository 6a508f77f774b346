"""The kernel cache never follows a link out of itself and is not used where others can write (issue 38):
``roller cache clear`` with ``entries`` a link deleted the link's target's files; an entry that is a link to a
folder elsewhere was served; a cache folder of mode 777 or of another user was used without a word."""
from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest

import roller
from roller import cache
from roller.errors import UnsafeCacheWarning

MM = {"name": "mm_links", "op": "matmul", "M": 32, "N": 16, "K": 8}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ROLLER_NO_CACHE", raising=False)
    return tmp_path / "cache"


def outside(tmp_path: Path) -> Path:
    """A folder of the user's that the cache must never touch, with a file in it."""
    folder = tmp_path / "precious"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    return folder


def test_clear_removes_a_link_not_what_it_points_to(tmp_path: Path) -> None:
    roller.compile(MM, hw="v100", backend="opencl", top_k=1)
    root = tmp_path / "cache"
    precious = outside(tmp_path)
    for own in ("entries", "tmp"):
        shutil.rmtree(root / own)
        (root / own).symlink_to(precious, target_is_directory=True)
    assert cache.clear() == 0
    assert (precious / "thesis.tex").read_text() == "years of work"
    assert not os.path.lexists(root / "entries") and not os.path.lexists(root / "tmp")


def test_an_entry_that_is_a_link_is_not_served(tmp_path: Path) -> None:
    first = roller.compile(MM, hw="v100", backend="opencl", top_k=1)
    (entry,) = (tmp_path / "cache" / "entries").iterdir()
    elsewhere = tmp_path / "planted"
    shutil.copytree(entry, elsewhere)   # a valid entry (checksums and all), kept outside the cache
    shutil.rmtree(entry)
    entry.symlink_to(elsewhere, target_is_directory=True)
    again = roller.compile(MM, hw="v100", backend="opencl", top_k=1)
    assert not again.cache_hit and cache.last_event == "damaged: not a folder (a link or a file)"
    assert again.source == first.source and elsewhere.is_dir()   # rebuilt; the link went, its target stays
    assert entry.is_dir() and not entry.is_symlink()


def test_a_cache_others_can_write_is_not_used(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    root.chmod(0o777)
    cache._WARNED.discard(str(root))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k = roller.compile(MM, hw="v100", backend="opencl", top_k=1)
    assert not k.cache_hit and not (root / "entries").exists()
    messages = [str(w.message) for w in caught if issubclass(w.category, UnsafeCacheWarning)]
    assert len(messages) == 1 and f"the kernel cache {root} is writable by other users (mode 777)" in messages[0]
    root.chmod(0o700)
    roller.compile(MM, hw="v100", backend="opencl", top_k=1)
    assert roller.compile(MM, hw="v100", backend="opencl", top_k=1).cache_hit


def test_a_new_cache_is_its_owners_only(tmp_path: Path) -> None:
    roller.compile(MM, hw="v100", backend="opencl", top_k=1)
    assert (tmp_path / "cache").stat().st_mode & 0o077 == 0
