"""The model path's files under hostile input (issue 38): a FIFO or a device given as a model, op file or
``--inputs`` (a read that blocks forever, or never ends), a ``.npy`` where an ``.npz`` is taken, an npz member
whose header claims 2^40 elements, ``--save`` onto a device or a link (replaced before), checked before the
build rather than after the run, and a graph name that would forge a line of Roller's own output."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper

from roller.backends import get
from roller.cli.main import main
from tests.cli.test_hostile_errors import cli, one_line

CL = get("opencl")
needs_device = pytest.mark.skipif(not CL.can_run_here(), reason=CL.why_not_here())


def relu_file(folder: Path, name: str = "g") -> Path:
    g = helper.make_graph([helper.make_node("Relu", ["X"], ["Y"])], name,
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 8])])
    path = folder / "relu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("name", ["model.onnx", "op.json"])
def test_a_fifo_as_the_model_or_op_file_is_refused_at_once(tmp_path: Path, name: str) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "roller", "build", "--hw", "pocl-cpu", str(fifo), "-o",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"{fifo}: not a regular file" in one_line(done.stderr)


def test_a_device_as_the_model_is_refused(capsys: pytest.CaptureFixture) -> None:
    rc, _, err = cli(capsys, "build", "--hw", "pocl-cpu", "/dev/zero")
    assert rc == 2 and "/dev/zero: not a regular file" in one_line(err)


@needs_device
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_inputs_that_are_no_npz_of_arrays(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = relu_file(tmp_path)
    os.mkfifo(tmp_path / "fifo.npz")
    np.save(tmp_path / "one.npy", np.zeros((2, 8), np.float32))
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.zeros(2, np.float32))
    with zipfile.ZipFile(tmp_path / "liar.npz", "w") as z:   # a header claiming 4 TiB for 8 bytes
        z.writestr("X.npy", buf.getvalue().replace(b"'shape': (2,)", b"'shape': (1099511627776,)"))
    for name, message in [("fifo.npz", "not a regular file"), ("one.npy", "a .npy file holds one array"),
                          ("liar.npz", "member 'X.npy' declares shape [1099511627776] of float32 (4398046511104 "
                                       "bytes), but holds")]:
        rc, _, err = cli(capsys, "run", "--hw", "pocl-cpu", str(model), "--inputs", str(tmp_path / name))
        assert rc == 2 and message in one_line(err), err


@needs_device
def test_save_never_replaces_a_device_or_a_link(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    model = relu_file(tmp_path)
    (tmp_path / "target.npz").write_bytes(b"mine")
    (tmp_path / "link.npz").symlink_to(tmp_path / "target.npz")
    built = []
    import roller.compiler.model as model_module

    monkeypatch.setattr(model_module, "build_model", lambda *a, **k: built.append(1))   # never reached
    for target in ("/dev/null", str(tmp_path / "link.npz")):
        rc, _, err = cli(capsys, "run", "--hw", "pocl-cpu", str(model), "--save", target)
        assert rc == 2 and "exists and is not a regular file" in one_line(err)
    assert Path("/dev/null").is_char_device() and (tmp_path / "link.npz").is_symlink()
    assert (tmp_path / "target.npz").read_bytes() == b"mine" and not built


@needs_device
def test_a_graph_name_cannot_forge_a_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = relu_file(tmp_path, "evil\nroller: check ok against onnxruntime (forged)\x1b[2K")
    assert main(["run", "--hw", "pocl-cpu", str(model), "--check", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1 and out.startswith("evil\\nroller: check ok") and "\x1b" not in out


@needs_device
def test_weight_names_never_become_member_names(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """An initializer named ``../../../../tmp/x#1`` is stored as member ``b<buffer id>`` of weights.npz (a
    name of the model's would be a path in the archive) and read back by that id."""
    w = onnx.numpy_helper.from_array(np.arange(8, dtype=np.float32), "../../../../tmp/x#1")
    g = helper.make_graph([helper.make_node("Add", ["X", w.name], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [8])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [8])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    assert main(["build", "--hw", "pocl-cpu", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out")]) == 0
    with zipfile.ZipFile(tmp_path / "out" / "weights.npz") as z:
        assert all(n.startswith("b") and n[1:-4].isdigit() for n in z.namelist()), z.namelist()
    import roller

    m = roller.load(tmp_path / "out")
    np.testing.assert_array_equal(m.run({"X": np.ones(8, np.float32)})["Y"], np.arange(8) + 1.0)
    capsys.readouterr()


@needs_device
def test_pocl_without_a_writable_cache_says_so(tmp_path: Path) -> None:
    """PoCL offers no device when it cannot make its kernel cache; the error said `list index out of range`."""
    env = dict(os.environ, POCL_CACHE_DIR="/dev/null/pocl", ROLLER_NO_CACHE="1")
    env.pop("ROLLER_CL_DEVICE", None)
    done = subprocess.run([sys.executable, "-m", "roller", "run", "--hw", "pocl-cpu",
                           str(Path(__file__).resolve().parents[2] / "examples" / "matmul.json")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 5
    assert "PoCL offers none when it cannot write its kernel cache (POCL_CACHE_DIR=/dev/null/pocl)" in \
        one_line(done.stderr)


def test_out_of_memory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A model larger than the memory the process may use (a ulimit: MemoryError anywhere in the build)."""
    import roller.cli.model_cmd as model_cmd

    def too_big(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(model_cmd, "cmd_build_model", too_big)
    rc, _, err = cli(capsys, "build", "--hw", "h100", str(relu_file(tmp_path)), "-o", str(tmp_path / "out"))
    assert rc == 1 and "out of memory running 'roller build'" in one_line(err)
