"""roller.atomic.write_atomic: the old contents or the new, never a half-written file or a stray temporary."""
from __future__ import annotations

import pytest

from roller.atomic import write_atomic


def test_write_atomic_replaces_the_file(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text("old")
    write_atomic(path, b"new")
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["d.yaml"]


def test_write_atomic_failure_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "d.yaml"
    path.write_text("old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("roller.atomic.os.replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, b"new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["d.yaml"]
