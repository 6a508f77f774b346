"""Calibration in hardware descriptions: the loader's checks, the nearest-tile lookup, and how the model uses
measured values (and works from the peaks without them)."""
from __future__ import annotations

import dataclasses
import math

import pytest

from roller import hw
from roller.cli.main import main
from roller.construction import construct, repredict
from roller.ir import load_op
from roller.ir.vector import vector_width
from roller.perf.micro import _edge_share, makespan, predict, register_tile, resources
from roller.perf.traffic import TileGeometry
from tests.hw.test_errors import BASE

MATMUL = {"name": "mm", "op": "matmul", "M": 96, "N": 80, "K": 64, "dtype": "float32"}
CAL = """\
calibration:
  launch_us: 2.5
  per_block_us: 0.5
  register_tile_gflops:
    - {rows: 1, cols: 1, gflops: 4}
    - {rows: 4, cols: 16, gflops: 100}
    - {rows: 16, cols: 4, gflops: 50}
  gathered_tile_gflops:
    - {rows: 1, cols: 1, gflops: 1}
    - {rows: 4, cols: 16, gflops: 3}
  join_us: 40
"""
FIRST = BASE.count("\n") + 2   # line of the first key under "calibration:" once CAL is appended to BASE


def _without_calibration(d: hw.HardwareDesc) -> hw.HardwareDesc:
    return dataclasses.replace(d, calibration=None)


def test_bundled_pocl_description_is_calibrated():
    cal = hw.load("pocl-cpu").calibration
    assert cal is not None and cal.launch_us and cal.per_block_us
    assert len(cal.register_tiles) >= 10
    assert {(t.rows, t.cols) for t in cal.register_tiles} >= {(1, 1), (4, 4), (16, 16)}


def test_calibration_round_trips_and_changes_the_hash():
    d = hw.load("pocl-cpu")
    again = hw.from_dict(d.to_dict())
    assert again.calibration == d.calibration
    assert again.content_hash() == d.content_hash()
    assert _without_calibration(d).content_hash() != d.content_hash()


def test_loads_from_yaml(tmp_path):
    path = tmp_path / "cal.yaml"
    path.write_text(BASE + CAL)
    cal = hw.load(str(path)).calibration
    assert cal.launch_us == 2.5 and cal.per_block_us == 0.5 and cal.join_us == 40
    assert [(t.rows, t.cols, t.gflops) for t in cal.register_tiles] == [
        (1, 1, 4.0), (4, 16, 100.0), (16, 4, 50.0)]
    assert [(t.rows, t.cols, t.gflops) for t in cal.gathered_tiles] == [(1, 1, 1.0), (4, 16, 3.0)]


def test_nearest_tile_by_shape():
    cal = hw.from_dict(hw.load_text(BASE + CAL).to_dict()).calibration
    assert cal.tile_flops(4, 16) == 100e9              # measured shape
    assert cal.tile_flops(8, 16) == 100e9              # one doubling from 4x16, two from 16x4
    assert cal.tile_flops(32, 2) == 50e9
    assert cal.tile_flops(1, 2) == 4e9
    # Equally near to 4x16 and 16x4 (8x8): the geometric mean of the two.
    assert cal.tile_flops(8, 8) == pytest.approx(math.sqrt(100 * 50) * 1e9)
    assert hw.Calibration().tile_flops(4, 4) is None
    # Gathered reads have their own table, and fall back to the plain one when it is missing.
    assert cal.tile_flops(4, 16, gathered=True) == 3e9
    assert cal.tile_flops(2, 2, gathered=True) == 1e9
    assert dataclasses.replace(cal, gathered_tiles=()).tile_flops(4, 16, gathered=True) == 100e9


CASES = [
    ("unknown-key", CAL.replace("launch_us", "launch_ms"),
     f"{{p}}:{FIRST} calibration.launch_ms: unknown key; did you mean 'launch_us'?"),
    ("launch-negative", CAL.replace("launch_us: 2.5", "launch_us: -1"),
     f"{{p}}:{FIRST} calibration.launch_us: expected a positive number, got -1"),
    ("gflops-zero", CAL.replace("gflops: 100", "gflops: 0"),
     f"{{p}}:{FIRST + 4} calibration.register_tile_gflops[1].gflops: expected a positive number, got 0"),
    ("rows-float", CAL.replace("rows: 16", "rows: 1.5"),
     f"{{p}}:{FIRST + 5} calibration.register_tile_gflops[2].rows: expected a positive integer, got 1.5"),
    ("cols-missing", CAL.replace("cols: 4, ", ""),
     f"{{p}}:{FIRST + 5} calibration.register_tile_gflops[2]: missing key 'cols'"),
    ("shape-twice", CAL.replace("rows: 16, cols: 4", "rows: 4, cols: 16"),
     (f"{{p}}:{FIRST + 5} calibration.register_tile_gflops[2]: expected each rows x cols once, "
      "got 4x16 again (also register_tile_gflops[1])")),
    ("gathered-twice", CAL.replace("rows: 4, cols: 16, gflops: 3", "rows: 1, cols: 1, gflops: 3"),
     (f"{{p}}:{FIRST + 8} calibration.gathered_tile_gflops[1]: expected each rows x cols once, "
      "got 1x1 again (also gathered_tile_gflops[0])")),
    ("tiles-not-list", CAL[:CAL.index("  register_tile_gflops")] + "  register_tile_gflops: 12\n",
     f"{{p}}:{FIRST + 2} calibration.register_tile_gflops: expected a list, got 12"),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_calibration(tmp_path, capsys, text, expected):
    path = tmp_path / "x.yaml"
    path.write_text(BASE + text)
    code = main(["hw", "validate", str(path)])
    assert capsys.readouterr().err == f"roller: error: {expected.format(p=path)}\n"
    assert code == 2


@pytest.mark.parametrize("op,guarded", [
    (MATMUL, False),
    ({"name": "c", "op": "conv2d", "N": 1, "C": 4, "H": 9, "W": 9, "F": 8, "KH": 3, "KW": 3,
      "padding": "SAME"}, True),
    ({"name": "d", "op": "depthwise_conv2d", "N": 1, "C": 4, "H": 9, "W": 9, "KH": 3, "KW": 3}, True),
    # a window that never leaves its input (no padding) needs no test
    ({"name": "p", "op": "maxpool2d", "N": 1, "C": 4, "H": 8, "W": 8, "K": 2}, False),
    ({"name": "r", "op": "elementwise", "fn": "relu", "shapes": {"X": [4, 9]}}, False),
    ({"name": "t", "op": "transpose", "shape": [4, 9], "perm": [1, 0]}, False),
])
def test_guarded_reads(op, guarded):
    assert TileGeometry(load_op(op)).guarded_reads is guarded


def test_a_window_over_a_padded_copy_is_not_guarded():
    from roller.ir.fuse import prepare

    conv = load_op({"name": "c", "op": "conv2d", "N": 1, "C": 4, "H": 9, "W": 9, "F": 8, "KH": 3, "KW": 3,
                    "padding": "SAME"})
    padded = prepare(conv, gemm_conv=False, pad=True)
    assert padded.preparation is not None and padded.preparation.pads
    assert TileGeometry(conv).guarded_reads and not TileGeometry(padded).guarded_reads


def test_register_tile_is_rows_by_output_run():
    expr = load_op(MATMUL)
    geo = TileGeometry(expr)
    assert register_tile(geo, (8, 16, 1)) == (8, 16)   # (m, n, k): n is C's contiguous run
    assert register_tile(geo, (1, 4, 1)) == (1, 4)


def _without_join(d: hw.HardwareDesc) -> hw.HardwareDesc:
    return dataclasses.replace(d, calibration=dataclasses.replace(d.calibration, join_us=None))


def test_model_uses_calibration_and_works_without():
    cal_hw = _without_join(hw.load("pocl-cpu"))   # the late-joining units: test_late_units_* below
    peak_hw = _without_calibration(cal_hw)
    op = load_op(MATMUL)
    # The measured tiles also steer construction (bigger register tiles), so compare one set of programs
    # predicted both ways.
    programs = construct(op, cal_hw, top_k=50)
    assert programs
    cal = cal_hw.calibration
    for a in programs:
        b = repredict(a, peak_hw)
        geo = TileGeometry(a.expr)
        rows, cols = register_tile(geo, a.thread_tile.shape)
        # Compute scales with the measured tile throughput instead of the FMA-chain peak (threads at the end
        # of the vector axis at the gathered table's)...
        edge = _edge_share(geo, a.tiles[0].shape, a.thread_tile.shape)
        slowdown = 1 - edge + edge * cal.tile_flops(rows, cols) / cal.tile_flops(rows, cols, True)
        ratio = cal_hw.peak_flops() / cal.tile_flops(rows, cols) * slowdown
        assert a.prediction.compute_time_s == pytest.approx(b.prediction.compute_time_s * ratio)
        # ...and the fixed costs are added on top of the bottleneck's time.
        rounds = -(-a.grid // cal_hw.parallelism.compute_units)
        fixed = (cal.launch_us + rounds * cal.per_block_us) * 1e-6
        slowest = max([a.prediction.compute_time_s] + [t for _, t in a.prediction.layer_times_s])
        assert a.prediction.time_s == pytest.approx(slowest + fixed)
        # The fraction of peak stays relative to the device's peak, not the tile's.
        useful = math.prod(geo.extents) * geo.flops_per_point
        expected = useful / a.prediction.time_s / cal_hw.peak_flops()
        assert a.prediction.fraction_of_peak == pytest.approx(expected)


def test_repredict_reproduces_and_follows_the_description():
    cal_hw = hw.load("pocl-cpu")
    progs = construct(load_op(MATMUL), cal_hw, top_k=5)
    for p in progs:
        assert repredict(p, cal_hw).prediction == p.prediction
    peak_hw = _without_calibration(cal_hw)
    again = [repredict(p, peak_hw) for p in progs]
    # Without the measured tile throughput compute is predicted from the 466 GFLOP/s peak: faster.
    assert all(a.prediction.time_s < p.prediction.time_s for a, p in zip(again, progs))
    assert [a.line() for a in again] == [p.line() for p in progs]


def test_fidelity_repredict_needs_no_device(tmp_path):
    """bench/fidelity.py --repredict re-ranks stored measurements: the stored model order comes back unchanged
    when nothing changed, and the figures follow from the stored times."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    op = {"name": "mm", "op": "matmul", "M": 40, "N": 24, "K": 16, "dtype": "float32"}
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"ops": [op]}))
    progs = construct(load_op(op), hw.load("pocl-cpu"), top_k=4)
    times = [3.0, 1.0, 2.0, 4.0][:len(progs)]   # made-up measurements: the model's #2 is the fastest
    passes = [[3.0, 3.5], [1.2, 1.0], [2.0, 4.5], [4.0, 4.2]]   # the second pass swaps #3 and #4
    rows = [{"rank": i, "program": p.line(), "predicted_ms": p.prediction.time_ms,
             "bottleneck": p.prediction.bottleneck, "measured_ms": t, "passes_ms": ps, "rprogram": p.to_json()}
            for i, (p, t, ps) in enumerate(zip(progs, times, passes), 1)]
    stored = tmp_path / "stored.json"
    stored.write_text(json.dumps({"records": [{"op": "mm", "candidates": rows}]}))
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(root / "bench/fidelity.py"), "--suite", str(suite), "--repredict",
                    str(stored), "--json", str(out)], check=True, capture_output=True, text=True)
    rec = json.loads(out.read_text())["records"][0]
    assert [c["program"] for c in rec["candidates"]] == [p.line() for p in progs]
    assert rec["rank_of_best"] == 2 and rec["top1_over_best"] == pytest.approx(3.0)
    from roller.compiler.tune import spearman
    assert len(progs) == 4
    assert rec["spearman"] == pytest.approx(spearman([p.prediction.time_ms for p in progs], times))
    # How well the two passes rank the candidates alike: 3 1 2 4 against 2 1 4 3.
    assert rec["repeat_spearman"] == pytest.approx(0.4)
    assert json.loads(out.read_text())["summary"]["median_repeat_spearman"] == pytest.approx(0.4)


@pytest.mark.parametrize("units", [1, 2, 3, 8])
def test_makespan_without_a_join_is_the_rounds(units):
    for grid in range(1, 700):
        assert makespan(grid, 1.0, units, 0.0) == -(-grid // units)


def test_makespan_with_late_units():
    # Two groups of 1: the second unit takes the second group if it joins before the first unit is done.
    assert makespan(2, 1.0, 2, 0.25) == 1.25
    assert makespan(2, 1.0, 2, 5.0) == 2.0
    # A join later than all the work: the first unit runs everything, taking half of what is left each time.
    assert makespan(64, 1.0, 2, 100.0) == 64.0
    # 64 groups, join after 8: the first unit takes 32 at once; the second 16 at 8 and 8 at 24; at 32 the first
    # takes 4, the second 2, 1 and 1: ends at 36 (32 with both from the start).
    assert makespan(64, 1.0, 2, 8.0) == 36.0


def test_late_units_change_the_prediction_only_where_measured():
    cal_hw = hw.load("pocl-cpu")
    assert cal_hw.calibration.join_us
    no_join = _without_join(cal_hw)
    for p in construct(load_op(MATMUL), cal_hw, top_k=10):
        late, prompt = p.prediction, repredict(p, no_join).prediction
        block = prompt.time_s - (cal_hw.calibration.launch_us
                                 + -(-p.grid // 2) * cal_hw.calibration.per_block_us) * 1e-6
        # The same per-block time, handed out to a second unit that starts join_us late.
        expected = makespan(p.grid, block / -(-p.grid // 2), 2, cal_hw.calibration.join_us * 1e-6)
        assert late.time_s - prompt.time_s == pytest.approx(expected - block, rel=1e-6, abs=1e-12)
        assert late.time_s >= prompt.time_s


def test_vector_width_is_the_widest_that_divides():
    assert [vector_width(n) for n in (64, 32, 24, 12, 6, 3, 1)] == [16, 16, 8, 4, 2, 0, 0]


@pytest.mark.parametrize("n,block,thread,share", [
    (31, 32, 16, 0.5),    # two runs of 16 over 31 columns: the second crosses the end
    (31, 32, 32, 0.0),    # one run covers the axis
    (80, 16, 16, 0.0),    # the blocks divide the axis: no edge version
    (72, 32, 16, 2 / 6),  # 3 blocks of 2 runs over 72: the fifth crosses, the sixth lies past the end
    (31, 24, 3, 0.0),     # 3-wide runs are the scalar loop
])
def test_edge_share(n, block, thread, share):
    geo = TileGeometry(load_op({"name": "e", "op": "matmul", "M": 8, "N": n, "K": 4}))
    assert _edge_share(geo, (8, block, 4), (4, thread, 1)) == pytest.approx(share)


def _predict(hw_desc: hw.HardwareDesc, op: dict, block_tile: tuple[int, ...], thread_tile: tuple[int, ...]):
    geo = TileGeometry(load_op(op))
    block = math.prod(b // t for b, t in zip(block_tile, thread_tile))
    grid = geo.num_tiles(block_tile)
    tiles = (block_tile, thread_tile)
    res = resources(geo, hw_desc, tiles, 0, 1, block, {})
    return predict(geo, hw_desc, tiles, 0, 1, grid, block, res)


def test_threads_at_the_vector_axis_end_are_predicted_slower():
    """s_matmul_prime (97x31x13) on PoCL, blocks of 16x32: 4x32 thread tiles ran 2.0 us, 8x16 ones, whose
    second thread of each row crosses column 31, 3.6 us (2.4 us once the crossing run's start became a
    constant); the register-tile table alone gives them 115 and 109 GFLOP/s."""
    pocl = hw.load("pocl-cpu")
    op = {"name": "p", "op": "matmul", "M": 97, "N": 31, "K": 13}
    wide = _predict(pocl, op, (16, 32, 13), (4, 32, 1))
    split = _predict(pocl, op, (16, 32, 13), (8, 16, 1))
    assert split.time_s > 1.2 * wide.time_s
    # Without the gathered table there is nothing to charge the edge with.
    plain = dataclasses.replace(pocl, calibration=dataclasses.replace(pocl.calibration, gathered_tiles=()))
    assert _predict(plain, op, (16, 32, 13), (8, 16, 1)).time_s < 1.1 * _predict(
        plain, op, (16, 32, 13), (4, 32, 1)).time_s


def test_an_operator_that_fits_in_the_cache_reads_at_its_bandwidth():
    pocl = _without_join(hw.load("pocl-cpu"))
    small = {"name": "s", "op": "elementwise", "fn": "relu", "shapes": {"X": [64, 256]}}       # 128 KiB
    large = {"name": "l", "op": "elementwise", "fn": "relu", "shapes": {"X": [1024, 1024]}}    # 8 MiB
    for op, layer in ((small, 1), (large, 0)):
        geo = TileGeometry(load_op(op))
        pred = _predict(pocl, op, (8, 256), (1, 256))
        per_block = geo.tile_traffic((8, 256), pocl.memory[0].transaction_bytes)
        rounds = -(-geo.num_tiles((8, 256)) // 2)
        expected = rounds * per_block / (pocl.bandwidth(layer) / 2)
        assert dict(pred.layer_times_s)["global"] == pytest.approx(expected)
    # A description without a cache layer (every GPU one here) keeps its DRAM bandwidth.
    a100 = hw.load("a100")
    assert all(m.scope != "cache" for m in a100.memory)
