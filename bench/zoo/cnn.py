"""The convolutional networks of the zoo, written from scratch after torchvision's definitions.

Layers, channel counts, kernels, strides, paddings, BatchNorm placement (and eps), ceil_mode and the order of
the forward pass follow torchvision (``torchvision/models/*.py``), so an exported graph has the nodes a
torchvision export has; the parameter counts match torchvision's (``EXPECTED_PARAMS`` in ``bench.zoo``).
Dropout is kept where torchvision has it (it vanishes in eval mode). GoogLeNet and Inception v3 are built
without their auxiliary classifiers, which an eval-mode export drops anyway.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

IntPair = int | tuple[int, int]


def _conv_bn(cin: int, cout: int, kernel: IntPair, stride: IntPair = 1, padding: IntPair = 0, groups: int = 1,
             eps: float = 1e-5, act: type[nn.Module] | None = nn.ReLU, dilation: int = 1) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, padding, dilation, groups=groups, bias=False),
                               nn.BatchNorm2d(cout, eps=eps)]
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)


# -- ResNet ------------------------------------------------------------------------------------------------

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """ResNet v1.5: the stride sits on the 3x3 convolution, as in torchvision."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 dilation: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, dilation, dilation=dilation, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, block: type[BasicBlock | Bottleneck], layers: Sequence[int],
                 num_classes: int = 1000, dilate: tuple[bool, bool, bool] = (False, False, False)) -> None:
        super().__init__()
        self.inplanes = 64
        self.dilation = 1
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(block, 64, layers[0], 1)
        self.layer2 = self._layer(block, 128, layers[1], 2, dilate[0])
        self.layer3 = self._layer(block, 256, layers[2], 2, dilate[1])
        self.layer4 = self._layer(block, 512, layers[3], 2, dilate[2])
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _layer(self, block: type[BasicBlock | Bottleneck], planes: int, blocks: int,
               stride: int, dilate: bool = False) -> nn.Sequential:
        # torchvision's replace_stride_with_dilation: the layer keeps its resolution and dilates instead, its
        # first block at the dilation before it
        before = self.dilation
        if dilate:
            self.dilation *= stride
            stride = 1
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * block.expansion))
        first = {"dilation": before} if before != 1 else {}
        layers = [block(self.inplanes, planes, stride, downsample, **first)]
        self.inplanes = planes * block.expansion
        rest = {"dilation": self.dilation} if self.dilation != 1 else {}
        layers += [block(self.inplanes, planes, **rest) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18() -> nn.Module:
    return ResNet(BasicBlock, [2, 2, 2, 2])


def resnet50() -> nn.Module:
    return ResNet(Bottleneck, [3, 4, 6, 3])


# -- DeepLabV3 (ResNet-50 backbone, no auxiliary classifier) ------------------------------------------------

class ASPP(nn.Module):
    def __init__(self, cin: int, rates: Sequence[int], cout: int = 256) -> None:
        super().__init__()
        self.convs = nn.ModuleList([_conv_bn(cin, cout, 1)] + [_conv_bn(cin, cout, 3, 1, r, dilation=r)
                                                                for r in rates])
        self.pooling = _conv_bn(cin, cout, 1)
        self.project = nn.Sequential(_conv_bn(cout * (len(rates) + 2), cout, 1), nn.Dropout(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.pooling(F.adaptive_avg_pool2d(x, 1))
        branches = [conv(x) for conv in self.convs]
        branches.append(F.interpolate(pooled, size=x.shape[-2:], mode="bilinear", align_corners=False))
        return self.project(torch.cat(branches, dim=1))


class DeepLabV3(nn.Module):
    """torchvision's ``deeplabv3_resnet50(weights=None, weights_backbone=None, aux_loss=False)``: output stride
    8 (layer3 and layer4 dilated), the ASPP head with rates 12, 24, 36, the classes' scores upsampled
    bilinearly to the input's size."""

    def __init__(self, num_classes: int = 21) -> None:
        super().__init__()
        backbone = ResNet(Bottleneck, [3, 4, 6, 3], dilate=(False, True, True))
        del backbone.avgpool, backbone.fc   # torchvision's IntermediateLayerGetter keeps layers up to layer4
        self.backbone = backbone
        self.classifier = nn.Sequential(ASPP(2048, (12, 24, 36)), _conv_bn(256, 256, 3, 1, 1),
                                        nn.Conv2d(256, num_classes, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.backbone
        y = b.maxpool(b.relu(b.bn1(b.conv1(x))))
        y = self.classifier(b.layer4(b.layer3(b.layer2(b.layer1(y)))))
        return F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)


def deeplabv3_resnet50() -> nn.Module:
    return DeepLabV3()


# -- MobileNetV2 -------------------------------------------------------------------------------------------

class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = round(cin * expand_ratio)
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(_conv_bn(cin, hidden, 1, act=nn.ReLU6))
        layers += [_conv_bn(hidden, hidden, 3, stride, 1, groups=hidden, act=nn.ReLU6),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    # (expansion t, output channels c, repeats n, first stride s), width multiplier 1.0: every c is already a
    # multiple of 8, so torchvision's _make_divisible changes nothing
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        cin = 32
        features: list[nn.Module] = [_conv_bn(3, cin, 3, 2, 1, act=nn.ReLU6)]
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                features.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        features.append(_conv_bn(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2() -> nn.Module:
    return MobileNetV2()


# -- EfficientNet-B0 ---------------------------------------------------------------------------------------

class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = nn.SiLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.fc2(self.activation(self.fc1(scale))))


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = cin * expand_ratio   # every width of B0 is a multiple of 8: _make_divisible changes nothing
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(_conv_bn(cin, hidden, 1, act=nn.SiLU))
        layers += [_conv_bn(hidden, hidden, kernel, stride, (kernel - 1) // 2, groups=hidden, act=nn.SiLU),
                   SqueezeExcitation(hidden, max(1, cin // 4)), _conv_bn(hidden, cout, 1, act=None)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # stochastic depth is the identity in eval mode
        return x + self.block(x) if self.use_res_connect else self.block(x)


class EfficientNetB0(nn.Module):
    # (expansion, kernel, first stride, input channels, output channels, repeats): width and depth 1.0
    SETTINGS = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
                (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        features: list[nn.Module] = [_conv_bn(3, 32, 3, 2, 1, act=nn.SiLU)]
        for t, k, s, cin, cout, n in self.SETTINGS:
            features.append(nn.Sequential(*(MBConv(cin if i == 0 else cout, cout, k, s if i == 0 else 1, t)
                                            for i in range(n))))
        features.append(_conv_bn(320, 1280, 1, act=nn.SiLU))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2, inplace=True), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def efficientnet_b0() -> nn.Module:
    return EfficientNetB0()


# -- DenseNet ----------------------------------------------------------------------------------------------

class DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int, bn_size: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, 1, 1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        # torchvision concatenates all earlier outputs anew in every layer: one Concat per layer, each wider
        x = self.conv1(self.relu1(self.norm1(torch.cat(features, 1))))
        return self.conv2(self.relu2(self.norm2(x)))


class DenseBlock(nn.ModuleDict):
    def __init__(self, layers: int, cin: int, growth: int, bn_size: int) -> None:
        super().__init__({f"denselayer{i + 1}": DenseLayer(cin + i * growth, growth, bn_size)
                          for i in range(layers)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    def __init__(self, growth: int = 32, blocks: Sequence[int] = (6, 12, 24, 16), init_features: int = 64,
                 bn_size: int = 4, num_classes: int = 1000) -> None:
        super().__init__()
        feats: list[tuple[str, nn.Module]] = [
            ("conv0", nn.Conv2d(3, init_features, 7, 2, 3, bias=False)), ("norm0", nn.BatchNorm2d(init_features)),
            ("relu0", nn.ReLU(inplace=True)), ("pool0", nn.MaxPool2d(3, 2, 1))]
        c = init_features
        for i, n in enumerate(blocks):
            feats.append((f"denseblock{i + 1}", DenseBlock(n, c, growth, bn_size)))
            c += n * growth
            if i != len(blocks) - 1:
                feats.append((f"transition{i + 1}", nn.Sequential(
                    nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.Conv2d(c, c // 2, 1, bias=False),
                    nn.AvgPool2d(2, 2))))
                c //= 2
        feats.append(("norm5", nn.BatchNorm2d(c)))
        self.features = nn.Sequential(OrderedDict(feats))
        self.classifier = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(F.relu(self.features(x)), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def densenet121() -> nn.Module:
    return DenseNet()


# -- GoogLeNet (Inception v1) ------------------------------------------------------------------------------

def _basic(cin: int, cout: int, kernel: IntPair, stride: IntPair = 1, padding: IntPair = 0) -> nn.Sequential:
    """torchvision's BasicConv2d of GoogLeNet and Inception v3: bias-free conv, BatchNorm with eps 1e-3, ReLU."""
    return _conv_bn(cin, cout, kernel, stride, padding, eps=0.001)


class Inception(nn.Module):
    def __init__(self, cin: int, ch1x1: int, ch3x3red: int, ch3x3: int, ch5x5red: int, ch5x5: int,
                 pool_proj: int) -> None:
        super().__init__()
        self.branch1 = _basic(cin, ch1x1, 1)
        self.branch2 = nn.Sequential(_basic(cin, ch3x3red, 1), _basic(ch3x3red, ch3x3, 3, padding=1))
        # the "5x5" branch is a 3x3 in torchvision (a known slip kept for its pretrained weights)
        self.branch3 = nn.Sequential(_basic(cin, ch5x5red, 1), _basic(ch5x5red, ch5x5, 3, padding=1))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), _basic(cin, pool_proj, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class GoogLeNet(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = _basic(3, 64, 7, 2, 3)
        self.maxpool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = _basic(64, 64, 1)
        self.conv3 = _basic(64, 192, 3, padding=1)
        self.maxpool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.inception3a = Inception(192, 64, 96, 128, 16, 32, 32)
        self.inception3b = Inception(256, 128, 128, 192, 32, 96, 64)
        self.maxpool3 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.inception4a = Inception(480, 192, 96, 208, 16, 48, 64)
        self.inception4b = Inception(512, 160, 112, 224, 24, 64, 64)
        self.inception4c = Inception(512, 128, 128, 256, 24, 64, 64)
        self.inception4d = Inception(512, 112, 144, 288, 32, 64, 64)
        self.inception4e = Inception(528, 256, 160, 320, 32, 128, 128)
        self.maxpool4 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.inception5a = Inception(832, 256, 160, 320, 32, 128, 128)
        self.inception5b = Inception(832, 384, 192, 384, 48, 128, 128)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(1024, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool1(self.conv1(x))
        x = self.maxpool2(self.conv3(self.conv2(x)))
        x = self.maxpool3(self.inception3b(self.inception3a(x)))
        x = self.inception4c(self.inception4b(self.inception4a(x)))
        x = self.maxpool4(self.inception4e(self.inception4d(x)))
        x = self.inception5b(self.inception5a(x))
        return self.fc(self.dropout(torch.flatten(self.avgpool(x), 1)))


def googlenet() -> nn.Module:
    return GoogLeNet()


# -- Inception v3 ------------------------------------------------------------------------------------------

def _avg3(x: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(x, 3, 1, 1)   # count_include_pad=True, torchvision's default


class InceptionA(nn.Module):
    def __init__(self, cin: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = _basic(cin, 64, 1)
        self.branch5x5 = nn.Sequential(_basic(cin, 48, 1), _basic(48, 64, 5, padding=2))
        self.branch3x3dbl = nn.Sequential(_basic(cin, 64, 1), _basic(64, 96, 3, padding=1),
                                          _basic(96, 96, 3, padding=1))
        self.branch_pool = _basic(cin, pool_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1x1(x), self.branch5x5(x), self.branch3x3dbl(x),
                          self.branch_pool(_avg3(x))], 1)


class InceptionB(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3 = _basic(cin, 384, 3, 2)
        self.branch3x3dbl = nn.Sequential(_basic(cin, 64, 1), _basic(64, 96, 3, padding=1), _basic(96, 96, 3, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch3x3(x), self.branch3x3dbl(x), F.max_pool2d(x, 3, 2)], 1)


class InceptionC(nn.Module):
    def __init__(self, cin: int, c7: int) -> None:
        super().__init__()
        self.branch1x1 = _basic(cin, 192, 1)
        self.branch7x7 = nn.Sequential(_basic(cin, c7, 1), _basic(c7, c7, (1, 7), padding=(0, 3)),
                                       _basic(c7, 192, (7, 1), padding=(3, 0)))
        self.branch7x7dbl = nn.Sequential(
            _basic(cin, c7, 1), _basic(c7, c7, (7, 1), padding=(3, 0)), _basic(c7, c7, (1, 7), padding=(0, 3)),
            _basic(c7, c7, (7, 1), padding=(3, 0)), _basic(c7, 192, (1, 7), padding=(0, 3)))
        self.branch_pool = _basic(cin, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1x1(x), self.branch7x7(x), self.branch7x7dbl(x),
                          self.branch_pool(_avg3(x))], 1)


class InceptionD(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3 = nn.Sequential(_basic(cin, 192, 1), _basic(192, 320, 3, 2))
        self.branch7x7x3 = nn.Sequential(_basic(cin, 192, 1), _basic(192, 192, (1, 7), padding=(0, 3)),
                                         _basic(192, 192, (7, 1), padding=(3, 0)), _basic(192, 192, 3, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch3x3(x), self.branch7x7x3(x), F.max_pool2d(x, 3, 2)], 1)


class InceptionE(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch1x1 = _basic(cin, 320, 1)
        self.branch3x3_1 = _basic(cin, 384, 1)
        self.branch3x3_2a = _basic(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = _basic(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = nn.Sequential(_basic(cin, 448, 1), _basic(448, 384, 3, padding=1))
        self.branch3x3dbl_3a = _basic(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = _basic(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = _basic(cin, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.branch3x3_1(x)
        b = self.branch3x3dbl_1(x)
        return torch.cat([self.branch1x1(x),
                          torch.cat([self.branch3x3_2a(a), self.branch3x3_2b(a)], 1),
                          torch.cat([self.branch3x3dbl_3a(b), self.branch3x3dbl_3b(b)], 1),
                          self.branch_pool(_avg3(x))], 1)


class InceptionV3(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            _basic(3, 32, 3, 2), _basic(32, 32, 3), _basic(32, 64, 3, padding=1), nn.MaxPool2d(3, 2),
            _basic(64, 80, 1), _basic(80, 192, 3), nn.MaxPool2d(3, 2))
        self.mixed = nn.Sequential(
            InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64), InceptionB(288),
            InceptionC(768, 128), InceptionC(768, 160), InceptionC(768, 160), InceptionC(768, 192),
            InceptionD(768), InceptionE(1280), InceptionE(2048))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.mixed(self.stem(x)))
        return self.fc(torch.flatten(self.dropout(x), 1))


def inception_v3() -> nn.Module:
    return InceptionV3()


# -- SqueezeNet 1.1 ----------------------------------------------------------------------------------------

class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand1x1: int, expand3x3: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.expand1x1 = nn.Conv2d(squeeze, expand1x1, 1)
        self.expand3x3 = nn.Conv2d(squeeze, expand3x3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.expand1x1(x)), F.relu(self.expand3x3(x))], 1)


class SqueezeNet11(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(64, 16, 64, 64), Fire(128, 16, 64, 64), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(128, 32, 128, 128), Fire(256, 32, 128, 128), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(256, 48, 192, 192), Fire(384, 48, 192, 192), Fire(384, 64, 256, 256), Fire(512, 64, 256, 256))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(512, num_classes, 1), nn.ReLU(inplace=True),
                                        nn.AdaptiveAvgPool2d((1, 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)


def squeezenet1_1() -> nn.Module:
    return SqueezeNet11()


# -- ShuffleNetV2 ------------------------------------------------------------------------------------------

def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(b, -1, h, w)


class ShuffleUnit(nn.Module):
    """torchvision's shufflenetv2.InvertedResidual."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        half = cout // 2
        if stride > 1:
            self.branch1 = nn.Sequential(_conv_bn(cin, cin, 3, stride, 1, groups=cin, act=None),
                                         _conv_bn(cin, half, 1))
        else:
            self.branch1 = nn.Sequential()
        self.branch2 = nn.Sequential(_conv_bn(cin if stride > 1 else half, half, 1),
                                     _conv_bn(half, half, 3, stride, 1, groups=half, act=None),
                                     _conv_bn(half, half, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), 1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), 1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, repeats: Sequence[int] = (4, 8, 4), channels: Sequence[int] = (24, 116, 232, 464, 1024),
                 num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = _conv_bn(3, channels[0], 3, 2, 1)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages: list[nn.Module] = []
        cin = channels[0]
        for n, cout in zip(repeats, channels[1:4]):
            stages.append(nn.Sequential(ShuffleUnit(cin, cout, 2), *[ShuffleUnit(cout, cout, 1) for _ in range(n - 1)]))
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.conv5 = _conv_bn(cin, channels[-1], 1)
        self.fc = nn.Linear(channels[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv5(self.stages(self.maxpool(self.conv1(x))))
        return self.fc(x.mean([2, 3]))   # torchvision's global pool: a mean, so the export has a ReduceMean


def shufflenet_v2_x1_0() -> nn.Module:
    return ShuffleNetV2()


# -- VGG, AlexNet ------------------------------------------------------------------------------------------

class VGG(nn.Module):
    def __init__(self, cfg: Sequence[int | str], num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                assert isinstance(v, int)
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU(inplace=True)]
                cin = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(0.5), nn.Linear(4096, 4096), nn.ReLU(True),
            nn.Dropout(0.5), nn.Linear(4096, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def vgg11() -> nn.Module:
    return VGG([64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"])


class AlexNet(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2))
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True),
            nn.Dropout(0.5), nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Linear(4096, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def alexnet() -> nn.Module:
    return AlexNet()
