"""The model zoo: every family at a ``tiny`` and a ``default`` size.

``tiny`` models take the 8x8 single-channel sklearn digits (N, 1, 8, 8) and are
small enough for unit tests; ``default`` models take 32x32x3 images (CIFAR-like).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from hpcnb.errors import InvalidInputError
from hpcnb.models.cnn import densenet, mobilenet_v2, resnet_cifar, shufflenet, vgg
from hpcnb.models.sequence import mamba, mlp, mlp_mixer, vit

__all__ = ["SIZES", "ZOO", "ModelSpec", "describe"]

SIZES = ("tiny", "default")
_IMAGE = {"tiny": (1, 8), "default": (3, 32)}


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise InvalidInputError(f"size={size!r}: expected one of {SIZES}")


@dataclass(frozen=True)
class ModelSpec:
    """One zoo entry.

    Attributes:
        name: Zoo key.
        family: Architecture family ("cnn", "transformer", "mixer", "ssm", "mlp").
        factory: ``factory(size, num_classes, in_channels, image_size) -> nn.Module``.
    """

    name: str
    family: str
    factory: Callable[[str, int, int, int], nn.Module]

    def build(
        self, size: str = "tiny", num_classes: int = 10, in_channels: int | None = None
    ) -> nn.Module:
        """Build the model at ``size`` ("tiny": 1x8x8 input, "default": 3x32x32 input).

        Args:
            size: "tiny" or "default".
            num_classes: Classifier outputs.
            in_channels: Input channels; the size's default when None.

        Returns:
            A freshly initialised model in eval mode.
        """
        _check_size(size)
        channels, image = _IMAGE[size]
        model = self.factory(size, num_classes, in_channels or channels, image)
        return model.eval()

    def example_input(
        self, size: str = "tiny", batch: int = 2, in_channels: int | None = None, seed: int = 0
    ) -> torch.Tensor:
        """A random image batch (batch, C, H, W) matching :meth:`build` at ``size``.

        Args:
            size: "tiny" or "default".
            batch: Batch size.
            in_channels: Input channels; the size's default when None.
            seed: RNG seed.

        Returns:
            The input tensor.
        """
        _check_size(size)
        channels, image = _IMAGE[size]
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(batch, in_channels or channels, image, image, generator=gen)


def _resnet(size: str, k: int, c: int, image: int) -> nn.Module:
    return resnet_cifar(8, 8, k, c) if size == "tiny" else resnet_cifar(20, 16, k, c)


def _vgg(size: str, k: int, c: int, image: int) -> nn.Module:
    if size == "tiny":
        return vgg((8, "M", 16, "M", 16), 16, k, c)
    return vgg(num_classes=k, in_channels=c)


def _mobilenet(size: str, k: int, c: int, image: int) -> nn.Module:
    if size == "tiny":
        return mobilenet_v2(((1, 8, 1, 1), (4, 12, 2, 2), (4, 16, 1, 2)), 8, 32, k, c)
    return mobilenet_v2(num_classes=k, in_channels=c)


def _shufflenet(size: str, k: int, c: int, image: int) -> nn.Module:
    if size == "tiny":
        return shufflenet((16, 32), (2, 2), 8, 32, k, c)
    return shufflenet(num_classes=k, in_channels=c)


def _vit(size: str, k: int, c: int, image: int) -> nn.Module:
    if size == "tiny":
        return vit(image, 2, c, 32, 2, 4, 64, k)
    return vit(image, 4, c, 128, 6, 4, 256, k)


def _mixer(size: str, k: int, c: int, image: int) -> nn.Module:
    if size == "tiny":
        return mlp_mixer(image, 2, c, 32, 2, 16, 64, k)
    return mlp_mixer(image, 4, c, 128, 6, 64, 256, k)


def _mamba(size: str, k: int, c: int, image: int) -> nn.Module:
    if size == "tiny":
        return mamba(image, c, 16, 2, 4, 2, 3, k)
    return mamba(image, c, 64, 4, 8, 2, 4, k)


def _mlp(size: str, k: int, c: int, image: int) -> nn.Module:
    if size == "tiny":
        return mlp(image, c, (64, 32), k)
    return mlp(image, c, (512, 256, 128), k)


def _densenet(size: str, k: int, c: int, image: int) -> nn.Module:
    if size == "tiny":
        return densenet((2, 2), 4, 8, k, c)
    return densenet(num_classes=k, in_channels=c)


ZOO: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("resnet", "cnn", _resnet),
        ModelSpec("vgg", "cnn", _vgg),
        ModelSpec("mobilenet_v2", "cnn", _mobilenet),
        ModelSpec("shufflenet", "cnn", _shufflenet),
        ModelSpec("vit", "transformer", _vit),
        ModelSpec("mlp_mixer", "mixer", _mixer),
        ModelSpec("mamba", "ssm", _mamba),
        ModelSpec("mlp", "mlp", _mlp),
        ModelSpec("densenet", "cnn", _densenet),
    )
}


def describe(size: str = "tiny", num_classes: int = 10) -> list[dict[str, object]]:
    """One row per zoo model at ``size``: name, family, parameters, input and output shape.

    Args:
        size: "tiny" or "default".
        num_classes: Classifier outputs.

    Returns:
        Rows ready for ``pandas.DataFrame``.
    """
    rows: list[dict[str, object]] = []
    for spec in ZOO.values():
        model = spec.build(size, num_classes)
        x = spec.example_input(size, batch=1)
        with torch.no_grad():
            y = model(x)
        rows.append(
            {
                "name": spec.name,
                "family": spec.family,
                "params": sum(p.numel() for p in model.parameters()),
                "input": tuple(x.shape),
                "output": tuple(y.shape),
            }
        )
    return rows
