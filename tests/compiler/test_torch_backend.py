"""PyTorch's front door (``roller.compiler.torch_backend``): ``torch.compile(module, backend="roller")`` and
``roller.compile_model(module, example_inputs=...)`` against eager PyTorch.

The ``torch`` tier: it runs where the ``torch`` extra is installed (``bash scripts/setup.sh --dev --torch``,
as CI does) and is skipped, with the reason, where it is not. torch is never a dependency of the core tier.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch tier needs the torch extra: scripts/setup.sh --torch")
pytest.importorskip("onnxscript", reason="the torch tier needs the torch extra: scripts/setup.sh --torch")

import roller
from roller.backends import get
from roller.compiler.torch_backend import CompiledGraph, EagerFallbackWarning, dynamo_backend
from roller.errors import InputError

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(not get("opencl").can_run_here(), reason=get("opencl").why_not_here())]
OPTIONS = {"hw": "pocl-cpu"}


class ConvNet(torch.nn.Module):
    """A convolution, batch norm (state in buffers), a linear layer, and an integer input and output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: Any, ids: Any) -> Any:
        y = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return self.fc(y) + ids.float().sum(), ids * 2


def conv_net() -> ConvNet:
    torch.manual_seed(0)
    m = ConvNet().eval()
    with torch.no_grad():   # running statistics that are not the identity, so that folding them shows
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m


def spy() -> tuple[list[Any], Any]:
    """A backend that is "roller" and records what it returned for each graph."""
    made: list[Any] = []

    def backend(gm: Any, example_inputs: list[Any], **kwargs: Any) -> Any:
        made.append(dynamo_backend(gm, example_inputs, **kwargs))
        return made[-1]
    return made, backend


def assert_close(got: Any, want: Any, tol: float = 1e-5) -> None:
    for g, w in zip(got, want) if isinstance(want, tuple) else [(got, want)]:
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.detach().numpy(), w.detach().numpy(), rtol=tol, atol=tol)


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()


def test_roller_is_a_registered_torch_compile_backend() -> None:
    assert "roller" in torch._dynamo.list_backends(exclude_tags=())
    m = conv_net()
    x, ids = torch.randn(2, 3, 8, 8), torch.tensor([1, 2, 3])
    with torch.no_grad():
        assert_close(torch.compile(m, backend="roller", options=OPTIONS)(x, ids), m(x, ids))


def test_a_module_runs_on_the_device_and_matches_eager() -> None:
    m = conv_net()
    made, backend = spy()
    x, ids = torch.randn(2, 3, 8, 8), torch.tensor([1, 2, 3])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        got = torch.compile(m, backend=backend, options=OPTIONS)(x, ids)
    assert len(made) == 1 and isinstance(made[0], CompiledGraph)
    model = made[0].graph.model
    assert len(model.input_names) == 2   # the parameters and buffers were bound in as constants
    assert_close(got, m(x, ids))
    assert got[1].dtype == torch.int64


def test_changed_parameters_build_again() -> None:
    m = conv_net()
    made, backend = spy()
    x, ids = torch.randn(1, 3, 8, 8), torch.tensor([4])
    f = torch.compile(m, backend=backend, options=OPTIONS)
    with torch.no_grad():
        f(x, ids)
        first = made[0].graph
        m.fc.weight.add_(1.0)   # what an optimiser step does: the same tensor, a new version
        got = f(x, ids)
        assert made[0].graph is not first
        assert_close(got, m(x, ids))


def test_an_unsupported_operator_runs_eagerly_with_one_warning() -> None:
    class Det(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return torch.linalg.det(x) + 1

    x = torch.randn(3, 3)
    with pytest.warns(EagerFallbackWarning, match=r"runs in eager PyTorch: .*\(Det\): op type Det is not supported$"):
        got = torch.compile(Det(), backend="roller", options=OPTIONS)(x)
    assert_close(got, torch.linalg.det(x) + 1)


def test_only_the_refused_subgraph_runs_eagerly() -> None:
    class Split(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            y = torch.relu(x) * 2
            torch._dynamo.graph_break()
            return torch.linalg.det(y)

    made, backend = spy()
    x = torch.randn(4, 4)
    with pytest.warns(EagerFallbackWarning, match="Det"):
        got = torch.compile(Split(), backend=backend, options=OPTIONS)(x)
    assert [type(f).__name__ for f in made] == ["CompiledGraph", "method"]
    assert_close(got, torch.linalg.det(torch.relu(x) * 2))


def test_sizes_left_open_run_eagerly_and_static_compilation_builds_each() -> None:
    class Double(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return torch.relu(x) * 2

    f = torch.compile(Double(), backend="roller", options=OPTIONS)
    xs = [torch.randn(n, 3) for n in (4, 5, 6)]   # dynamo marks the size dynamic at the second one
    with pytest.warns(EagerFallbackWarning, match="a size left open"):
        got = [f(x) for x in xs]
    for x, y in zip(xs, got):
        assert_close(y, torch.relu(x) * 2)
    torch._dynamo.reset()
    made, backend = spy()
    f = torch.compile(Double(), backend=backend, options=OPTIONS, dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        for n in (4, 5):
            x = torch.randn(n, 3)
            assert_close(f(x), torch.relu(x) * 2)
    assert [type(f).__name__ for f in made] == ["CompiledGraph", "CompiledGraph"]


def test_a_gradient_through_an_input_is_left_to_eager() -> None:
    m = conv_net()
    x = torch.randn(1, 3, 8, 8, requires_grad=True)
    out = torch.compile(m, backend="roller", options=OPTIONS)(x, torch.tensor([1]))
    out[0].sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_compile_model_takes_a_module_and_example_inputs() -> None:
    m = conv_net()
    x, ids = torch.randn(2, 3, 8, 8), torch.tensor([1, 2, 3])
    model = roller.compile_model(m, hw="pocl-cpu", example_inputs=[x, ids], progress=False)
    got = model.run(dict(zip(model.input_names, [x.numpy(), ids.numpy()])))
    with torch.no_grad():
        want = m(x, ids)
    for name, w in zip(model.output_names, want):
        np.testing.assert_allclose(got[name], w.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: roller.compile_model(m), "pass example_inputs"),
    (lambda m: roller.compile_model(m.train(), example_inputs=[torch.randn(1, 3, 4, 4), torch.tensor([1])]),
     "training mode"),
    (lambda m: roller.compile_model(m, example_inputs=[np.zeros((1, 3, 4, 4)), torch.tensor([1])]),
     "example input 0 is a ndarray"),
    (lambda m: torch.compile(m, backend="roller", options={"hw": "pocl-cpu", "colour": 1})(
        torch.randn(1, 3, 4, 4), torch.tensor([1])), "unknown option 'colour'"),
])
def test_bad_calls_are_one_line_errors(call: Any, message: str) -> None:
    with pytest.raises(Exception, match=message) as err:
        call(conv_net())
    cause: BaseException | None = err.value
    while cause is not None and not isinstance(cause, InputError):   # dynamo wraps a backend's error
        cause = getattr(cause, "inner_exception", None) or cause.__cause__
    assert isinstance(cause, InputError) and "\n" not in str(cause)


def test_example_inputs_are_for_modules_only() -> None:
    with pytest.raises(InputError, match="apply to a torch.nn.Module"):
        roller.compile_model(b"not read", example_inputs=[torch.zeros(1)])


@pytest.mark.slow
def test_resnet18_through_torch_compile() -> None:
    # torchvision's ResNet-18, as bench/zoo defines it (torchvision's parameter count, checked there): the
    # torchvision wheel a mirror serves may be built for CUDA and not load on a CPU-only torch.
    from bench.zoo.cnn import resnet18

    torch.manual_seed(0)
    m = resnet18().eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert_close(torch.compile(m, backend="roller", options=OPTIONS)(x), m(x), tol=1e-4)


@pytest.mark.slow
def test_a_transformers_bert_through_torch_compile() -> None:
    transformers = pytest.importorskip("transformers", reason="the BERT case needs transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                                  intermediate_size=1024)
    m = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 32))
    mask = torch.ones(1, 32, dtype=torch.int64)
    mask[0, 27:] = 0   # padding: the attention mask is an integer tensor on the device
    made, backend = spy()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        got = torch.compile(m, backend=backend, options=OPTIONS)(input_ids=ids, attention_mask=mask)
        want = m(input_ids=ids, attention_mask=mask)
    assert made and all(isinstance(f, CompiledGraph) for f in made)
    assert_close(got.last_hidden_state, want.last_hidden_state, tol=1e-4)
    assert_close(got.pooler_output, want.pooler_output, tol=1e-4)
