"""ONNX files that lie or reach outside themselves, refused in one line naming the tensor: external data (onnx
reads it relative to the working folder, so a Constant naming ``secret.bin`` put that file's bytes into the
output), sparse tensors and undefined element types (tracebacks before), and declarations that disagree with
the graph (an initializer of another shape than its input declares, an output declared int64 and computed
float: onnxruntime refuses both; Roller ran them)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper

from roller.errors import InputError
from roller.frontends.onnx import import_model


def add_model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto] | None = None,
              inputs: list[onnx.ValueInfoProto] | None = None, out_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "hostile", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [8]),
                                              *(inputs or [])],
                          [helper.make_tensor_value_info("Y", out_type, [8])], inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def external(name: str, location: str) -> onnx.TensorProto:
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[8], data_location=TensorProto.EXTERNAL)
    entry = t.external_data.add()
    entry.key, entry.value = "location", location
    return t


@pytest.mark.parametrize("location", ["secret.bin", "../secret.bin", "/etc/hostname"])
def test_external_data_is_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str) -> None:
    monkeypatch.chdir(tmp_path)
    np.arange(8, dtype=np.float32).tofile(tmp_path / "secret.bin")
    as_constant = add_model([helper.make_node("Constant", [], ["c"], value=external("c", location)),
                             helper.make_node("Add", ["X", "c"], ["Y"])])
    with pytest.raises(InputError, match=r"node 'Constant' \(Constant\) attribute 'value' keeps its data in an "
                                         r"external file, which is not supported"):
        import_model(as_constant)
    as_weight = add_model([helper.make_node("Add", ["X", "w"], ["Y"])], [external("w", location)])
    with pytest.raises(InputError, match=r"initializer 'w' keeps its data in an external file"):
        import_model(as_weight)


def test_a_tensor_inside_a_subgraph_is_checked_too() -> None:
    branch = helper.make_graph([helper.make_node("Constant", [], ["b"], value=external("b", "secret.bin"))],
                               "then", [], [helper.make_tensor_value_info("b", TensorProto.FLOAT, [8])])
    m = add_model([helper.make_node("Constant", [], ["cond"], value=numpy_helper.from_array(np.array(True))),
                   helper.make_node("If", ["cond"], ["c"], then_branch=branch, else_branch=branch),
                   helper.make_node("Add", ["X", "c"], ["Y"])])
    with pytest.raises(InputError, match="keeps its data in an external file"):
        import_model(m)


def test_sparse_and_undefined_tensors_are_refused() -> None:
    sparse = add_model([helper.make_node("Add", ["X", "s_values"], ["Y"])])
    sparse.graph.sparse_initializer.append(helper.make_sparse_tensor(
        helper.make_tensor("s_values", TensorProto.FLOAT, [2], [1.0, 2.0]),
        helper.make_tensor("s_idx", TensorProto.INT64, [2], [1, 5]), [8]))
    with pytest.raises(InputError, match="sparse initializer 's_values': sparse tensors are not supported"):
        import_model(sparse)
    odd = TensorProto(name="w", data_type=99, dims=[8], raw_data=b"\0" * 32)
    with pytest.raises(InputError, match="initializer 'w' has element type 99, which ONNX does not define"):
        import_model(add_model([helper.make_node("Add", ["X", "w"], ["Y"])], [odd]))


def test_declarations_that_disagree_with_the_graph_are_refused() -> None:
    w = numpy_helper.from_array(np.ones(8, np.float32), "w")
    add = [helper.make_node("Add", ["X", "w"], ["Y"])]
    with pytest.raises(InputError, match=r"input 'w' is declared with shape \[4\], its initializer has \[8\]"):
        import_model(add_model(add, [w], [helper.make_tensor_value_info("w", TensorProto.FLOAT, [4])]))
    with pytest.raises(InputError, match="input 'w' is declared INT64, its initializer holds FLOAT"):
        import_model(add_model(add, [w], [helper.make_tensor_value_info("w", TensorProto.INT64, [8])]))
    with pytest.raises(InputError, match="output 'Y' is declared INT64 but computed as float32"):
        import_model(add_model(add, [w], out_type=TensorProto.INT64))
    # an initializer declared as an input with an open size, as older exporters wrote them, is a weight
    g = import_model(add_model(add, [w], [helper.make_tensor_value_info("w", TensorProto.FLOAT, ["n"])]))
    assert g.inputs == ["X"]


@pytest.mark.parametrize("given", ["path", "bytes", "proto"])
def test_the_checker_refuses_a_model_however_it_is_given(tmp_path: Path, given: str) -> None:
    """The checker reads a file's (or the caller's) bytes as they are, and a ModelProto serialised: a raw
    initializer shorter than its shape declares is refused in one line each way."""
    w = numpy_helper.from_array(np.ones(8, np.float32), "W")
    w.raw_data = b"\0" * 12
    model = add_model([helper.make_node("Add", ["X", "W"], ["Y"])], [w])
    path = tmp_path / "short.onnx"
    path.write_bytes(model.SerializeToString())
    arg = {"path": str(path), "bytes": path.read_bytes(), "proto": model}[given]
    with pytest.raises(InputError, match="invalid ONNX model: .*raw_data size") as err:
        import_model(arg)
    assert "\n" not in str(err.value)
