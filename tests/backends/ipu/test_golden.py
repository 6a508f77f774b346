"""Golden and structural tests of the generated Poplar sources (the host program cannot be compiled here: the
Poplar SDK is not installable). Two small ops with fixed tiles are compared file by file with
tests/backends/ipu/golden/ (ROLLER_UPDATE_GOLDEN=1 rewrites them; see its README); for every op of the scaled suite the
host program must create every tensor, connect every vector field and set every scalar field the codelet
declares, and nothing else."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from roller.backends import get
from roller.construction import construct
from roller.hw import load
from roller.ir import load_op, load_ops
from roller.ir.fuse import prepare
from roller.program import RProgram, RTile, launch_counts

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).resolve().parent / "golden"
BACKEND = get("poplar")
FIXED = {
    "mm": ({"name": "mm", "op": "matmul", "M": 5, "N": 7, "K": 3}, (2, 4, 3), (1, 2, 1)),
    "pool": ({"name": "pool", "op": "avgpool2d", "N": 1, "C": 2, "H": 5, "W": 5, "K": 3, "stride": 2,
              "padding": "SAME"}, (2, 2, 3, 3, 3), (1, 1, 3, 1, 1)),
}


def fixed_program(name: str) -> RProgram:
    op, block, thread = FIXED[name]
    hw = load("ipu-gc2")
    expr = prepare(load_op(op), gemm_conv=False)
    tiles = (RTile(block), RTile(thread))
    grid, threads = launch_counts(expr, tiles[0], tiles[1])
    return RProgram(expr=expr, hw_name=hw.name, hw_hash=hw.content_hash()[:16],
                    layers=tuple(m.name for m in hw.memory), scopes=tuple(m.scope for m in hw.memory),
                    tiles=tiles, grid=grid, block=threads, block_level=0, thread_level=1)


@pytest.mark.parametrize("name", FIXED)
def test_golden_files(name: str) -> None:
    art = BACKEND.render(fixed_program(name), load("ipu-gc2"))
    folder = GOLDEN / name
    if os.environ.get("ROLLER_UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for f, text in art.files.items():
            (folder / f).write_text(text, encoding="utf-8")
    assert sorted(p.name for p in folder.iterdir()) == sorted(art.files)
    for f, text in art.files.items():
        want = (folder / f).read_text(encoding="utf-8")
        assert text == want, f"{name}/{f} differs from the golden file (regenerate: see {GOLDEN / 'README.md'})"


def _fields(codelet: str) -> tuple[list[str], list[str], list[str]]:
    inputs = re.findall(r"poplar::Input<poplar::Vector<float>> (\w+);", codelet)
    outputs = re.findall(r"poplar::Output<poplar::Vector<float>> (\w+);", codelet)
    scalars = re.findall(r"^  unsigned (\w+);", codelet, re.MULTILINE)
    return inputs, outputs, scalars


@pytest.mark.parametrize("hw_name", ["ipu-gc2", "ipu-gc200"])
def test_host_program_matches_codelet(hw_name: str) -> None:
    hw = load(hw_name)
    for op in load_ops(ROOT / "bench/suites/scaled.json"):
        prog = construct(op, hw, top_k=1)[0]
        files = BACKEND.render(prog, hw).files
        host, codelet, make = files["host.cpp"], files["codelets.cpp"], files["Makefile"]
        inputs, outputs, scalars = _fields(codelet)
        expr = prog.expr
        assert inputs == [t.name for t in expr.inputs] and outputs == [expr.output.name], op.name
        cls = re.search(r"class (\w+) : public poplar::MultiVertex", codelet).group(1)
        assert re.findall(r'graph\.addVertex\(rounds\[vp\.round\], "(\w+)"\)', host) == [cls]
        assert re.findall(r'graph\.connect\(v\["(\w+)"\]', host) == inputs + outputs
        assert re.findall(r'graph\.setInitialValue\(v\["(\w+)"\]', host) == scalars
        assert re.findall(r'graph\.addVariable\(FLOAT, dims\(plan::kStorage_(\w+)\), "(\w+)"\)', host) == \
            [(t.name, t.name) for t in expr.tensors]
        assert re.findall(r'addHostToDeviceFIFO\("(\w+)"', host) == inputs
        assert re.findall(r'addDeviceToHostFIFO\("(\w+)"', host) == outputs
        assert re.findall(r'connectStream\("(\w+)"', host) == inputs + outputs
        assert f'IPUModel model("{hw.target}")' in host and '#include "graph_plan.hpp"' in host
        assert "$(POPC) $(POPCFLAGS) codelets.cpp -o codelets.gp" in make
        assert "host.cpp -o host -lpoplar -lpoputil" in make
