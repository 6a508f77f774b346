"""From a torch module to an ONNX model: deterministic random weights, then torch's TorchScript exporter.

Why the TorchScript exporter (``dynamo=False``) and not torch 2.13's default dynamo exporter: the dynamo exporter
builds opset 18 and its down-conversion to 17 fails here (onnx's version converter: "axes_input_to_attribute:
No initializer or constant input to node found", the model stays at opset 18), and it writes global pooling as
ReduceMean where deployed torchvision exports have GlobalAveragePool. The TorchScript exporter writes opset 17
directly, with the graphs the published ONNX exports of these models have.
"""
from __future__ import annotations

import math
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

OPSET = 17


@torch.no_grad()
def init_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights, deterministic for a seed. Convolutions and linear layers are He-normal on fan-in, which
    keeps the activations of a ReLU network of order one through its depth, with small random biases;
    BatchNorm and LayerNorm parameters and running statistics are drawn far enough from 0 and 1 that a wrong
    epsilon, swapped mean and variance or a missing affine step shows in the output. Transformers get Hugging
    Face's initializer_range instead (normal, std 0.02)."""
    torch.manual_seed(seed)
    transformer = any(isinstance(m, nn.LayerNorm) for m in model.modules())
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            fan_in = m.weight[0].numel()
            m.weight.normal_(0.0, 0.02 if transformer else math.sqrt(2.0 / fan_in))
            if m.bias is not None:
                m.bias.uniform_(-0.1, 0.1)
        elif isinstance(m, nn.BatchNorm2d):
            assert m.running_mean is not None and m.running_var is not None   # track_running_stats, the default
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.2, 0.2)
            m.running_mean.normal_(0.0, 0.2)
            m.running_var.uniform_(0.5, 2.0)
        elif isinstance(m, nn.LayerNorm):
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.1, 0.1)
    model.eval()


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def to_onnx(model: nn.Module, inputs: dict[str, np.ndarray], output_names: list[str],
            keep_batchnorm: bool = False) -> onnx.ModelProto:
    """Export an eval-mode module at opset 17 with the shapes of ``inputs`` fixed (no dynamic axes) and constant
    folding on. By default the exporter folds each BatchNorm that follows a Conv into the Conv's weights, as a
    plain ``torch.onnx.export`` does; ``keep_batchnorm`` keeps them as BatchNormalization nodes (the exporter's
    TrainingMode.PRESERVE on an eval-mode model: inference semantics, no folding)."""
    args = tuple(torch.from_numpy(v) for v in inputs.values())
    mode = torch.onnx.TrainingMode.PRESERVE if keep_batchnorm else torch.onnx.TrainingMode.EVAL
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # the TorchScript exporter is deprecated in favour of the dynamo one, which cannot write opset 17 here
        warnings.simplefilter("ignore", DeprecationWarning)
        # PRESERVE warns that folding may alter trainable parameters; the module is in eval mode, and the
        # export is checked against torch's outputs
        warnings.filterwarnings("ignore", "It is recommended that constant folding be turned off")
        path = Path(tmp) / "model.onnx"
        torch.onnx.export(model, args, path, dynamo=False, opset_version=OPSET, do_constant_folding=True,
                          input_names=list(inputs), output_names=output_names, training=mode)
        return onnx.load(path)


@torch.no_grad()
def torch_outputs(model: nn.Module, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    out = model(*(torch.from_numpy(v) for v in inputs.values()))
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]
