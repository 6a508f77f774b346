"""`roller hw probe` on the local OpenCL device (PoCL in CI): the file validates and the numbers are plausible."""
from __future__ import annotations

import statistics

import pytest

from roller import hw
from roller.cli.main import main

cl = pytest.importorskip("pyopencl")


def _device():
    try:
        platforms = cl.get_platforms()
    except (cl.Error, RuntimeError):  # no ICD loader / no platform
        platforms = []
    if not platforms:
        pytest.skip("no OpenCL platform present")
    from roller.backends.opencl.launcher import pick_device

    return pick_device()


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    dev = _device()
    out = tmp_path_factory.mktemp("probe") / "local-cpu.yaml"
    code = main(["hw", "probe", "--quick", "-o", str(out)])
    assert code == 0
    return dev, out


def test_probe_writes_a_valid_description(probed, capsys):
    dev, out = probed
    d = hw.load(str(out))
    assert d.name == "local-cpu" and d.backend == "opencl"
    assert main(["hw", "validate", str(out)]) == 0
    text = out.read_text()
    assert "measured" in text and "queried" in text
    assert d.parallelism.compute_units == dev.max_compute_units
    assert d.memory[0].capacity_bytes == dev.global_mem_size
    # Local memory that is cached RAM (PoCL) is described as the cache it lives in.
    if d.memory[1].scope == "cache":
        assert d.memory[1].capacity_per_unit_bytes == dev.local_mem_size
    else:
        assert d.memory[1].capacity_per_block_bytes == dev.local_mem_size
    assert d.parallelism.max_threads_per_block <= dev.max_work_group_size


def test_probe_numbers_are_plausible(probed):
    dev, out = probed
    d = hw.load(str(out))
    clock_hz = (dev.max_clock_frequency or 5000) * 1e6
    lanes = max(dev.native_vector_width_float, dev.preferred_vector_width_float, 1)
    # FMA = 2 FLOP, at most 2 FMA pipes per unit, turbo up to 2x the reported clock
    flops_limit = dev.max_compute_units * clock_hz * 2 * lanes * 2 * 2
    fp32 = d.compute["float32"].vector
    assert 0 < fp32.effective_tflops <= fp32.peak_tflops
    assert fp32.peak_tflops * 1e12 <= flops_limit
    for layer in d.memory[:2]:
        assert 0 < layer.bandwidth_effective_gbps <= layer.bandwidth_peak_gbps
        assert layer.bandwidth_peak_gbps < 10_000        # no CPU moves 10 TB/s
    assert d.peak_flops("float32") > 0 and d.bandwidth(0) > 0


def test_probe_api_quick():
    _device()
    from roller.backends.opencl import probe

    lines = []
    res = probe.probe(quick=True, log=lines.append)
    assert len(lines) >= 7 and lines[0].startswith("[1/7]")
    assert all(x > 0 for x in res.global_gbps + res.local_gbps + res.fp32_tflops)
    assert res.seconds < 60
    d = hw.load_text(res.to_yaml("p"), "p.yaml")
    assert d.compute["float32"].vector.effective_tflops == pytest.approx(
        float(f"{statistics.median(res.fp32_tflops):.6g}"))
    # Calibration: what was measured is what the description holds (4 significant digits), and the register-tile
    # loop never beats the FMA-chain peak by more than timing noise.
    cal = d.calibration
    assert cal.launch_us == pytest.approx(res.launch_us, rel=1e-3)
    assert cal.per_block_us == pytest.approx(res.per_block_us, rel=1e-3)
    # When the other units start: a delay, at most the 1 ms busy loop it is measured against.
    if res.compute_units > 1:
        assert res.join_us is not None and 0 < res.join_us <= 1.5 * probe.JOIN_TARGET_S * 1e6
        assert cal.join_us == pytest.approx(res.join_us, rel=1e-3)
    else:
        assert res.join_us is None and cal.join_us is None
    assert [(t.rows, t.cols) for t in cal.register_tiles] == [(r, c) for r, c, _ in res.tile_gflops]
    assert len(cal.register_tiles) == len(probe.TILE_SHAPES_QUICK)
    for t, (_, _, g) in zip(cal.register_tiles, res.tile_gflops):
        assert t.gflops == pytest.approx(g, rel=1e-3)
        assert 0 < t.gflops * 1e9 <= 1.5 * d.peak_flops("float32", peak=True)


def test_probe_progress_on_stderr(probed, capsys, tmp_path):
    _device()
    assert main(["hw", "probe", "--quick"]) == 0
    captured = capsys.readouterr()
    assert "[7/7]" in captured.err and captured.out.startswith("# Written by `roller hw probe`")
    assert hw.load_text(captured.out, "stdout").name == "probed-opencl"


def test_device_selection_env(monkeypatch):
    _device()
    from roller.backends.opencl.launcher import pick_device
    from roller.errors import InputError

    first = cl.get_platforms()[0]
    monkeypatch.setenv("ROLLER_CL_DEVICE", first.name[:6] + ":0")
    assert pick_device().platform.name == first.name
    monkeypatch.setenv("ROLLER_CL_DEVICE", "no-such-platform-xyz")
    with pytest.raises(InputError, match="no OpenCL device matches"):
        pick_device()
    # an index that is no number, or past the platform's devices, is refused (not the first device silently)
    monkeypatch.setenv("ROLLER_CL_DEVICE", first.name[:6] + ":x")
    with pytest.raises(InputError, match="the device index after ':' must be a number"):
        pick_device()
    monkeypatch.setenv("ROLLER_CL_DEVICE", first.name[:6] + ":99")
    with pytest.raises(InputError, match="no OpenCL device matches"):
        pick_device()


def test_probe_into_a_missing_folder_fails_before_probing(tmp_path, capsys):
    """A one-line input error (exit 2) at once, not a traceback after the probe's half minute."""
    out = tmp_path / "nowhere" / "x.yaml"
    assert main(["hw", "probe", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "folder does not exist" in err and "--output" in err and "Traceback" not in err
    assert "device:" not in err   # the probe's first progress line: it never started
    assert not out.parent.exists()


def test_probe_keeps_no_temporary_file(probed):
    _, out = probed
    assert [p.name for p in out.parent.iterdir()] == [out.name]
