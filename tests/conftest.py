"""Every test gets a kernel cache of its own, so no test sees another's entries or the user's ~/.cache/roller.

Markers (pyproject.toml): ``slow`` (over about five seconds here), and per toolchain ``nvcc``, ``hipcc``,
``chromium``; ``pytest -m "not slow"`` is the quick tier, CI runs everything.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Module- and session-scoped fixtures run before the per-test fixture below: they get a session folder.
_SESSION = Path(tempfile.mkdtemp(prefix="roller-test-cache-"))
atexit.register(shutil.rmtree, _SESSION, ignore_errors=True)
os.environ["ROLLER_CACHE_DIR"] = str(_SESSION)
os.environ.pop("ROLLER_NO_CACHE", None)


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path_factory.mktemp("roller-cache")
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(folder))
    return folder
