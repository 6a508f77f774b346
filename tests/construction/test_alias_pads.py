"""Rows a register tile reads together, a multiple of the L1's set span apart, are padded by one line
(``roller.construction.alias_pads``, the cache layer's ``alias_bytes``): a matmul's A over K = 3072 float32
(rows 12 KiB apart) ran at half the speed of K = 3056 on PoCL with the same program, every row of the tile in
one set of an 8-way L1. The description field, the probe that writes it, the padded form and its results."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import roller
from roller.backends import get
from roller.backends.opencl.probe import l1_set_span
from roller.cli.main import main
from roller.compiler.check import check_against
from roller.construction import alias_pads, prepared
from roller.hw import load
from roller.ir import load_op
from roller.ir.reference import random_inputs
from tests.support.candidates import opencl_candidates

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
CPU = load("pocl-cpu")
POCL_YAML = Path(roller.__file__).parent / "hwdesc" / "pocl-cpu.yaml"


def matmul(k: int, m: int = 20, n: int = 32, **more: object) -> dict:
    return {"name": f"mm{k}", "op": "matmul", "M": m, "N": n, "K": k, **more}


def pads_of(op: dict, hw: object = CPU) -> dict:
    prep = prepared(load_op(op), hw).preparation
    return dict(prep.pads) if prep is not None else {}


def test_the_bundled_cpu_description_has_its_l1_set_span() -> None:
    cache = CPU.memory[1]
    assert cache.scope == "cache" and cache.alias_bytes == 4096


@pytest.mark.parametrize(("k", "padded"), [(3072, True), (1024, True), (4096, True), (3056, False), (768, False),
                                           (1000, False)])
def test_a_matmuls_rows_are_padded_where_they_alias(k: int, padded: bool) -> None:
    pads = pads_of(matmul(k))
    assert pads == ({"A": ((0, 0), (0, 16))} if padded else {})   # one 64-byte line of float32; B never


def test_what_is_padded_and_what_is_not() -> None:
    # a batched matmul's A[b, m, k]; a transposed B[n, k] (a Linear's weight) walks k along its rows too
    assert pads_of({"name": "bmm", "op": "batch_matmul", "B": 2, "M": 8, "N": 16, "K": 1024}) == \
        {"A": ((0, 0), (0, 0), (0, 16))}
    assert pads_of(matmul(1024, transpose_b=True)) == {"A": ((0, 0), (0, 16)), "B": ((0, 0), (0, 16))}
    # float16 rows: a line is 32 elements
    assert pads_of(matmul(2048, dtype="float16")) == {"A": ((0, 0), (0, 32))}
    # GPU descriptions stage tiles in shared memory (no such field); a CPU description without it pads nothing
    assert pads_of(matmul(1024), load("h100")) == {}
    plain = dataclasses.replace(CPU, memory=(CPU.memory[0], dataclasses.replace(CPU.memory[1], alias_bytes=None),
                                             *CPU.memory[2:]))
    assert pads_of(matmul(1024), plain) == {}
    # a kernel that serves many sizes is prepared without it (its padding would move with the size)
    assert prepared(load_op(matmul(1024)), CPU, align=False).preparation is None
    assert alias_pads(load_op({"name": "e", "expr": "Y[i,j] = X[i,j] * 2", "shapes": {"X": [4, 1024]}}),
                      CPU.memory[1]) == {}   # an elementwise op reads each row once
    assert pads_of(matmul(2048, m=1, n=1000, transpose_b=True)) == {"B": ((0, 0), (0, 16))}   # A is one row


@needs_device
@pytest.mark.parametrize("k", [1024, 2048])
def test_every_candidate_of_a_padded_matmul_is_right(k: int) -> None:
    op = matmul(k, m=33, n=40)
    x = random_inputs(load_op(op))
    for prog, _, out in opencl_candidates(op, "pocl-cpu", x, top_k=4):
        assert dict(prog.expr.preparation.pads) == {"A": ((0, 0), (0, 16))}
        check_against(f"{op['name']} ({prog.line()})", load_op(op), x, out)


@needs_device
def test_a_model_holds_the_hidden_activation_padded_without_a_copy() -> None:
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(0)
    m, d, h = 24, 64, 1024
    inits = [numpy_helper.from_array((rng.standard_normal((d, h)) * 0.1).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((h, d)) * 0.1).astype(np.float32), "w2")]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                               helper.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = roller.compile_model(model, hw="pocl-cpu")
    summary = compiled.summary()
    # the first kernel writes the hidden activation into rows of h + 16 floats, which the second reads as they are
    assert summary["copies"] == 0 and summary["bytes_by_role"]["padded"] == m * (h + 16) * 4
    x = rng.standard_normal((m, d)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


def _cache_dir(root: Path, index: int, level: str, kind: str, size: str, ways: str) -> None:
    d = root / f"index{index}"
    d.mkdir(parents=True)
    for name, value in (("level", level), ("type", kind), ("size", size), ("ways_of_associativity", ways)):
        (d / name).write_text(value + "\n")


@pytest.mark.parametrize(("entries", "span"), [
    ([(1, "Data", "32K", "8"), (1, "Instruction", "32K", "8"), (2, "Unified", "1024K", "8")], 4096),
    ([(1, "Instruction", "64K", "4"), (1, "Data", "48K", "12")], 4096),   # Intel's L1d: 48 KiB, 12 ways
    ([(1, "Data", "64K", "4")], 16384),                                    # a 4-way 64 KiB L1
    ([(1, "Data", "48K", "8")], None),                                     # 6 KiB: no power of two
    ([(2, "Unified", "1024K", "8")], None),                                # no level-1 data cache listed
    ([(1, "Data", "lots", "8")], None),
    ([(1, "Data", "", "8")], None),
    ([], None),
])
def test_the_probe_reads_the_l1_set_span_from_sysfs(tmp_path: Path, entries: list, span: int | None) -> None:
    for i, (level, kind, size, ways) in enumerate(entries):
        _cache_dir(tmp_path, i, str(level), kind, size, ways)
    assert l1_set_span(str(tmp_path)) == span


@pytest.mark.parametrize(("edit", "message"), [
    ("alias_bytes: 3000", "memory[1].alias_bytes: expected a power of two, got 3000"),
    ("alias_bytes: 32", "memory[1].alias_bytes: expected at least line_bytes (64), got 32"),
])
def test_a_malformed_alias_field_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, edit: str,
                                             message: str) -> None:
    path = tmp_path / "cpu.yaml"
    path.write_text(POCL_YAML.read_text().replace("alias_bytes: 4096", edit))
    assert main(["hw", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_alias_field_belongs_to_cache_layers(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    text = POCL_YAML.read_text()
    line = next(x for x in text.splitlines() if "alias_bytes:" in x)
    moved = text.replace(line + "\n", "").replace("    capacity_per_thread_bytes: 2KiB",
                                                  "    alias_bytes: 4096\n    capacity_per_thread_bytes: 2KiB")
    path = tmp_path / "cpu.yaml"
    path.write_text(moved)
    assert main(["hw", "validate", str(path)]) == 2
    assert "memory[2].alias_bytes: not used by 'thread' layers; remove it" in capsys.readouterr().err
