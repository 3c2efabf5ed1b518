"""Model zoo: our own compact definitions of common architectures (no torchvision).

``ZOO`` maps a name to a :class:`ModelSpec` with ``build(size)`` and
``example_input(size, batch)``; the factory functions build any size.

>>> from hpcnb import models
>>> spec = models.ZOO["resnet"]
>>> spec.build("tiny")(spec.example_input("tiny", batch=3)).shape
torch.Size([3, 10])
"""

from hpcnb.models.cnn import densenet, mobilenet_v2, resnet50_like, resnet_cifar, shufflenet, vgg
from hpcnb.models.layers import ChannelShuffle, MultiHeadSelfAttention, SelectiveScan
from hpcnb.models.sequence import mamba, mlp, mlp_mixer, vit
from hpcnb.models.zoo import SIZES, ZOO, ModelSpec, describe

__all__ = [
    # the zoo: every family at a "tiny" and a "default" size
    "SIZES",
    "ZOO",
    "ModelSpec",
    "describe",
    # factories of any size
    "densenet",
    "mamba",
    "mlp",
    "mlp_mixer",
    "mobilenet_v2",
    "resnet50_like",
    "resnet_cifar",
    "shufflenet",
    "vgg",
    "vit",
    # layers: two IR leaf operators and a channel shuffle
    "ChannelShuffle",
    "MultiHeadSelfAttention",
    "SelectiveScan",
]
