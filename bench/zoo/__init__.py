"""The ONNX model zoo: real architectures at benchmark size with random weights, for the ONNX importer and the
graph executor to be measured on.

    python -m bench.zoo --out DIR [--models resnet18 bert_base_layer ...] [--force] [--keep-batchnorm] [--latency]
    python bench/zoo --out DIR ...                    # the same

Each model is defined from scratch in torch after torchvision's (Hugging Face's for BERT) definition
(``cnn.py``, ``bert.py``), given deterministic random weights (``torch.manual_seed(0)``; BatchNorm with random
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
ONNX nodes and op types of the default (folded) export, parameters as initializer elements (BatchNorm folded,
so fewer than torch's count, which matches torchvision's), onnxruntime latency with 2 intra-op threads and all
graph optimisations, median of 10 runs after 3 warm-up runs:

TABLE
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
    Spec("densenet121", "cnn", _image(), ("logits",), 7_978_856),
    Spec("googlenet", "cnn", _image(), ("logits",), 6_624_904),
    Spec("inception_v3", "cnn", _image(299), ("logits",), 23_834_568),
    Spec("squeezenet1_1", "cnn", _image(), ("logits",), 1_235_496),
    Spec("shufflenet_v2_x1_0", "cnn", _image(), ("logits",), 2_278_604),
    Spec("vgg11", "cnn", _image(), ("logits",), 132_863_336),
    Spec("alexnet", "cnn", _image(), ("logits",), 61_100_840),
    # 4 x (768*768 + 768) attention, 768*3072 + 3072 and 3072*768 + 768 FFN, 2 x 2 x 768 LayerNorm
    Spec("bert_base_layer", "bert", {"hidden_states": (1, 128, 768), "attention_mask": (1, 1, 1, 128)},
         ("output",), 7_087_872),
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
            if err > 1e-3:
                raise AssertionError(f"{name}: onnxruntime and torch differ by {err:.2e} of the largest output")
    return model


def path_of(name: str, folder: Path | None = None, keep_batchnorm: bool = False) -> Path:
    return (folder or default_dir()) / f"{name}{'-bn' if keep_batchnorm else ''}.onnx"


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
