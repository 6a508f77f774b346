"""The compare report's index.html in headless Chromium: no console errors (the page's own script turns an
image that does not decode into one), the script ran to its end, and a screenshot of sensible size.

Chromium is Debian's ``chromium`` package (``scripts/setup.sh --dev`` installs it); without it these tests skip.
"""
from __future__ import annotations

import contextlib
import io
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from roller.cli.main import main

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (scripts/setup.sh --dev installs it)"),
              pytest.mark.chromium]

# Chromium logs page console messages (console.log/error, uncaught exceptions) as "...:CONSOLE(n)] ..." or
# "...:CONSOLE:n] ..." lines on stderr with --enable-logging=stderr.
CONSOLE = re.compile(r"CONSOLE[(:]\d+\]|Uncaught ")


def _chromium(tmp: Path, url: str, *flags: str) -> subprocess.CompletedProcess:
    argv = [str(CHROMIUM), "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
            "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp / 'profile'}",
            "--enable-logging=stderr", "--v=0", *flags, url]
    p = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    return p


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if CONSOLE.search(line)]


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    """A report of the example ops on every bundled description (no --hw: all of them)."""
    out = tmp_path_factory.mktemp("html") / "report"
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(["compare", str(REPO / "examples/multi.json"), "-o", str(out)])
    assert rc == 0
    return out / "index.html"


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_renders_without_console_errors_and_screenshot(page, tmp_path):
    shot = tmp_path / "report.png"
    p = _chromium(tmp_path, page.as_uri(), f"--screenshot={shot}", "--window-size=1400,2000")
    assert _console_errors(p.stderr) == []
    assert _png_size(shot) == (1400, 2000)
    assert shot.stat().st_size > 50_000  # tables and charts, not a blank page
    try:
        import matplotlib.image as mpimg
    except ImportError:
        return
    pixels = mpimg.imread(str(shot))
    assert len({tuple(px) for px in pixels[::16, ::16].reshape(-1, pixels.shape[-1]).tolist()}) > 50


def test_script_ran_and_counted_rows(page, tmp_path):
    p = _chromium(tmp_path, page.as_uri(), "--dump-dom")
    body = re.search(r"<body[^>]*>", p.stdout)
    assert body is not None
    from roller.hw import list_bundled
    from roller.ir import load_ops

    rows = len(load_ops(REPO / "examples/multi.json")) * len(list_bundled())
    assert 'data-report-ready="ok"' in body.group(0) and f'data-rows="{rows}"' in body.group(0)
    assert _console_errors(p.stderr) == []


@pytest.mark.parametrize("breakage", ["image", "script"])
def test_console_check_catches_errors(page, tmp_path, breakage):
    """Negative control: a broken inline image or a script error is reported, so the tests above can fail."""
    html = page.read_text()
    if breakage == "image":
        assert 'src="data:image/svg+xml;base64,' in html
        html = html.replace('src="data:image/svg+xml;base64,', 'src="data:image/svg+xml;base64,AAAA', 1)
    else:
        html = html.replace("<script>", "<script>undefinedFunction();", 1)
    broken = tmp_path / "broken.html"
    broken.write_text(html)
    p = _chromium(tmp_path, broken.as_uri(), "--dump-dom")
    errors = _console_errors(p.stderr)
    assert errors, p.stderr[-2000:]
    if breakage == "image":
        assert "image did not decode" in "\n".join(errors)
        assert 'data-report-ready="broken-images"' in p.stdout
