"""Token-based zoo models: ViT, MLP-Mixer, a Mamba-style selective SSM, and a plain MLP.

All take images (N, C, H, W). ViT and Mixer cut them into patches; the Mamba
model reads the image row by row (one token per row, ``C * W`` features); the
MLP flattens it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from hpcnb.errors import InvalidInputError
from hpcnb.models.layers import MultiHeadSelfAttention, SelectiveScan, init_weights, pad_causal

__all__ = ["mamba", "mlp", "mlp_mixer", "vit"]


class FeedForward(nn.Module):
    """Linear - GELU - Linear (transformer / mixer MLP)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """MLP over the last axis."""
        return self.fc2(self.act(self.fc1(x)))


class PatchEmbed(nn.Module):
    """Non-overlapping patches by a strided convolution, flattened to tokens (B, N, dim)."""

    def __init__(self, in_channels: int, dim: int, patch: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, patch, patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens of ``x``."""
        return self.proj(x).flatten(2).transpose(1, 2)


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))``."""

    def __init__(self, dim: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = MultiHeadSelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = FeedForward(dim, mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Block output."""
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchClassifier(nn.Module):
    """Base of the patch models: patch embedding, ``blocks``, norm, linear head.

    Args:
        name: Model name for error messages.
        image_size: Square input size.
        patch_size: Square patch size (divides ``image_size``).
        in_channels: Input image channels.
        dim: Token width.
    """

    def __init__(
        self, name: str, image_size: int, patch_size: int, in_channels: int, dim: int
    ) -> None:
        super().__init__()
        if image_size % patch_size:
            raise InvalidInputError(
                f"{name}: image_size={image_size} must be divisible by patch_size={patch_size}"
            )
        self.tokens = (image_size // patch_size) ** 2
        self.patch = PatchEmbed(in_channels, dim, patch_size)

    def build(self, blocks: Sequence[nn.Module], dim: int, num_classes: int) -> None:
        """Set ``blocks``, the final norm and the head, then initialise the weights.

        Args:
            blocks: The token-mixing blocks, input first.
            dim: Token width (of the final norm and the head's input).
            num_classes: Outputs of the head.
        """
        self.blocks = nn.Sequential(*blocks)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        init_weights(self)


class ViT(PatchClassifier):
    """Vision transformer with a class token and learned position embeddings."""

    def __init__(
        self,
        image_size: int,
        patch_size: int,
        in_channels: int,
        dim: int,
        depth: int,
        heads: int,
        mlp_dim: int,
        num_classes: int,
    ) -> None:
        super().__init__("vit", image_size, patch_size, in_channels, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, self.tokens + 1, dim) * 0.02)
        self.build([TransformerBlock(dim, heads, mlp_dim) for _ in range(depth)], dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits."""
        x = self.patch(x)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def vit(
    image_size: int = 8,
    patch_size: int = 2,
    in_channels: int = 1,
    dim: int = 64,
    depth: int = 4,
    heads: int = 4,
    mlp_dim: int = 128,
    num_classes: int = 10,
) -> nn.Module:
    """Vision transformer (Dosovitskiy et al. 2021).

    Args:
        image_size: Side of the square input images (a multiple of ``patch_size``).
        patch_size: Side of the square patches, one token each besides the class token.
        in_channels: Channels of the input images (the patch embedding's input).
        dim: Width of the tokens, the attention and the MLP input.
        depth: Transformer blocks.
        heads: Attention heads (head width ``dim // heads``).
        mlp_dim: Hidden width of each block's MLP.
        num_classes: Outputs of the head on the class token.

    Returns:
        The vision transformer, freshly initialised.
    """
    return ViT(image_size, patch_size, in_channels, dim, depth, heads, mlp_dim, num_classes)


class MixerBlock(nn.Module):
    """Token-mixing MLP over patches, then channel-mixing MLP, each residual."""

    def __init__(self, tokens: int, dim: int, token_hidden: int, channel_hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = FeedForward(tokens, token_hidden)
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = FeedForward(dim, channel_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Block output for tokens ``x`` (B, N, dim)."""
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MLPMixer(PatchClassifier):
    """Patch embedding, mixer blocks, norm, mean over tokens, classifier."""

    def __init__(
        self,
        image_size: int,
        patch_size: int,
        in_channels: int,
        dim: int,
        depth: int,
        token_hidden: int,
        channel_hidden: int,
        num_classes: int,
    ) -> None:
        super().__init__("mlp_mixer", image_size, patch_size, in_channels, dim)
        blocks = [MixerBlock(self.tokens, dim, token_hidden, channel_hidden) for _ in range(depth)]
        self.build(blocks, dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits."""
        x = self.norm(self.blocks(self.patch(x)))
        return self.head(x.mean(dim=1))


def mlp_mixer(
    image_size: int = 8,
    patch_size: int = 2,
    in_channels: int = 1,
    dim: int = 64,
    depth: int = 4,
    token_hidden: int = 32,
    channel_hidden: int = 128,
    num_classes: int = 10,
) -> nn.Module:
    """MLP-Mixer (Tolstikhin et al. 2021).

    Args:
        image_size: Side of the square input images (a multiple of ``patch_size``).
        patch_size: Side of the square patches; their number is the token-mixing width.
        in_channels: Channels of the input images (the patch embedding's input).
        dim: Width of the tokens and of the channel-mixing MLPs' input.
        depth: Mixer blocks.
        token_hidden: Hidden width of the token-mixing MLPs.
        channel_hidden: Hidden width of the channel-mixing MLPs.
        num_classes: Outputs of the head on the mean token.

    Returns:
        The MLP-Mixer, freshly initialised.
    """
    return MLPMixer(
        image_size, patch_size, in_channels, dim, depth, token_hidden, channel_hidden, num_classes
    )


class MambaMixer(nn.Module):
    """Mamba mixer: in-projection, causal depthwise conv, selective scan, gate, out-projection."""

    def __init__(self, dim: int, inner: int, state: int, dt_rank: int, kernel: int) -> None:
        super().__init__()
        self.kernel = kernel
        self.in_proj = nn.Linear(dim, 2 * inner, bias=False)
        self.conv = nn.Conv1d(inner, inner, kernel, groups=inner)
        self.x_proj = nn.Linear(inner, dt_rank + 2 * state, bias=False)
        self.dt_proj = nn.Linear(dt_rank, inner)
        self.scan = SelectiveScan(inner, state)
        self.out_proj = nn.Linear(inner, dim, bias=False)
        self.sizes = (dt_rank, state, state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Mixer output for tokens ``x`` (B, L, dim)."""
        u, z = self.in_proj(x).chunk(2, dim=-1)
        u = self.conv(pad_causal(u.transpose(1, 2), self.kernel)).transpose(1, 2)
        u = F.silu(u)
        dt, b, c = self.x_proj(u).split(list(self.sizes), dim=-1)
        delta = F.softplus(self.dt_proj(dt))
        y = self.scan(u, delta, b, c)
        return self.out_proj(y * F.silu(z))


class MambaBlock(nn.Module):
    """Pre-norm residual block ``x + mixer(ln(x))``."""

    def __init__(self, dim: int, inner: int, state: int, dt_rank: int, kernel: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mixer = MambaMixer(dim, inner, state, dt_rank, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Block output."""
        return x + self.mixer(self.norm(x))


class Mamba(nn.Module):
    """Row tokens -> linear embedding -> Mamba blocks -> norm -> last token -> classifier."""

    def __init__(
        self,
        row_features: int,
        dim: int,
        depth: int,
        state: int,
        expand: int,
        kernel: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        inner = expand * dim
        dt_rank = max(1, -(-dim // 16))
        self.embed = nn.Linear(row_features, dim)
        self.blocks = nn.Sequential(
            *[MambaBlock(dim, inner, state, dt_rank, kernel) for _ in range(depth)]
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for images ``x`` read row by row."""
        tokens = x.permute(0, 2, 1, 3).flatten(2)
        h = self.norm(self.blocks(self.embed(tokens)))
        return self.head(h[:, -1])


def mamba(
    image_size: int = 8,
    in_channels: int = 1,
    dim: int = 32,
    depth: int = 2,
    state: int = 8,
    expand: int = 2,
    kernel: int = 4,
    num_classes: int = 10,
) -> nn.Module:
    """Mamba-style selective state-space classifier (Gu and Dao 2023), pure-PyTorch scan.

    Args:
        image_size: Side of the square input images (each row becomes a token).
        in_channels: Channels of the input images (``in_channels * image_size`` features a row).
        dim: Model width.
        depth: Mamba blocks.
        state: SSM state size N.
        expand: Inner width factor (inner = expand * dim).
        kernel: Causal depthwise conv width.
        num_classes: Outputs of the head on the last token.

    Returns:
        The Mamba classifier, freshly initialised.
    """
    return Mamba(in_channels * image_size, dim, depth, state, expand, kernel, num_classes)


class MLP(nn.Module):
    """Flatten, then Linear-ReLU layers, then a linear classifier."""

    def __init__(self, in_features: int, hidden: Sequence[int], num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = in_features
        for width in hidden:
            layers += [nn.Linear(cin, width), nn.ReLU()]
            cin = width
        layers.append(nn.Linear(cin, num_classes))
        self.net = nn.Sequential(*layers)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits."""
        return self.net(torch.flatten(x, 1))


def mlp(
    image_size: int = 8,
    in_channels: int = 1,
    hidden: Sequence[int] = (256, 128),
    num_classes: int = 10,
) -> nn.Module:
    """Plain multi-layer perceptron on flattened images.

    Args:
        image_size: Side of the square input images (flattened with the channels).
        in_channels: Channels of the input images.
        hidden: Hidden layer widths.
        num_classes: Outputs of the last linear layer.

    Returns:
        The MLP, freshly initialised.
    """
    return MLP(in_channels * image_size * image_size, hidden, num_classes)
