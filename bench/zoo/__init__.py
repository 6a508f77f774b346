"""The ONNX model zoo: real architectures at benchmark size with random weights, for the ONNX importer and the
graph executor to be measured on.

    python -m bench.zoo --out DIR [--models resnet18 bert_base_layer ...] [--force] [--keep-batchnorm] [--latency]
    python bench/zoo --out DIR ...                    # the same

Each model is defined from scratch in torch after torchvision's (Hugging Face's for BERT) definition
(``cnn.py``, ``bert.py``, ``vit.py``), given deterministic random weights (``torch.manual_seed(0)``; BatchNorm with random
affine parameters and running statistics), put in eval mode and exported with torch's TorchScript exporter at
opset 17, batch 1, fixed shapes, constant folding on (``torch_export.py`` says why not the dynamo exporter). Each
export is checked: its torch parameter count against torchvision's, ``onnx.checker`` (full check), strict shape
inference, and onnxruntime's outputs against torch's. Files go to ``~/.cache/roller/zoo/`` by default; an
existing file is kept unless ``--force``. torch is needed only to export; ``check.py`` describes and verifies
the files with onnx and onnxruntime alone.

By default the exporter folds every BatchNorm that follows a Conv into that Conv, as a plain
``torch.onnx.export`` does, so BatchNormalization nodes remain only where a BatchNorm follows something else
(DenseNet's pre-activation layers); ``--keep-batchnorm`` writes ``<model>-bn.onnx`` with every BatchNorm kept.

Measured on the development machine (2 cores of an AMD EPYC, onnxruntime 1.32.0, torch 2.13.0+cpu, onnx 1.23.2):
ONNX nodes (Constant nodes included) and op types of the default (BatchNorm-folded) export; parameters as
elements of the ONNX initializers (folding drops BatchNorm's four vectors and gives each Conv a bias) and of the
torch module (equal to torchvision's: checked at every export); onnxruntime latency with 2 intra-op threads and
all graph optimisations, median of 10 runs after 3 warm-up runs. Other sessions share this machine: under their
load the same command gave 2-5x these times (best of four runs shown).

    model               nodes  ONNX params torch params  ORT ms  op types (count)
    resnet18               49   11,684,712   11,689,512    17.6  Conv 20, Relu 17, Add 8, Flatten 1, Gemm 1,
                                                                 GlobalAveragePool 1, MaxPool 1
    resnet50              122   25,530,472   25,557,032    38.3  Conv 53, Relu 49, Add 16, Flatten 1, Gemm 1,
                                                                 GlobalAveragePool 1, MaxPool 1
    mobilenet_v2          170    3,487,816    3,504,872     3.8  Constant 70, Conv 52, Clip 35, Add 10,
                                                                 Flatten 1, Gemm 1, GlobalAveragePool 1
    efficientnet_b0       239    5,267,540    5,288,548    11.7  Conv 81, Mul 65, Sigmoid 65, GlobalAveragePool 17,
                                                                 Add 9, Flatten 1, Gemm 1
    deeplabv3_resnet50    152   39,610,517   39,638,869   210.6  Conv 61, Relu 56, Add 16, Constant 8, Concat 3,
                                                                 Resize 2, Shape 2, Slice 2, GlobalAveragePool 1,
                                                                 MaxPool 1
    densenet121           372    8,040,040    7,978,856    30.9  Relu 121, Conv 120, BatchNormalization 62,
                                                                 Concat 62, AveragePool 3, Flatten 1, Gemm 1,
                                                                 GlobalAveragePool 1, MaxPool 1
    googlenet             139    6,617,624    6,624,904    15.0  Conv 57, Relu 57, MaxPool 13, Concat 9,
                                                                 Flatten 1, Gemm 1, GlobalAveragePool 1
    inception_v3          215   23,817,352   23,834,568    54.5  Conv 94, Relu 94, Concat 11, AveragePool 9,
                                                                 MaxPool 4, Flatten 1, Gemm 1,
                                                                 GlobalAveragePool 1
    squeezenet1_1          65    1,235,496    1,235,496     5.9  Conv 26, Relu 26, Concat 8, MaxPool 3,
                                                                 Flatten 1, GlobalAveragePool 1
    shufflenet_v2_x1_0    374    2,270,514    2,278,604     5.4  Constant 110, Conv 56, Relu 37, Reshape 32,
                                                                 Mul 26, Slice 26, Concat 16, Transpose 16,
                                                                 Add 13, Div 13, Gather 13, Shape 13, Gemm 1,
                                                                 MaxPool 1, ReduceMean 1
    vgg11                  28  132,863,336  132,863,336    83.1  Relu 10, Conv 8, MaxPool 5, Gemm 3,
                                                                 AveragePool 1, Flatten 1
    alexnet                20   61,100,840   61,100,840    13.5  Relu 7, Conv 5, Gemm 3, MaxPool 3,
                                                                 AveragePool 1, Flatten 1
    bert_base_layer        42    7,087,872    7,087,872    10.7  Add 10, Constant 8, MatMul 8, Reshape 4,
                                                                 Transpose 4, Div 2, LayerNormalization 2,
                                                                 Mul 2, Erf 1, Softmax 1

With ``--keep-batchnorm`` the op types are the same plus one BatchNormalization per Conv that has one (resnet18
20, resnet50 53, mobilenet_v2 52, efficientnet_b0 49, deeplabv3_resnet50 60, densenet121 121, googlenet 57,
inception_v3 94, shufflenet_v2_x1_0 56).

What an importer has to cover, over the whole zoo: 26 op types (Add, AveragePool, BatchNormalization, Clip,
Concat, Constant, Conv, Div, Erf, Flatten, Gather, Gemm, GlobalAveragePool, LayerNormalization, MatMul,
MaxPool, Mul, ReduceMean, Relu, Reshape, Resize, Shape, Sigmoid, Slice, Softmax, Transpose), and these attributes and
forms: Conv with group = channels (depthwise: mobilenet_v2, efficientnet_b0 with 5x5 kernels too, shufflenet),
squeeze-and-excitation (a GlobalAveragePool's channels scaling its input: efficientnet_b0), dilated 3x3
convolutions at rates 2-36 and bilinear Resize to a size computed from a Shape (deeplabv3_resnet50), rectangular kernels 1x3, 3x1, 1x7, 7x1 with
their own pads (inception_v3), 11x11 stride 4 (alexnet); MaxPool with ceil_mode 1, also with stride 1 and pads 1
(googlenet, squeezenet); AveragePool with count_include_pad 1 and pads (inception_v3) and a 1x1 AveragePool that
is adaptive pooling to the size it already has (vgg11, alexnet); Clip with min and max as Constant inputs
(ReLU6); Gemm with transB 1; ReduceMean over axes [2, 3] with keepdims 0 (shufflenet's global pool); Reshape
with a Constant shape holding -1; Transpose of rank 5 (channel shuffle); torch's ``chunk`` as int64 arithmetic on
a Shape (Shape -> Gather -> Add -> Div -> Mul -> Slice: shufflenet, 13 times), which an importer must fold to
constants to know the Slices' bounds; a 4-D MatMul with batch dims (attention) and 3-D MatMul against 2-D
weights; LayerNormalization with epsilon 1e-12 over the last axis; GELU as Div, Erf, Add, Mul, Mul.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

if TYPE_CHECKING:
    from torch import nn


def default_dir() -> Path:
    """``~/.cache/roller/zoo``, under ``$XDG_CACHE_HOME`` when that is set (where Roller keeps its cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "roller" / "zoo"


@dataclass(frozen=True)
class Spec:
    name: str
    module: str                    # "cnn" or "bert": the file with the torch definition
    inputs: dict[str, tuple[int, ...]]
    outputs: tuple[str, ...]
    torch_params: int              # torchvision's count for the same architecture (without aux classifiers)
    batchnorm: bool = True         # has BatchNorm layers, so a -bn variant differs from the default export

    def build(self) -> nn.Module:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{self.module}"), self.name)()

    def example_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Standard-normal images or hidden states; BERT's mask attends to the first three quarters of the
        sequence and masks the rest with -10000, the value Hugging Face long used."""
        rng = np.random.default_rng(seed)
        out = {}
        for name, shape in self.inputs.items():
            if name == "attention_mask":
                mask = np.zeros(shape, np.float32)
                mask[..., shape[-1] * 3 // 4:] = -10000.0
                out[name] = mask
            else:
                out[name] = rng.standard_normal(shape, dtype=np.float32)
        return out


def _image(size: int = 224) -> dict[str, tuple[int, ...]]:
    return {"input": (1, 3, size, size)}


SPECS: dict[str, Spec] = {s.name: s for s in [
    Spec("resnet18", "cnn", _image(), ("logits",), 11_689_512),
    Spec("resnet50", "cnn", _image(), ("logits",), 25_557_032),
    Spec("mobilenet_v2", "cnn", _image(), ("logits",), 3_504_872),
    Spec("efficientnet_b0", "cnn", _image(), ("logits",), 5_288_548),
    Spec("densenet121", "cnn", _image(), ("logits",), 7_978_856),
    Spec("deeplabv3_resnet50", "cnn", _image(), ("scores",), 39_638_869),
    Spec("googlenet", "cnn", _image(), ("logits",), 6_624_904),
    Spec("inception_v3", "cnn", _image(299), ("logits",), 23_834_568),
    Spec("squeezenet1_1", "cnn", _image(), ("logits",), 1_235_496, batchnorm=False),
    Spec("shufflenet_v2_x1_0", "cnn", _image(), ("logits",), 2_278_604),
    Spec("vgg11", "cnn", _image(), ("logits",), 132_863_336, batchnorm=False),
    Spec("alexnet", "cnn", _image(), ("logits",), 61_100_840, batchnorm=False),
    # 4 x (768*768 + 768) attention, 768*3072 + 3072 and 3072*768 + 768 FFN, 2 x 2 x 768 LayerNorm
    Spec("bert_base_layer", "bert", {"hidden_states": (1, 128, 768), "attention_mask": (1, 1, 1, 128)},
         ("output",), 7_087_872, batchnorm=False),
    Spec("vit_b_16", "vit", _image(), ("logits",), 86_567_656, batchnorm=False),
]}


def export(name: str, keep_batchnorm: bool = False, check_torch: bool = True) -> onnx.ModelProto:
    """Build, initialise and export one model of the zoo; raise if its parameter count differs from
    torchvision's or (``check_torch``) onnxruntime's outputs differ from torch's."""
    from . import check
    from .torch_export import init_weights, param_count, to_onnx, torch_outputs

    spec = SPECS[name]
    module = spec.build()
    if param_count(module) != spec.torch_params:
        raise AssertionError(f"{name}: {param_count(module)} parameters, torchvision has {spec.torch_params}")
    init_weights(module)
    inputs = spec.example_inputs()
    model = to_onnx(module, inputs, list(spec.outputs), keep_batchnorm)
    model.doc_string = f"Roller model zoo: {name}, random weights (torch.manual_seed(0)), not trained"
    if check_torch:
        for want, got in zip(torch_outputs(module, inputs), check.verify(model, inputs)):
            err = float(np.max(np.abs(want - got)) / max(float(np.max(np.abs(want))), 1e-30))
            if err > 1e-4:
                raise AssertionError(f"{name}: onnxruntime and torch differ by {err:.2e} of the largest output")
    return model


def path_of(name: str, folder: Path | None = None, keep_batchnorm: bool = False) -> Path:
    """``<name>.onnx``, or ``<name>-bn.onnx`` with BatchNorm kept (a model without BatchNorm has one file)."""
    bn = keep_batchnorm and SPECS[name].batchnorm
    return (folder or default_dir()) / f"{name}{'-bn' if bn else ''}.onnx"


def ensure(name: str, folder: Path | None = None, keep_batchnorm: bool = False, force: bool = False) -> Path:
    """The model's file, exported first unless it is there already (``force``: exported again)."""
    from roller.atomic import write_atomic

    path = path_of(name, folder, keep_batchnorm)
    if force or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, export(name, keep_batchnorm).SerializeToString())
    return path


# One function per model (each needs torch): opset 17, batch 1, fixed shapes, random weights.


def resnet18(keep_batchnorm: bool = False) -> onnx.ModelProto:
    return export("resnet18", keep_batchnorm)


def resnet50(keep_batchnorm: bool = False) -> onnx.ModelProto:
    return export("resnet50", keep_batchnorm)


def mobilenet_v2(keep_batchnorm: bool = False) -> onnx.ModelProto:
    return export("mobilenet_v2", keep_batchnorm)


def efficientnet_b0(keep_batchnorm: bool = False) -> onnx.ModelProto:
    return export("efficientnet_b0", keep_batchnorm)


def deeplabv3_resnet50(keep_batchnorm: bool = False) -> onnx.ModelProto:
    return export("deeplabv3_resnet50", keep_batchnorm)


def densenet121(keep_batchnorm: bool = False) -> onnx.ModelProto:
    return export("densenet121", keep_batchnorm)


def googlenet(keep_batchnorm: bool = False) -> onnx.ModelProto:
    return export("googlenet", keep_batchnorm)


def inception_v3(keep_batchnorm: bool = False) -> onnx.ModelProto:
    return export("inception_v3", keep_batchnorm)


def squeezenet1_1(keep_batchnorm: bool = False) -> onnx.ModelProto:
    return export("squeezenet1_1", keep_batchnorm)


def shufflenet_v2_x1_0(keep_batchnorm: bool = False) -> onnx.ModelProto:
    return export("shufflenet_v2_x1_0", keep_batchnorm)


def vgg11(keep_batchnorm: bool = False) -> onnx.ModelProto:
    return export("vgg11", keep_batchnorm)


def alexnet(keep_batchnorm: bool = False) -> onnx.ModelProto:
    return export("alexnet", keep_batchnorm)


def bert_base_layer(keep_batchnorm: bool = False) -> onnx.ModelProto:
    return export("bert_base_layer", keep_batchnorm)


def vit_b_16(keep_batchnorm: bool = False) -> onnx.ModelProto:
    return export("vit_b_16", keep_batchnorm)
