"""IPU graph plans written by ``roller build`` for both IPU descriptions over both suites: every output element is
written by exactly one vertex, every vertex's slices hold what its block reads, and no tile holds more than its
SRAM. The checks read graph_plan.json as written and recompute everything from it, from the op (IR) and from
the description, not from the numbers the plan states about itself."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from roller.cli.main import main
from roller.construction import construct
from roller.construction.enlarge import Search
from roller.construction.exchange import exchange_fed, on_device, unit_bytes
from roller.hw import list_bundled, load
from roller.ir import load_ops
from roller.perf.traffic import TileGeometry

ROOT = Path(__file__).resolve().parents[3]
SUITES = {"scaled": ROOT / "bench/suites/scaled.json", "roller119": ROOT / "bench/suites/roller119.json"}
IPUS = ("ipu-gc2", "ipu-gc200")
FILES = {"codelets.cpp", "host.cpp", "graph_plan.hpp", "graph_plan.json", "Makefile"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    out = {}
    for hw in IPUS:
        for suite, path in SUITES.items():
            d = tmp_path_factory.mktemp(f"{hw}-{suite}")
            rc = main(["build", "--hw", str(ROOT / "hwdesc" / f"{hw}.yaml"), str(path), "-o", str(d)])
            assert rc == 0
            out[hw, suite] = d
    return out


def rule_slices(doc: dict, blocks: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(begin, end) per tensor for the given block indices, from the plan's axes and slice rule."""
    ranges = {}
    for a in doc["axes"]:
        if a["reduce"]:
            lo = np.zeros_like(blocks)
            hi = lo + a["extent"] - 1
        else:
            lo = (blocks // a["divisor"]) % a["blocks"] * a["block"]
            hi = np.minimum(lo + a["block"], a["extent"]) - 1
        ranges[a["name"]] = (lo, hi)
    shapes = {t["name"]: t["shape"] for t in doc["tensors"]}
    out = {}
    for name, dims in doc["slice_rule"].items():
        begin, end = [], []
        for size, accs in zip(shapes[name], dims):
            los, his = [], []
            for acc in accs:
                lo = np.full_like(blocks, acc["const"])
                hi = lo.copy()
                for ax, c in acc["terms"].items():
                    a_lo, a_hi = ranges[ax]
                    lo = lo + c * (a_lo if c > 0 else a_hi)
                    hi = hi + c * (a_hi if c > 0 else a_lo)
                los.append(lo)
                his.append(hi)
            lo = np.maximum(np.min(los, axis=0), 0)
            hi = np.minimum(np.max(his, axis=0), size - 1)
            empty = hi < lo
            begin.append(np.where(empty, 0, lo))
            end.append(np.where(empty, 0, hi + 1))
        b, e = np.stack(begin, axis=1), np.stack(end, axis=1)
        void = (b == e).any(axis=1)
        b[void] = 0
        e[void] = 0
        out[name] = (b, e)
    return out


def check_reads(doc: dict, expr, b: int) -> None:  # type: ignore[no-untyped-def]
    """Every point of block b (over its whole reduction) reads inside its slices and writes inside its output
    slice, which it fills: brute force over the points, from the op's own accesses."""
    axes = {a["name"]: a for a in doc["axes"]}
    values = []
    for ax in expr.axes:
        a = axes[ax.name]
        if a["reduce"]:
            values.append(np.arange(a["extent"]))
        else:
            lo = (b // a["divisor"]) % a["blocks"] * a["block"]
            values.append(np.arange(lo, min(lo + a["block"], a["extent"])))
    n = math.prod(len(v) for v in values)
    if n > 1 << 21:  # a large block: a deterministic sample of its points
        rng = np.random.default_rng(b)
        env = {ax.name: rng.choice(v, 1 << 20) for ax, v in zip(expr.axes, values)}
    else:
        grids = np.meshgrid(*values, indexing="ij")
        env = {ax.name: g.ravel() for ax, g in zip(expr.axes, grids)}
    slices = rule_slices(doc, np.array([b]))
    for t in expr.tensors:
        begin, end = (x[0] for x in slices[t.name])
        for idx in expr.accesses(t.name):
            if not t.shape:
                assert begin.tolist() == [0] and end.tolist() == [1]
                continue
            npts = len(next(iter(env.values())))
            coords = [np.full(npts, i.const) + sum(c * env[a] for a, c in i.terms) for i in idx]
            inside = np.ones(npts, dtype=bool)
            for d, x in enumerate(coords):
                inside &= (x >= 0) & (x < t.shape[d])
            for d, x in enumerate(coords):
                x = x[inside]
                assert ((x >= begin[d]) & (x < end[d])).all(), (doc["op"], b, t.name, d)
            if t is expr.output:
                assert [int(x.min()) for x in coords] == begin.tolist()
                assert [int(x.max()) + 1 for x in coords] == end.tolist()


def check_plan(doc: dict, expr, hw) -> None:  # type: ignore[no-untyped-def]
    tiles = hw.parallelism.compute_units
    cap = hw.memory[1].capacity_per_block_bytes
    assert doc["tiles"] == tiles and doc["workers_per_vertex"] <= doc["workers"] == 6
    tensors = {t["name"]: t for t in doc["tensors"]}
    out = next(t for t in doc["tensors"] if t["role"] == "output")
    assert out["name"] == expr.output.name
    for t in expr.tensors:
        assert math.prod(tensors[t.name]["storage_shape"]) == math.prod(t.storage_shape)
    sizes = {n: math.prod(t["shape"]) for n, t in tensors.items()}
    inputs = [n for n, t in tensors.items() if t["role"] == "input"]
    for n in inputs:
        assert tensors[n]["chunk"] == -(-sizes[n] // tiles)
    resident = sum(tensors[n]["chunk"] * 4 for n in inputs)  # tile 0 holds a full chunk of every input
    # The op lives on the device when its tensors fit and, next to a tile's input chunks, a one-output block
    # (over its whole reduction) still fits in the tile; otherwise only a round's working set is counted.
    geo = TileGeometry(expr)
    unit = geo.full_reduce(tuple(1 for _ in geo.extents))
    unit_rounds = -(-math.prod(a.extent for a in expr.spatial_axes) // tiles)
    unit_inputs = sum(math.prod(geo.region(t, unit)) * 4 for t in geo.inputs)
    fits_device = (sum(math.prod(t.storage_shape) * 4 for t in expr.tensors) <= hw.memory[0].capacity_bytes
                   and resident + unit_rounds * 4 + unit_inputs <= cap)
    assert doc["memory"]["on_device"] == fits_device
    spatial = [a for a in doc["axes"] if not a["reduce"]]
    V = doc["vertices"]
    assert V == math.prod(a["blocks"] for a in spatial)
    assert doc["compute_sets"] == -(-V // tiles)
    # The block index is mixed radix over the spatial axes (last fastest), and each axis's blocks cut it.
    div = 1
    for a in reversed(spatial):
        assert a["divisor"] == div and a["blocks"] == -(-a["extent"] // a["block"])
        div *= a["blocks"]
    for a in doc["axes"]:
        if a["reduce"]:
            assert a["block"] == a["extent"]  # a vertex gets its whole reduction
    vol = lambda b, e: np.prod(e - b, axis=1) * 4
    if doc["tile_vertices"] is not None:
        listed = [(entry["tile"], v) for entry in doc["tile_vertices"] for v in entry["vertices"]]
        blocks = np.array([v["block"] for _, v in listed])
        assert sorted(blocks.tolist()) == list(range(V))
        assert all(t == v["block"] % tiles and v["round"] == v["block"] // tiles for t, v in listed)
        rule = rule_slices(doc, blocks)
        for name in tensors:
            b = np.array([v["slices"][name]["begin"] for _, v in listed]).reshape(len(listed), -1)
            e = np.array([v["slices"][name]["end"] for _, v in listed]).reshape(len(listed), -1)
            assert (b == rule[name][0]).all() and (e == rule[name][1]).all(), name
        # Exactly once: count the writes of every output element.
        count = np.zeros(out["shape"] or [1], dtype=np.int32)
        for _, v in listed:
            s = v["slices"][out["name"]]
            count[tuple(slice(lo, hi) for lo, hi in zip(s["begin"], s["end"]))] += 1
        assert (count == 1).all(), doc["op"]
        # Memory per tile: input chunks + output slices of all rounds + the largest round's copied-in slices.
        tile_of = blocks % tiles
        outs = np.bincount(tile_of, weights=vol(*rule[out["name"]]), minlength=tiles)
        ins = sum(vol(*rule[n]) for n in inputs)
        peak_in = np.zeros(tiles)
        np.maximum.at(peak_in, tile_of, ins)
        if fits_device:
            res = np.zeros(tiles)
            for n in inputs:
                c = tensors[n]["chunk"]
                res += np.clip(sizes[n] - np.arange(tiles) * c, 0, c) * 4
            worst = (res + outs + peak_in).max()
        else:
            worst = (vol(*rule[out["name"]]) + ins).max()
        assert worst <= cap, (doc["op"], worst, cap)
        assert doc["memory"]["exact"] and doc["memory"]["tile_bytes_max"] == worst
    else:
        # Not listed: the output rule is the block's own points on every axis (so the mixed-radix grid above
        # covers each element once), and memory is bounded by the largest slice of every tensor.
        for d, accs in enumerate(doc["slice_rule"][out["name"]]):
            assert len(accs) == 1 and accs[0]["const"] == 0 and list(accs[0]["terms"].values()) == [1]
        assert sorted(next(iter(accs[0]["terms"])) for accs in doc["slice_rule"][out["name"]]) == \
            sorted(a["name"] for a in spatial)
        # A full block's unclipped extent per dimension bounds every block's slice.
        reach = {a["name"]: a["block"] - 1 for a in spatial}
        reach.update({a["name"]: a["extent"] - 1 for a in doc["axes"] if a["reduce"]})
        largest = {}
        for name in tensors:
            ext = []
            for size, accs in zip(tensors[name]["shape"], doc["slice_rule"][name]):
                lo = min(acc["const"] + sum(min(0, c * reach[ax]) for ax, c in acc["terms"].items()) for acc in accs)
                hi = max(acc["const"] + sum(max(0, c * reach[ax]) for ax, c in acc["terms"].items()) for acc in accs)
                ext.append(min(hi - lo + 1, size))
            largest[name] = math.prod(ext) * 4
        ins = sum(largest[n] for n in inputs)
        rounds = doc["compute_sets"]
        worst = resident + rounds * largest[out["name"]] + ins if fits_device else largest[out["name"]] + ins
        assert worst <= cap, (doc["op"], worst, cap)
        assert not doc["memory"]["exact"] and doc["memory"]["tile_bytes_max"] <= worst
    for b in sorted({0, V // 2, V - 1}):
        check_reads(doc, expr, b)


@pytest.mark.slow
@pytest.mark.parametrize("suite", SUITES)
@pytest.mark.parametrize("hw_name", IPUS)
def test_build_writes_plans_that_fit_and_cover(built, hw_name: str, suite: str) -> None:
    hw = load(hw_name)
    folder = built[hw_name, suite]
    ops = load_ops(SUITES[suite])
    listed = 0
    for op in ops:
        d = folder / op.name
        assert FILES <= {p.name for p in d.iterdir()}, op.name
        doc = json.loads((d / "graph_plan.json").read_text())
        report = json.loads((d / "report.json").read_text())
        expr = construct(op, hw, top_k=report["top_k"])[0].expr
        assert doc["rprogram"] == report["line"]
        check_plan(doc, expr, hw)
        listed += doc["tile_vertices"] is not None
    assert listed >= (len(ops) if suite == "scaled" else 1)


def test_construction_on_exchange_fed_descriptions() -> None:
    """The IPUs are exchange-fed (their remote layer is the tiles' SRAM), no other bundled description is; on
    them every block tile spans its reduction and a tile's memory holds what construction counted."""
    fed = [n for n in list_bundled() if exchange_fed(load(n), 0)]
    assert sorted(fed) == sorted(IPUS)
    for name in IPUS:
        hw = load(name)
        for op in load_ops(SUITES["scaled"])[::3] + load_ops(SUITES["roller119"])[::7]:
            for p in construct(op, hw, top_k=4):
                geo = TileGeometry(p.expr)
                block = p.block_tile.shape
                assert all(b == a.extent for a, b in zip(p.expr.axes, block) if a.reduce), p.line()
                assert p.block <= 6 and not p.block_tile.storage_padding
                resident = Search(geo, hw, 0, 1, 4, want=1).resident
                assert (resident is None) == (not on_device(geo, hw, 0))
                assert unit_bytes(geo, hw, block, resident) <= hw.memory[1].capacity_per_block_bytes


def test_convolutions_stay_direct_on_ipus() -> None:
    op = next(o for o in load_ops(SUITES["scaled"]) if o.name == "s_conv3x3_same")
    ipu = construct(op, load("ipu-gc200"), top_k=1)[0].expr
    gpu = construct(op, load("v100"), top_k=1)[0].expr
    assert [a.name for a in ipu.axes] == ["n", "f", "h", "w", "c", "r", "s"]
    assert all(t.view is None for t in ipu.tensors)
    assert any(t.view is not None and not t.view.is_reshape() for t in gpu.tensors)  # im2col elsewhere
