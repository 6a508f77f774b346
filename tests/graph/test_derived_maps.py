"""The fusion solver's candidate graphs derive their producer and reader maps from the graph they grew from
(``Graph.replaced_from``): the derived maps are the ones a rebuild makes (the same steps, readers in step order,
a step once per read), for every candidate of graphs with shared producers, residuals and repeated reads."""
from __future__ import annotations

import pytest

from roller.compiler.target import Target
from roller.frontends.onnx import import_model
from roller.graph import orchestrate
from roller.graph.ir import Graph
from tests.support.zoo_graphs import ALL


@pytest.mark.parametrize("name", ["attention_block", "residual_block", "dense_block", "inverted_residual_block"])
def test_derived_maps_are_the_rebuilt_ones(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Graph.replaced_from
    checked = []

    def compare(self: Graph, parent: Graph, old: list, new: object) -> Graph:
        out = real(self, parent, old, new)   # type: ignore[arg-type]
        assert out._index is not None
        _, producer, readers = out._index
        rebuilt = Graph(self.name, self.inputs, self.outputs, self.values, self.constants, list(self.nodes))
        _, producer2, readers2 = rebuilt._maps()
        assert producer.keys() == producer2.keys() and all(producer[k] is producer2[k] for k in producer)
        assert readers.keys() == readers2.keys()
        for v, nodes in readers.items():
            assert [id(n) for n in nodes] == [id(n) for n in readers2[v]], v
        checked.append(1)
        return out

    monkeypatch.setattr(Graph, "replaced_from", compare)
    graph = import_model(ALL[name]()[0])
    target = Target.resolve("pocl-cpu", None)
    found = orchestrate.candidates(graph, target.predicted_seconds)
    assert checked and len(found) > len(graph.op_nodes)


def test_maps_are_trusted_only_inside_unchanged() -> None:
    """Inside ``Graph.unchanged`` the maps are read without comparing the steps; after it, a change of the steps
    is seen again (the fusion passes change the graph between their scans)."""
    graph = import_model(ALL["residual_block"]()[0])
    first = graph.op_nodes[0]
    with graph.unchanged():
        assert graph.producer()[first.output] is first
        with graph.unchanged():   # nested: the outer block still holds
            pass
        assert graph._fixed
    assert not graph._fixed
    graph.nodes.remove(first)
    assert first.output not in graph.producer()
    assert all(n is not first for readers in graph.consumers().values() for n in readers)
