"""``roller.compile`` and the kernel cache (``roller.cache``, ``roller cache info|clear``)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import roller
from roller import cache
from roller.backends import get
from roller.cli.main import main
from roller.errors import InputError

REPO = Path(__file__).resolve().parents[2]
needs_cl = pytest.mark.skipif(not get("opencl").can_run_here(), reason=get("opencl").why_not_here())

MM = {"name": "mm_api", "op": "matmul", "M": 67, "N": 33, "K": 19}
CONV = {"name": "conv_api", "op": "conv2d", "N": 1, "C": 5, "H": 9, "W": 11, "F": 7, "KH": 3, "KW": 3,
        "padding": "SAME"}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ROLLER_NO_CACHE", raising=False)


def _entries(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "cache" / "entries"
    return sorted(folder.iterdir()) if folder.is_dir() else []


@needs_cl
def test_compile_positional_keyword_and_out():
    k = roller.compile(MM, hw="v100", backend="opencl", top_k=3)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((67, 19)).astype(np.float32)
    b = rng.standard_normal((19, 33)).astype(np.float32)
    want = a @ b
    np.testing.assert_allclose(k(a, b), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(k(B=b, A=a), want, rtol=1e-4, atol=1e-4)
    out = np.zeros((67, 33), np.float32)
    assert k(a, b, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    assert k.input_names == ["A", "B"] and k.output_shape == (67, 33)
    assert "__kernel" in k.source and k.program.line().startswith("global>shared")
    assert k.predicted_ms is not None and k.predicted_ms > 0
    assert k.benchmark(repeat=2) > 0


@needs_cl
def test_compile_from_path_and_conv():
    k = roller.compile(REPO / "examples" / "relu.json", hw="pocl-cpu")
    x = np.random.default_rng(0).standard_normal(k.op.inputs[0].shape).astype(np.float32)
    np.testing.assert_array_equal(k(x), np.maximum(x, 0))
    c = roller.compile(CONV, hw="mi50", backend="opencl", top_k=2)
    x = roller.random_inputs(c.op, seed=1)
    np.testing.assert_allclose(c(**x), roller.reference(c.op, x), rtol=1e-4, atol=1e-4)


def test_compile_bad_arguments():
    # (no hw= is this machine's own description: tests/hw/test_host.py)
    with pytest.raises(InputError, match="top_k must be a positive integer"):
        roller.compile(MM, hw="v100", backend="opencl", top_k=0)
    with pytest.raises(InputError):
        roller.compile(MM, hw="no-such-device")
    with pytest.raises(InputError):
        roller.compile({"op": "matmul", "M": 0, "N": 1, "K": 1}, hw="v100", backend="opencl")


@needs_cl
def test_call_with_wrong_shape():
    k = roller.compile(MM, hw="pocl-cpu", top_k=1)
    with pytest.raises(InputError, match="A"):
        k(np.zeros((66, 19), np.float32), np.zeros((19, 33), np.float32))
    with pytest.raises(InputError):
        k(np.zeros((67, 19), np.float32))


@needs_cl
def test_evaluate_chooses_measured_fastest():
    k = roller.compile(MM, hw="pocl-cpu", top_k=3, evaluate=True, repeat=2, progress=False)
    ev = k.evaluation
    assert ev is not None and len(ev["candidates"]) == 3
    times = [c["measured_ms"] for c in ev["candidates"]]
    assert k.chosen == min(range(3), key=lambda i: times[i])
    x = roller.random_inputs(k.op, seed=2)
    np.testing.assert_allclose(k(**x), roller.reference(k.op, x), rtol=1e-4, atol=1e-4)


# ---- cache ----------------------------------------------------------------------------------------------------

def test_cache_hit_key_and_no_cache(tmp_path, monkeypatch):
    first = roller.compile(MM, hw="v100", backend="opencl", top_k=2)
    assert not first.cache_hit and len(_entries(tmp_path)) == 1
    second = roller.compile(MM, hw="v100", backend="opencl", top_k=2)
    assert second.cache_hit and cache.last_event == "hit"
    assert second.source == first.source and second.program.to_json() == first.program.to_json()
    assert [p.to_json() for p in second.programs] == [p.to_json() for p in first.programs]
    # Anything in the key changes the entry: top_k, the description, the op.
    roller.compile(MM, hw="v100", backend="opencl", top_k=3)
    roller.compile(MM, hw="a100", backend="opencl", top_k=2)
    roller.compile(dict(MM, K=20), hw="v100", backend="opencl", top_k=2)
    assert len(_entries(tmp_path)) == 4
    monkeypatch.setenv("ROLLER_NO_CACHE", "1")
    third = roller.compile(dict(MM, K=21), hw="v100", backend="opencl", top_k=2)
    assert not third.cache_hit and len(_entries(tmp_path)) == 4


@pytest.mark.parametrize("damage", ["kernel", "manifest", "missing", "programs"])
def test_damaged_entry_is_rebuilt(tmp_path, damage):
    first = roller.compile(MM, hw="v100", backend="opencl", top_k=2)
    (entry,) = _entries(tmp_path)
    if damage == "kernel":
        path = entry / first.artifact.main_file
        path.write_text(path.read_text().replace("+=", "-="))
    elif damage == "manifest":
        (entry / "entry.json").write_text("{not json")
    elif damage == "missing":
        (entry / "launch.json").unlink()
    else:
        doc = json.loads((entry / "entry.json").read_text())
        doc["body"]["chosen"] = 7  # checksummed body edited: the manifest's own sum no longer matches
        (entry / "entry.json").write_text(json.dumps(doc))
    again = roller.compile(MM, hw="v100", backend="opencl", top_k=2)
    assert not again.cache_hit and cache.last_event.startswith("damaged")
    assert again.source == first.source
    assert roller.compile(MM, hw="v100", backend="opencl", top_k=2).cache_hit


def test_cache_cli_info_and_clear(tmp_path, capsys):
    roller.compile(MM, hw="v100", backend="opencl", top_k=1)
    roller.compile(CONV, hw="v100", backend="opencl", top_k=1)
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "cache") in out and "entries  2" in out
    assert main(["cache", "clear"]) == 0
    assert "removed 2 cache entries" in capsys.readouterr().out
    assert _entries(tmp_path) == []
