"""Kernels that take their symbol's value as an argument (roller.construction.symbol_args): attention's scores,
softmax and context over a symbolic sequence length, built once and run at every length on PoCL; the CUDA and
HIP kernels compile within their descriptions; what refuses runtime extents, and why."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import roller
from roller.backends import get
from roller.compiler.check import check_against
from roller.construction import construct
from roller.construction.generic import MAX_KERNELS, RUNTIME_WASTE_CAP, construct_generic
from roller.construction.symbol_args import covered, runtime_axes
from roller.hw import load
from roller.ir.opfile import load_op
from roller.ir.symbolic import parse_symbolic
from roller.program import RProgram

SCORES = {"name": "scores", "expr": "Y[h,q,k] += Q[q,h,d] * K[h,d,k]",
          "shapes": {"Q": ["s", 4, 16], "K": [4, 16, "s"]}, "symbols": {"s": [1, 512]}}
CONTEXT = {"name": "context", "expr": "Y[q,h,d] += P[h,q,k] * V[k,h,d]",
           "shapes": {"P": [4, "s", "s"], "V": ["s", 4, 16]}, "symbols": {"s": [1, 512]}}
SOFTMAX = {"name": "softmax", "expr": "M[r] max= X[r,c]; S[r] += exp(X[r,c] - M[r]); Y[r,c] = exp(X[r,c] - M[r]) / S[r]",
           "shapes": {"X": [64, "c"]}, "symbols": {"c": [1, 600]}}
KEY_TRANSPOSE = {"name": "kt", "expr": "Y[h,d,k] = K[k,h,d]", "shapes": {"K": ["s", 4, 16]},
                 "symbols": {"s": [1, 512]}}


def _check(k: object, values: dict[str, int], seed: int = 0) -> None:
    expr = k.op.instantiate(values)  # type: ignore[attr-defined]
    rng = np.random.default_rng(seed)
    x = {t.name: rng.standard_normal(t.storage_shape).astype(np.float32) for t in expr.inputs}
    got = k(**x)  # type: ignore[operator]
    assert got.shape == tuple(expr.output.storage_shape)
    check_against(f"{expr.name} at {values}", expr, x, got)


@pytest.mark.parametrize("doc,sizes", [(SCORES, (1, 7, 64, 300, 512)), (CONTEXT, (1, 17, 128, 384)),
                                       (SOFTMAX, (1, 5, 129, 600)), (KEY_TRANSPOSE, (1, 33, 512))])
def test_one_build_serves_every_length(doc: dict, sizes: tuple[int, ...]) -> None:
    k = roller.compile(doc, hw="pocl-cpu")
    assert k.mode == "generic", k.why
    assert k.kernels.scalar_args and all(p.runtime for p in k.kernels.programs)
    built = k.compiled
    assert 1 <= built <= MAX_KERNELS
    for v in sizes:
        _check(k, {k.kernels.axis.symbol: v}, seed=v)
    assert k.compiled == built   # no length compiled anything


def test_points_past_the_length_read_only_padding() -> None:
    """A kernel with runtime extents at n < G reads the layout's padding only for points it throws away:
    NaN there leaves every result inside n finite and right (staged GPU plan and unstaged CPU plan alike)."""
    G = 96
    op = load_op({"name": "mm", "expr": "Y[m,n] += A[m,k] * B[k,n]", "shapes": {"A": [G, G], "B": [G, 40]}})
    be = get("opencl")
    rng = np.random.default_rng(1)
    for hw_name in ("pocl-cpu", "h100"):
        hw = load(hw_name)
        for prog in construct(op, hw, top_k=2):
            prog = dataclasses.replace(prog, runtime=(("m", 1), ("k", 1)))
            runner = be.compile(be.render(prog, hw), hw)
            for n in (1, 17, 50):
                a = np.full((G, G), np.nan, np.float32)
                b = np.full((G, 40), np.nan, np.float32)
                a[:n, :n] = rng.standard_normal((n, n))
                b[:n] = rng.standard_normal((n, 40))
                blocks = -(-n // prog.block_tile.shape[0]) * -(-40 // prog.block_tile.shape[1])
                got = runner.with_launch(blocks, [a.shape, b.shape, (G, 40)], [n])([a, b])
                assert np.allclose(got[:n], a[:n, :n] @ b[:n], atol=1e-4), (hw_name, prog.line(), n)


def test_sizes_are_served_within_the_waste_cap_along_each_axis() -> None:
    hw = load("pocl-cpu")
    ks = construct_generic(parse_symbolic(SCORES, None), hw)
    assert not isinstance(ks, str) and ks.scalar_args
    for v in (*ks.samples, 3, 100, 511):
        prog = ks.programs[ks.choose(v)]
        assert all(extent <= v * RUNTIME_WASTE_CAP for extent in covered(prog, ks.axis, v).values())
        assert ks.rows(ks.choose(v), v) >= v


@pytest.mark.parametrize("doc,reason", [
    # (h, q) fuse into one axis of 4s: its points at a smaller size are not a prefix of the layout at the greatest
    ({"expr": "Y[h,q] += X[h,q,k]", "shapes": {"X": [4, "s", "s"]}, "symbols": {"s": [1, 64]}}, "by a factor"),
    # a window along the symbol reads a padded copy whose padding would move with the size
    ({"op": "conv2d", "N": 1, "C": 4, "H": "h", "W": 8, "F": 4, "KH": 3, "KW": 3, "padding": "SAME",
      "symbols": {"h": [3, 32]}}, "padded"),
])
def test_what_refuses_runtime_extents_says_why_and_builds_per_size(doc: dict, reason: str) -> None:
    op = parse_symbolic(doc, None)
    found = runtime_axes(op, load("pocl-cpu"))
    assert isinstance(found, str) and reason in found
    k = roller.compile(doc, hw="pocl-cpu")
    assert k.mode == "per-size" and reason in k.why
    sym = op.symbols[0]
    _check(k, {sym: 3})


def test_program_round_trips_its_runtime_axes() -> None:
    ks = construct_generic(parse_symbolic(CONTEXT, None), load("pocl-cpu"))
    assert not isinstance(ks, str)
    prog = ks.programs[0]
    back = RProgram.loads(prog.dumps(), prog.expr.source)
    assert back.runtime == prog.runtime == (("q", 1), ("k", 1)) and back == prog
    with pytest.raises(ValueError, match="runtime axes"):
        RProgram.from_json({**prog.to_json(), "runtime_axes": [{"axis": "nope", "factor": 1}]}, prog.expr.source)


@pytest.mark.parametrize("hw_name", [pytest.param("h100", marks=pytest.mark.nvcc),
                                     pytest.param("mi100", marks=pytest.mark.hipcc)])
def test_gpu_kernels_with_runtime_extents_compile_within_the_description(hw_name: str, tmp_path: Path) -> None:
    from roller.errors import ToolchainError

    hw = load(hw_name)
    be = get(hw.backend)
    smem = next(m for m in hw.memory if m.scope == "block").capacity_per_block_bytes
    for doc in (SCORES, CONTEXT):
        k = roller.compile(doc, hw=hw_name)
        assert k.mode == "generic" and k.kernels.scalar_args, k.why
        for i, art in enumerate(k.artifacts):
            assert "const int rl_n)" in art.source and art.launch["scalars"][0]["value"] == 512
            try:
                info = be.check_compiles(art, hw, tmp_path / f"{doc['name']}{i}")
            except ToolchainError as err:
                pytest.skip(str(err))
            regs = info.get("registers", info.get("vgprs"))
            assert regs is not None and regs <= hw.parallelism.max_registers_per_thread, (art.kernel_name, info)
            assert info.get("smem_bytes", info.get("lds_bytes", 0)) <= smem


def test_build_writes_the_grid_rule_and_the_layout(tmp_path: Path) -> None:
    op = tmp_path / "scores.json"
    op.write_text(json.dumps(SCORES))
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "roller", "build", "--hw", "pocl-cpu", str(op), "-o", str(out)],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    doc = json.loads((out / "scores" / "dispatch.json").read_text())
    assert doc["growing"] == {"Q": {"dims": [0]}, "K": {"dims": [2]}, "Y": {"dims": [1, 2]}}
    assert doc["greatest"] == 512 and "int argument" in doc["launch"]
    for kernel in doc["kernels"]:
        assert {a["name"]: a["runtime"] for a in kernel["axes"]} == {"h": False, "q": True, "k": True}
        launch = json.loads((out / "scores" / kernel["folder"] / "launch.json").read_text())
        assert launch["scalars"] == [{"name": "rl_n", "type": "int", "value": 512}]
