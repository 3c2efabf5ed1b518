"""Convolutional zoo models: ResNet (CIFAR, ResNet-50-like), VGG, MobileNetV2, ShuffleNet, DenseNet.

All are our own compact definitions (no torchvision). Every model takes images
(N, C, H, W) with any H, W >= 8 and ends in global average pooling, so the
8x8 single-channel sklearn digits work as well as 32x32x3 or 224x224x3 inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial

import torch
from torch import nn

from hpcnb.errors import InvalidInputError
from hpcnb.models.layers import channel_shuffle, init_weights

__all__ = [
    "densenet",
    "mobilenet_v2",
    "resnet50_like",
    "resnet_cifar",
    "shufflenet",
    "vgg",
]


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]


#: ``unit(cin, cout, stride)``: one block of a stage.
Unit = Callable[[int, int, int], nn.Module]


def _stages(
    cin: int, stages: Iterable[tuple[Unit, int, int, int]], expansion: int = 1
) -> tuple[list[nn.Module], int]:
    """The units of consecutive stages, and the channels that leave the last one.

    Args:
        cin: Channels entering the first stage.
        stages: Per stage ``(unit, cout, count, stride)``: ``count`` units of width ``cout``,
            the first with ``stride`` and the others with stride 1.
        expansion: Output channels of a unit per unit of its ``cout`` (4 for bottlenecks).
    """
    units: list[nn.Module] = []
    for unit, cout, count, stride in stages:
        for i in range(count):
            units.append(unit(cin, cout, stride if i == 0 else 1))
            cin = expansion * cout
    return units, cin


class PooledClassifier(nn.Module):
    """Base of the CNNs whose head is ``features`` → global ``pool`` → ``classifier``.

    Subclasses build their feature layers and hand them to :meth:`build`.
    """

    features: nn.Module
    pool: nn.Module
    classifier: nn.Module

    def build(self, layers: Sequence[nn.Module], classifier: nn.Module) -> None:
        """Set ``features`` (``layers`` in order), a global average pool and ``classifier``.

        Then initialise the weights (:func:`~hpcnb.models.layers.init_weights`).

        Args:
            layers: The feature layers, input first.
            classifier: The head applied to the pooled features.
        """
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = classifier
        init_weights(self)

    def build_stages(
        self,
        in_channels: int,
        stem: int,
        stages: Iterable[tuple[Unit, int, int, int]],
        last: int,
        num_classes: int,
        act: Callable[[], nn.Module],
    ) -> None:
        """:meth:`build` a 3x3 stem, ``stages`` of units and a 1x1 head conv, then a linear head.

        Args:
            in_channels: Input image channels.
            stem: Width of the 3x3 stem conv (conv, BN, ``act``).
            stages: Per stage ``(unit, cout, count, stride)`` (see :func:`_stages`).
            last: Width of the final 1x1 conv (conv, BN, ``act``).
            num_classes: Outputs of the linear classifier.
            act: Makes the activation after the stem and the final conv.
        """
        layers: list[nn.Module] = [*_conv_bn(in_channels, stem, 3), act()]
        units, cin = _stages(stem, stages)
        layers += [*units, *_conv_bn(cin, last, 1), act()]
        self.build(layers, nn.Linear(last, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits."""
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    """Identity, or a strided 1x1 conv and BN where the block changes the shape."""
    if stride != 1 or cin != cout:
        return nn.Sequential(*_conv_bn(cin, cout, 1, stride))
    return nn.Identity()


class ResidualBlock(nn.Module):
    """Base of the ResNet blocks: ``relu(residual(x) + shortcut(x))``."""

    relu: nn.Module
    shortcut: nn.Module

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """The residual branch ``f(x)`` (subclasses)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Residual block output ``relu(f(x) + shortcut(x))``."""
        return self.relu(self.residual(x) + self.shortcut(x))


class BasicBlock(ResidualBlock):
    """Two 3x3 convolutions with an identity or 1x1-projection shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, cout, 3, stride)
        self.conv2, self.bn2 = _conv_bn(cout, cout, 3)
        self.relu = nn.ReLU()
        self.shortcut = _shortcut(cin, cout, stride)

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """3x3 conv, BN, ReLU, 3x3 conv, BN."""
        out = self.relu(self.bn1(self.conv1(x)))
        return self.bn2(self.conv2(out))


class Bottleneck(ResidualBlock):
    """1x1 reduce, 3x3, 1x1 expand (x4) with shortcut (ResNet-50 style)."""

    def __init__(self, cin: int, mid: int, stride: int) -> None:
        super().__init__()
        cout = 4 * mid
        self.conv1, self.bn1 = _conv_bn(cin, mid, 1)
        self.conv2, self.bn2 = _conv_bn(mid, mid, 3, stride)
        self.conv3, self.bn3 = _conv_bn(mid, cout, 1)
        self.relu = nn.ReLU()
        self.shortcut = _shortcut(cin, cout, stride)

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """1x1 reduce, 3x3, 1x1 expand, each with BN (ReLU between)."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.bn3(self.conv3(out))


class ResNet(nn.Module):
    """Stem, residual stages, global pool and a linear classifier."""

    def __init__(
        self, stem: nn.Module, stages: nn.Sequential, features: int, num_classes: int
    ) -> None:
        super().__init__()
        self.stem = stem
        self.layers = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(features, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for images ``x``."""
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def resnet_cifar(
    depth: int = 20, width: int = 16, num_classes: int = 10, in_channels: int = 3
) -> nn.Module:
    """CIFAR-style ResNet (He et al. 2016): 3 stages of ``(depth - 2) / 6`` basic blocks.

    Args:
        depth: Total depth, ``6 n + 2`` (8, 14, 20, 32, 56, ...).
        width: Channels of the stem and the first stage (doubled per stage).
        num_classes: Outputs of the final linear layer ``fc``.
        in_channels: Channels of the input images (the 3x3 stem's input).

    Returns:
        The ResNet, freshly initialised.
    """
    if depth < 8 or (depth - 2) % 6:
        raise InvalidInputError(
            f"resnet_cifar: depth={depth} must be 6n+2 with n >= 1 (8, 14, 20, ...)"
        )
    n = (depth - 2) // 6
    stem = nn.Sequential(*_conv_bn(in_channels, width, 3), nn.ReLU())
    stages = [(BasicBlock, width * 2**stage, n, 2 if stage else 1) for stage in range(3)]
    blocks, cin = _stages(width, stages)
    return ResNet(stem, nn.Sequential(*blocks), cin, num_classes)


def resnet50_like(
    num_classes: int = 1000,
    in_channels: int = 3,
    width: int = 64,
    layers: Sequence[int] = (3, 4, 6, 3),
) -> nn.Module:
    """Bottleneck ResNet with the ResNet-50 layout (7x7 stem, max-pool, 4 stages).

    Args:
        num_classes: Outputs of the final linear layer ``fc``.
        in_channels: Channels of the input images (the 7x7 stem's input).
        width: Bottleneck width of the first stage (64 for ResNet-50).
        layers: Blocks per stage ((3, 4, 6, 3) for ResNet-50).

    Returns:
        The ResNet (about 25.6 M parameters at the defaults).
    """
    stem = nn.Sequential(
        nn.Conv2d(in_channels, width, 7, 2, 3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    )
    stages = [(Bottleneck, width * 2**s, count, 2 if s else 1) for s, count in enumerate(layers)]
    blocks, cin = _stages(width, stages, expansion=4)
    return ResNet(stem, nn.Sequential(*blocks), cin, num_classes)


class VGG(PooledClassifier):
    """Plain conv-BN-ReLU stack with max-pools, global pool and a 2-layer classifier."""

    def __init__(
        self, cfg: Sequence[int | str], in_channels: int, hidden: int, num_classes: int
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = in_channels
        for item in cfg:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [*_conv_bn(cin, int(item), 3), nn.ReLU()]
                cin = int(item)
        classifier = nn.Sequential(
            nn.Linear(cin, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, num_classes)
        )
        self.build(layers, classifier)


def vgg(
    cfg: Sequence[int | str] = (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512),
    hidden: int = 256,
    num_classes: int = 10,
    in_channels: int = 3,
) -> nn.Module:
    """VGG-style network (Simonyan and Zisserman 2015), BN variant.

    Args:
        cfg: Conv widths; ``"M"`` inserts a 2x2 max-pool.
        hidden: Width of the hidden classifier layer.
        num_classes: Outputs of the classifier's last linear layer.
        in_channels: Channels of the input images (the first conv's input).

    Returns:
        The VGG network, freshly initialised.
    """
    return VGG(cfg, in_channels, hidden, num_classes)


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, 3x3 depthwise, 1x1 linear project (+ residual)."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_residual = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [*_conv_bn(cin, hidden, 1), nn.ReLU6()]
        layers += [*_conv_bn(hidden, hidden, 3, stride, groups=hidden), nn.ReLU6()]
        layers += _conv_bn(hidden, cout, 1)
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Block output."""
        if self.use_residual:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(PooledClassifier):
    """Stem, inverted-residual stages, 1x1 head conv, pool, classifier."""

    def __init__(
        self,
        settings: Sequence[tuple[int, int, int, int]],
        stem: int,
        last: int,
        in_channels: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        stages = [(partial(InvertedResidual, expand=t), c, n, s) for t, c, n, s in settings]
        self.build_stages(in_channels, stem, stages, last, num_classes, nn.ReLU6)


def mobilenet_v2(
    settings: Sequence[tuple[int, int, int, int]] = (
        (1, 16, 1, 1),
        (6, 24, 2, 1),
        (6, 32, 3, 2),
        (6, 64, 3, 2),
        (6, 96, 2, 1),
        (6, 160, 2, 2),
    ),
    stem: int = 32,
    last: int = 640,
    num_classes: int = 10,
    in_channels: int = 3,
) -> nn.Module:
    """MobileNetV2-style network (Sandler et al. 2018) for small images.

    Args:
        settings: Rows ``(expand t, channels c, repeats n, first stride s)``.
        stem: Width of the 3x3 stem conv before the first inverted residual.
        last: Width of the final 1x1 conv.
        num_classes: Outputs of the linear classifier on the pooled final conv.
        in_channels: Channels of the input images (the stem conv's input).

    Returns:
        The MobileNetV2, freshly initialised.
    """
    return MobileNetV2(settings, stem, last, in_channels, num_classes)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2 unit: channel split, one conv branch, concat, channel shuffle."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        branch = cout // 2
        inp = cin if stride > 1 else cin // 2
        if stride > 1:
            self.branch1 = nn.Sequential(
                *_conv_bn(cin, cin, 3, stride, groups=cin),
                *_conv_bn(cin, branch, 1),
                nn.ReLU(),
            )
        self.branch2 = nn.Sequential(
            *_conv_bn(inp, branch, 1),
            nn.ReLU(),
            *_conv_bn(branch, branch, 3, stride, groups=branch),
            *_conv_bn(branch, branch, 1),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Unit output."""
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat([x1, self.branch2(x2)], dim=1)
        else:
            out = torch.cat([self.branch1(x), self.branch2(x)], dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(PooledClassifier):
    """Stem, shuffle stages, 1x1 head conv, pool, classifier."""

    def __init__(
        self,
        widths: Sequence[int],
        repeats: Sequence[int],
        stem: int,
        last: int,
        in_channels: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        stages = [(ShuffleUnit, w, count, 2) for w, count in zip(widths, repeats, strict=True)]
        self.build_stages(in_channels, stem, stages, last, num_classes, nn.ReLU)


def shufflenet(
    widths: Sequence[int] = (48, 96, 192),
    repeats: Sequence[int] = (2, 4, 2),
    stem: int = 24,
    last: int = 512,
    num_classes: int = 10,
    in_channels: int = 3,
) -> nn.Module:
    """ShuffleNetV2-style network (Ma et al. 2018).

    Args:
        widths: Output channels per stage (even).
        repeats: Units per stage; the first of each downsamples.
        stem: Width of the 3x3 stem conv before the first shuffle unit.
        last: Width of the final 1x1 conv.
        num_classes: Outputs of the linear classifier on the pooled final conv.
        in_channels: Channels of the input images (the stem conv's input).

    Returns:
        The ShuffleNetV2, freshly initialised.
    """
    if any(w % 2 for w in widths):
        raise InvalidInputError(f"shufflenet: widths={tuple(widths)} must all be even")
    return ShuffleNetV2(widths, repeats, stem, last, in_channels, num_classes)


class DenseLayer(nn.Module):
    """BN-ReLU-1x1 conv (4 growth) - BN-ReLU-3x3 conv (growth); output concatenated to input."""

    def __init__(self, cin: int, growth: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, 4 * growth, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(4 * growth)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Input with ``growth`` new channels appended."""
        new = self.conv2(self.relu(self.bn2(self.conv1(self.relu(self.bn1(x))))))
        return torch.cat([x, new], dim=1)


class DenseNet(PooledClassifier):
    """DenseNet-BC: stem, dense blocks with transitions, pool, classifier."""

    def __init__(
        self,
        blocks: Sequence[int],
        growth: int,
        stem: int,
        in_channels: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(in_channels, stem, 3, padding=1, bias=False)]
        cin = stem
        for b, count in enumerate(blocks):
            for _ in range(count):
                layers.append(DenseLayer(cin, growth))
                cin += growth
            if b < len(blocks) - 1:
                cout = cin // 2
                layers += [
                    nn.BatchNorm2d(cin),
                    nn.ReLU(),
                    nn.Conv2d(cin, cout, 1, bias=False),
                    nn.AvgPool2d(2),
                ]
                cin = cout
        layers += [nn.BatchNorm2d(cin), nn.ReLU()]
        self.build(layers, nn.Linear(cin, num_classes))


def densenet(
    blocks: Sequence[int] = (6, 6, 6),
    growth: int = 12,
    stem: int = 24,
    num_classes: int = 10,
    in_channels: int = 3,
) -> nn.Module:
    """DenseNet-BC-style network (Huang et al. 2017) with concat growth.

    Args:
        blocks: Dense layers per block.
        growth: Channels each dense layer adds.
        stem: Width of the 3x3 stem conv (the first dense block's input).
        num_classes: Outputs of the linear classifier on the pooled dense features.
        in_channels: Channels of the input images (the stem conv's input).

    Returns:
        The DenseNet, freshly initialised.
    """
    return DenseNet(blocks, growth, stem, in_channels, num_classes)
