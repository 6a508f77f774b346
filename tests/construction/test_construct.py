"""Construction over the paper's 119 ops on every bundled description: limits, alignment, coverage,
determinism; and hand-checked cases that pin the behaviour."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

import roller.hw as H
from roller.construction import construct
from roller.construction.align import padding_ok, transaction_alignment
from roller.ir import load_ops
from roller.perf.traffic import TileGeometry

ROOT = Path(__file__).resolve().parents[2]
SUITE = load_ops(ROOT / "bench/suites/roller119.json")
DEVICES = H.list_bundled()


def _check_program(p, hw) -> None:
    expr = p.expr
    geo = TileGeometry(expr)
    par = hw.parallelism
    block, thread = p.block_tile.shape, p.thread_tile.shape
    smem = hw.memory[p.block_level + 1]
    # Limits of the description.
    assert 1 <= p.block <= par.max_threads_per_block
    if smem.scope == "block":
        assert geo.footprint(block, dict(p.block_tile.storage_padding)) <= smem.capacity_per_block_bytes
    regs = p.prediction.registers_per_thread
    assert regs <= par.max_registers_per_thread
    assert regs * p.block <= par.registers_per_unit
    assert p.prediction.blocks_per_unit >= 1
    # Coverage: the blocks tile every spatial axis exactly once (the last may pad), the thread tiles
    # partition the block tile, and the launch counts agree with the tiles.
    grid = threads = 1
    for a, b, t in zip(expr.axes, block, thread):
        if a.reduce:
            # A matrix program's register-level tile is one warp's fragment tile: its reduction step is the
            # instruction's k (a multiple of it), not 1.
            assert (b % t == 0) if p.use_matrix else (t == 1 and 1 <= b)
            continue
        assert b % t == 0, (a.name, b, t)
        n = -(-a.extent // b)
        assert (n - 1) * b < a.extent <= n * b
        grid *= n
        threads *= b // t
    if p.use_matrix:
        threads *= par.warp_size  # one warp (wavefront) per fragment tile
    if p.vector > 1:
        # a grid-stride program launches what the device holds resident at once, at most one block a tile
        assert threads == p.block and 1 <= p.grid <= min(grid, par.compute_units * p.prediction.blocks_per_unit)
        assert thread[0] % p.vector == 0
    else:
        assert (grid, threads) == (p.grid, p.block)
    # Rule (b): transaction-aligned innermost extents unless the tile covers the dimension.
    align = transaction_alignment(expr, hw.memory[p.block_level])
    for a, b in zip(expr.axes, block):
        k = align.get(a.name, 1)
        assert b % k == 0 or b >= a.extent or k > a.extent, (a.name, b, k)
    # Rule (c): padded rows are coprime with the banks (in bank words).
    for name, pad in p.block_tile.storage_padding:
        reg = geo.region(next(t for t in geo.inputs if t.name == name), block)
        row_bytes = (reg[-1] + pad) * expr.tensor(name).itemsize
        if p.use_matrix or p.shared_vector > 1:
            # Fragment loads and vector reads take 16-byte pieces: rows are an odd number of them
            # (construction/matrix.py, construction/shared_vector.py).
            assert row_bytes % 16 == 0 and (row_bytes // 16) % 2 == 1
            continue
        assert math.gcd(row_bytes // smem.bank_width_bytes, smem.banks) == 1
    # Rule (d): per-axis padding within the program's epsilon.
    for a, b in zip(expr.axes, block):
        if a.reduce or b == a.extent:
            continue
        assert padding_ok(b, a.extent, max(p.epsilon, 1.0)), (a.name, b, a.extent)


@pytest.mark.parametrize("device", DEVICES)
def test_suite_programs_respect_limits_and_cover(device: str) -> None:
    hw = H.load(device)
    for op in SUITE:
        progs = construct(op, hw, top_k=10)
        assert progs, op.name
        times = [p.prediction.time_s for p in progs]
        assert times == sorted(times)
        for p in progs:
            _check_program(p, hw)


def test_construction_is_deterministic() -> None:
    for device in ("v100", "mi50"):
        for op in SUITE[::7]:
            a = [p.line() for p in construct(op, device)]
            b = [p.line() for p in construct(op, device)]
            assert a == b


def test_v100_matmul_4096() -> None:
    progs = construct({"op": "matmul", "M": 4096, "N": 4096, "K": 4096}, "v100")
    top = progs[0]
    assert top.block % 128 == 0  # 32-wide warps x 4 schedulers
    m, n, k = top.block_tile.shape
    assert n % 8 == 0 and k % 8 == 0  # 32-byte transactions of float32 on the innermost dims of B, C and A
    assert TileGeometry(top.expr).footprint(top.block_tile.shape) <= 48 * 1024
    assert top.prediction.bottleneck == "compute"


def test_mi50_uses_wavefront_multiples() -> None:
    top = construct({"op": "conv2d", "N": 128, "C": 64, "H": 56, "W": 56, "F": 64, "KH": 3, "KW": 3}, "mi50")[0]
    assert top.block % 64 == 0
    assert str(top).startswith("global>lds") or ">" in str(top)


def test_classifier_layer_triggers_shrinking() -> None:
    """128x1000x2048 on a V100: the reuse-optimal tiles give fewer blocks than its 80 SMs, so shrunk variants
    with at least 80 blocks are constructed and ranked among the candidates."""
    op = {"op": "matmul", "M": 128, "N": 1000, "K": 2048}
    plain = construct(op, "v100", top_k=40, shrink=False)
    shrunk = construct(op, "v100", top_k=40, shrink=True)
    assert min(p.grid for p in plain) < 80
    assert max(p.grid for p in shrunk) >= 80
    assert {p.key() for p in shrunk} - {p.key() for p in plain}


def test_shrinking_halves_thread_tiles_too() -> None:
    """The paper's shrink halves every level: besides the block-only variant (fewer threads per block), a
    variant keeps the threads per block and halves the thread tile. On an H200 the model then ranks a
    grid that fills the 132 units first for 128x1000x4032 (the unshrunk top-1 ran 8 blocks, 0.81 ms)."""
    op = {"op": "matmul", "M": 128, "N": 1000, "K": 4032}
    top = construct(op, "h200", top_k=10)
    assert top[0].grid >= 132 and top[0].block >= 128
    plain = construct(op, "h200", top_k=10, shrink=False)
    assert plain[0].grid < 132 and plain[0].prediction.time_s > top[0].prediction.time_s


def test_fictional_accelerator_from_yaml(tmp_path: Path) -> None:
    """A new accelerator is one YAML file: four layers, a 48-wide 'warp', no code change."""
    text = """
name: fictional
vendor: nobody
backend: opencl
target: fict1
memory:
  - {name: hbm, scope: device, capacity_bytes: 8GiB, bandwidth_gbps: {peak: 500, effective: 400},
     transaction_bytes: 64, line_bytes: 128}
  - {name: l2, scope: cache, capacity_bytes: 4MiB, bandwidth_gbps: {peak: 2000, effective: 1500},
     transaction_bytes: 32, line_bytes: 128}
  - {name: scratch, scope: block, capacity_per_unit_bytes: 64KiB, capacity_per_block_bytes: 32KiB,
     bandwidth_gbps: {peak: 6000, effective: 5000}, transaction_bytes: 4, line_bytes: 128, banks: 16,
     bank_width_bytes: 8}
  - {name: regs, scope: thread, capacity_per_unit_bytes: 128KiB, capacity_per_thread_bytes: 512,
     bandwidth_gbps: {peak: 60000, effective: 50000}, transaction_bytes: 4, line_bytes: 4}
parallelism: {compute_units: 24, sub_partitions: 2, warp_size: 48, max_threads_per_block: 768,
  max_threads_per_unit: 1536, max_blocks_per_unit: 8, registers_per_unit: 32768, max_registers_per_thread: 128,
  register_tile_budget: 48}
compute:
  float32: {vector: {peak_tflops: 5.0, effective_tflops: 4.0}}
"""
    path = tmp_path / "fictional.yaml"
    path.write_text(text)
    hw = H.load(str(path))
    for op in SUITE[::10]:
        progs = construct(op, hw)
        assert progs
        for p in progs:
            assert len(p.tiles) == 3 and p.layers == ("hbm", "l2", "scratch", "regs")
            _check_program(p, hw)


@pytest.mark.parametrize("spec", [
    {"op": "depthwise_conv2d", "N": 1, "C": 384, "H": 14, "W": 14, "KH": 3, "KW": 3, "padding": "SAME"},
    {"op": "depthwise_conv2d", "N": 1, "C": 960, "H": 7, "W": 7, "KH": 3, "KW": 3, "padding": "SAME"},
    {"op": "matmul", "M": 100, "N": 60, "K": 70},
])
def test_cpu_top1_is_the_first_of_the_top10(spec: dict) -> None:
    """On a CPU description the model's first choice does not depend on how many programs were asked for: the
    search gathers as many candidates for the top-1 as for the top-10 (before, the top-1 of a 14x14 depthwise
    convolution kept 2x2 register tiles, predicted 4.5x slower than the top-10's first)."""
    op = load_ops({"name": "x", **spec})[0]
    one, ten = construct(op, "pocl-cpu", top_k=1)[0], construct(op, "pocl-cpu", top_k=10)[0]
    assert one.key() == ten.key()
    last = [i for i, a in enumerate(one.expr.axes) if not a.reduce][-1]
    if spec["op"] == "depthwise_conv2d":
        assert one.thread_tile.shape[last] >= 4   # a vector run, not the exact-fit 1x1 or 2x2 tile
