"""Build folders read back (roller.compiler.artifact): a kernel, a kernel set and a model each ``save`` and
``load`` to the same thing, ``roller run DIR`` runs what ``roller build`` wrote without its op or model file,
and a model build constructs each operator once."""
from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

import roller
from roller.backends import get
from roller.cli.main import main
from roller.compiler.kernel import Kernel
from roller.compiler.kernel_set import GenericKernel
from roller.compiler.model import Model
from roller.errors import InputError
from tests.support.zoo_graphs import ALL

ROOT = Path(__file__).resolve().parents[2]
CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())
CONV = {"name": "conv", "op": "conv2d", "N": 1, "C": 8, "H": 12, "W": 12, "F": 16, "KH": 3, "KW": 3}
SYMBOLIC = {"name": "mm", "op": "matmul", "M": "m", "N": 48, "K": 32, "symbols": {"m": [1, 200]}}


def _zoo_file(tmp_path: Path, name: str) -> tuple[Path, dict[str, np.ndarray]]:
    proto, inputs = ALL[name]()
    path = tmp_path / f"{name}.onnx"
    onnx.save(proto, str(path))
    return path, inputs


@needs_device
def test_a_kernel_round_trips(tmp_path: Path) -> None:
    k = roller.compile(CONV, hw="pocl-cpu")
    assert isinstance(k, Kernel)
    report = k.save(tmp_path / "conv")
    back = roller.load(tmp_path / "conv")
    assert isinstance(back, Kernel) and report["files"][-1] == "report.json"
    assert back.source == k.source and back.launch == k.launch and back.program.line() == k.program.line()
    assert back.op.content_hash() == k.op.content_hash() and back.hw.content_hash() == k.hw.content_hash()
    x = np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((16, 8, 3, 3)).astype(np.float32)
    np.testing.assert_array_equal(back(x, w), k(x, w))


def test_a_kernel_for_another_machine_round_trips_without_a_device(tmp_path: Path) -> None:
    k = roller.compile(dict(CONV, dtype="float16"), hw="h100")
    k.save(tmp_path / "conv16")
    back = Kernel.load(tmp_path / "conv16")
    assert back.source == k.source and back.backend.name == "cuda" and back.program.matrix == k.program.matrix


@needs_device
def test_a_kernel_set_round_trips(tmp_path: Path) -> None:
    ks = roller.compile(SYMBOLIC, hw="pocl-cpu")
    assert isinstance(ks, GenericKernel) and ks.mode == "generic"
    ks.save(tmp_path / "mm")
    back = roller.load(tmp_path / "mm")
    assert isinstance(back, GenericKernel) and back.mode == "generic"
    assert [a.source for a in back.artifacts] == [a.source for a in ks.artifacts]
    rng = np.random.default_rng(2)
    for m in (1, 7, 64, 131, 200):
        a = rng.standard_normal((m, 32)).astype(np.float32)
        b = rng.standard_normal((32, 48)).astype(np.float32)
        assert back.choice(m=m)["kernel"] == ks.choice(m=m)["kernel"]
        np.testing.assert_array_equal(back(a, b), ks(a, b))


@needs_device
@pytest.mark.parametrize("name", ["residual_block", "attention_block"])
def test_a_model_round_trips(tmp_path: Path, name: str) -> None:
    path, inputs = _zoo_file(tmp_path, name)
    m = roller.compile_model(path, hw="pocl-cpu")
    assert isinstance(m, Model)
    m.save(tmp_path / "built")
    back = roller.load(tmp_path / "built")
    assert isinstance(back, Model) and back.plan.to_json() == m.plan.to_json()
    assert [k.source for k in back.kernels] == [k.source for k in m.kernels]
    got, want = back.run(inputs), m.run(inputs)
    for n in want:
        np.testing.assert_array_equal(got[n], want[n])
    assert back.check(inputs)["reference"].startswith("onnxruntime")   # the ONNX file is there, unchanged


@needs_device
def test_roller_run_runs_a_build_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = _zoo_file(tmp_path, "inverted_residual_block")
    out = tmp_path / "out"
    assert main(["build", "--hw", "pocl-cpu", str(path), "-o", str(out)]) == 0
    assert main(["run", str(out), "--check"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "check ok against onnxruntime" in line and "pocl-cpu/opencl" in line
    # Without its ONNX file it still runs; a check then has no reference, said in one line.
    path.unlink()
    assert main(["run", str(out)]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no reference here" in err
    # An op folder and a folder of op folders run as well.
    ops = tmp_path / "ops"
    opfile = tmp_path / "ops.json"
    opfile.write_text(json.dumps({"ops": [CONV, {"name": "act", "op": "elementwise", "fn": "relu",
                                                 "shapes": {"X": [64, 64]}}]}))
    assert main(["build", "--hw", "pocl-cpu", str(opfile), "-o", str(ops)]) == 0
    assert main(["run", str(ops), "--check"]) == 0 and main(["run", str(ops / "act"), "--check"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert sum("check ok" in t for t in lines) == 3


@pytest.mark.parametrize("damage,message", [
    (lambda d: (d / "plan.json").write_text("{"), "invalid JSON"),
    (lambda d: (d / "plan.json").write_text(json.dumps({"kernels": {}})), "expected 'kernels' and 'values'"),
    (lambda d: (d / "model.json").unlink(), "not a folder roller build wrote"),
    (lambda d: next(d.glob("*/kernel.cl")).unlink(), "missing from the build folder"),
    (lambda d: (d / "weights.npz").write_bytes(b"no"), "cannot read the weights"),
])
def test_a_damaged_model_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: object,
                                            message: str) -> None:
    path, _ = _zoo_file(tmp_path, "residual_block")
    out = tmp_path / "out"
    assert main(["build", "--hw", "pocl-cpu", str(path), "-o", str(out)]) == 0
    capsys.readouterr()
    damage(out)  # type: ignore[operator]
    assert main(["run", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_folder_built_for_a_changed_description_is_refused(tmp_path: Path) -> None:
    desc = tmp_path / "cpu.yaml"
    shutil.copy(ROOT / "roller/hwdesc/pocl-cpu.yaml", desc)
    k = roller.compile(CONV, hw=str(desc))
    k.save(tmp_path / "conv")
    assert Kernel.load(tmp_path / "conv").hw.content_hash() == k.hw.content_hash()
    desc.write_text(desc.read_text().replace("name: pocl-cpu", "name: pocl-cpu-2"))
    with pytest.raises(InputError, match="whose content differs"):
        Kernel.load(tmp_path / "conv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a folder roller build wrote"):
        roller.load(tmp_path / "empty")
    with pytest.raises(InputError, match="no such build folder"):
        roller.load(tmp_path / "nothing")


@needs_device
def test_roller_run_of_a_model_constructs_each_operator_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Fusion costing, the padding decision, the layout choice and the build ask one memo (``Target``): each
    question (an operator, the number of programs asked) is constructed once in the whole run."""
    import roller.construction as construction

    real = construction.construct
    asked: Counter[tuple[str, int]] = Counter()
    depth = [0]

    def counting(op, hw, top_k=10, *args, **kwargs):  # type: ignore[no-untyped-def]
        if depth[0] == 0:   # construction's own calls for a row kernel's parts are its business
            asked[(op.content_hash(), top_k)] += 1
        depth[0] += 1
        try:
            return real(op, hw, top_k, *args, **kwargs)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(construction, "construct", counting)
    path, _ = _zoo_file(tmp_path, "inverted_residual_block")
    assert main(["run", "--hw", "pocl-cpu", str(path), "--no-cache", "--repeat", "1"]) == 0
    assert asked and {k for _, k in asked} == {1, 10}
    again = [k for k, n in asked.items() if n > 1]
    assert not again, f"constructed more than once: {again}"


def test_roller_build_and_compile_share_the_kernel_cache(tmp_path: Path) -> None:
    """roller build once wrote its folders from a construction of its own; it now goes through the cache that
    roller run and roller.compile use."""
    from roller import cache

    opfile = tmp_path / "conv.json"
    opfile.write_text(json.dumps(CONV))
    assert main(["build", "--hw", "h100", str(opfile), "-o", str(tmp_path / "out")]) == 0
    assert cache.last_event == "miss"
    k = roller.compile(CONV, hw="h100")
    assert k.cache_hit and cache.last_event == "hit"
    assert (tmp_path / "out" / "conv" / k.artifact.main_file).read_text() == k.source
    assert main(["build", "--hw", "h100", str(opfile), "-o", str(tmp_path / "again"), "--no-cache"]) == 0
    assert cache.last_event == "hit"   # --no-cache neither read nor wrote: the last event is still compile's


@needs_device
def test_roller_run_runs_a_kernel_set_folder_at_the_inputs_sizes(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    opfile = tmp_path / "mm.json"
    opfile.write_text(json.dumps(SYMBOLIC))
    assert main(["build", "--hw", "pocl-cpu", str(opfile), "-o", str(tmp_path / "out")]) == 0
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((37, 32)).astype(np.float32), rng.standard_normal((32, 48)).astype(np.float32)
    np.savez(tmp_path / "in.npz", A=a, B=b)
    assert main(["run", str(tmp_path / "out" / "mm"), "--inputs", str(tmp_path / "in.npz"), "--check",
                 "--save", str(tmp_path / "y.npz"), "--repeat", "2"]) == 0
    assert "mm at m=37" in capsys.readouterr().out
    with np.load(tmp_path / "y.npz") as y:
        np.testing.assert_allclose(y["C"], a @ b, rtol=1e-4, atol=1e-4)
    for option in (["--backend", "opencl"], ["--eval"], ["--op", "mm"]):
        assert main(["run", str(tmp_path / "out" / "mm"), *option]) == 2
        assert "does not apply to a folder roller build wrote" in capsys.readouterr().err
