"""A Llama-architecture decoder with a KV cache keyed by sequence id.

The decoder follows the Llama recipe that SmolLM2 uses: token embeddings, ``n_layers``
blocks of RMSNorm → grouped-query attention with rotary position embeddings (RoPE) →
residual → RMSNorm → SwiGLU feed-forward → residual, a final RMSNorm and a language-model
head (tied to the embeddings when the file has no ``output.weight``).

Weights follow the GGUF layout: ``W`` has shape ``(out, in)`` and ``y = x @ W.T``; the
query/key projections are stored in the order llama.cpp's "normal" RoPE expects, which
rotates adjacent pairs ``(x[2i], x[2i+1])``.

A :class:`LlamaModel` may hold only a contiguous slice of the layers (one pipeline
stage); :meth:`LlamaModel.run_layers` runs the slice it holds. The :class:`KVCache`
stores keys and values per sequence id and supports the llama.cpp-style edits that
speculative decoding needs: copy a sequence (optionally a prefix), truncate, remove.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from hpcnb.errors import InvalidInputError, InvalidStateError, UnknownNameError

__all__ = ["KVCache", "LayerWeights", "LlamaConfig", "LlamaModel", "tiny_config"]


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama decoder.

    Attributes:
        n_layers: Number of transformer blocks.
        dim: Hidden size.
        ffn_dim: Inner size of the SwiGLU feed-forward.
        n_heads: Query heads.
        n_kv_heads: Key/value heads (grouped-query attention when < ``n_heads``).
        vocab_size: Vocabulary size.
        rope_base: RoPE frequency base.
        norm_eps: RMSNorm epsilon.
        context_length: Maximum sequence length.
    """

    n_layers: int
    dim: int
    ffn_dim: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    context_length: int = 2048

    def __post_init__(self) -> None:
        """Check that the shape is consistent.

        Raises:
            InvalidInputError: A size is not positive, or the heads do not divide the
                width (or the key/value heads the heads), or a head's size is odd.
        """
        for name in ("n_layers", "dim", "ffn_dim", "n_heads", "n_kv_heads", "vocab_size"):
            if int(getattr(self, name)) <= 0:
                raise InvalidInputError(
                    f"LlamaConfig.{name} must be > 0, got {getattr(self, name)}"
                )
        if self.dim % self.n_heads:
            raise InvalidInputError(
                f"LlamaConfig.dim={self.dim} not divisible by n_heads={self.n_heads}"
            )
        if self.n_heads % self.n_kv_heads:
            raise InvalidInputError(
                f"LlamaConfig.n_heads={self.n_heads} not divisible by n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise InvalidInputError(f"LlamaConfig head_dim={self.head_dim} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        """Size of one attention head."""
        return self.dim // self.n_heads

    def n_params(self) -> int:
        """Number of parameters (tied embeddings counted once)."""
        hd = self.head_dim
        attn = self.dim * self.dim * 2 + self.dim * self.n_kv_heads * hd * 2
        ffn = 3 * self.dim * self.ffn_dim
        return self.n_layers * (attn + ffn + 2 * self.dim) + self.vocab_size * self.dim + self.dim


def tiny_config(n_layers: int = 4, vocab_size: int = 96) -> LlamaConfig:
    """Return a tiny Llama shape for tests and SMOKE runs (no model file needed).

    Args:
        n_layers: Transformer blocks.
        vocab_size: Tokens of the vocabulary.
    """
    return LlamaConfig(
        n_layers=n_layers,
        dim=64,
        ffn_dim=128,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=vocab_size,
        rope_base=10000.0,
        norm_eps=1e-5,
        context_length=512,
    )


@dataclass
class LayerWeights:
    """Weights of one transformer block (all float32, ``(out, in)`` layout)."""

    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    ffn_norm: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor


@dataclass
class KVCache:
    """Keys and values per sequence id and layer.

    Each sequence holds, for every layer this cache serves, a key and a value tensor of
    shape ``(n_kv_heads, length, head_dim)``. Tensors are never modified in place
    (appending builds a new tensor), so :meth:`copy` can share them.
    """

    layers: tuple[int, ...]
    _store: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)

    def seq_ids(self) -> list[int]:
        """Return the sequence ids present, sorted."""
        return sorted(self._store)

    def has(self, seq: int) -> bool:
        """Return whether sequence ``seq`` exists."""
        return seq in self._store

    def length(self, seq: int) -> int:
        """Return the number of positions cached for ``seq`` (0 when absent)."""
        entry = self._store.get(seq)
        if not entry:
            return 0
        return int(next(iter(entry.values()))[0].shape[1])

    def get(self, seq: int, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Return ``(k, v)`` of ``seq`` at ``layer`` or ``None``.

        Args:
            seq: The sequence id.
            layer: The global layer index.
        """
        return self._store.get(seq, {}).get(layer)

    def put(self, seq: int, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the full ``(k, v)`` of ``seq`` at ``layer``.

        Args:
            seq: The sequence id.
            layer: The global layer index (one this cache serves).
            k: Keys of every position, ``(n_kv_heads, length, head_dim)``.
            v: Values of every position, of the same shape.

        Raises:
            UnknownNameError: The cache does not serve ``layer``.
        """
        if layer not in self.layers:
            raise UnknownNameError(f"KVCache serves layers {self.layers}, not layer {layer}")
        self._store.setdefault(seq, {})[layer] = (k, v)

    def copy(self, src: int, dst: int, length: int | None = None) -> None:
        """Make ``dst`` a copy of the first ``length`` positions of ``src`` (all if None).

        Args:
            src: The sequence copied.
            dst: The sequence replaced by the copy.
            length: Positions copied (``None``: all of them).

        Raises:
            UnknownNameError: ``src`` does not exist (unless ``length`` is 0).
            InvalidInputError: ``length`` exceeds the length of ``src``.
        """
        if length == 0:
            self._store[dst] = {}
            return
        if src not in self._store:
            raise UnknownNameError(f"KVCache.copy: source sequence {src} does not exist")
        n = self.length(src)
        if length is None:
            length = n
        if length > n:
            raise InvalidInputError(f"KVCache.copy: length {length} > length {n} of sequence {src}")
        self._store[dst] = {
            layer: (k[:, :length], v[:, :length]) for layer, (k, v) in self._store[src].items()
        }

    def truncate(self, seq: int, length: int) -> None:
        """Keep the first ``length`` positions of ``seq`` (no-op when it is shorter).

        Args:
            seq: The sequence id.
            length: Positions kept (>= 0).

        Raises:
            UnknownNameError: ``seq`` does not exist.
            InvalidInputError: ``length`` is negative.
        """
        if seq not in self._store:
            raise UnknownNameError(f"KVCache.truncate: sequence {seq} does not exist")
        if length < 0:
            raise InvalidInputError(f"KVCache.truncate: length must be >= 0, got {length}")
        self._store[seq] = {
            layer: (k[:, :length], v[:, :length]) for layer, (k, v) in self._store[seq].items()
        }

    def remove(self, seq: int) -> None:
        """Drop sequence ``seq`` (no error when it is absent)."""
        self._store.pop(seq, None)

    def clear(self) -> None:
        """Drop every sequence."""
        self._store.clear()


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate adjacent pairs of ``x`` (``(heads, m, head_dim)``) by position."""
    hd = x.shape[-1]
    inv = base ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    ang = positions.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang), torch.sin(ang)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


class LlamaModel:
    """A Llama decoder, or a contiguous slice of its layers (one pipeline stage).

    Args:
        config: The shape.
        layers: Weights per global layer index held by this instance.
        embedding: ``(vocab, dim)`` token embeddings (needed to embed and, when tied, for
            the head); ``None`` on stages that need neither.
        norm: Final RMSNorm weight, ``None`` where the head is not run.
        output: ``(vocab, dim)`` head; ``None`` means tied to ``embedding``.
    """

    def __init__(
        self,
        config: LlamaConfig,
        layers: dict[int, LayerWeights],
        embedding: torch.Tensor | None = None,
        norm: torch.Tensor | None = None,
        output: torch.Tensor | None = None,
    ) -> None:
        self.config = config
        self.layers = dict(sorted(layers.items()))
        self.embedding = embedding
        self.norm = norm
        self.output = output

    @classmethod
    def random(cls, config: LlamaConfig, seed: int = 0, scale: float = 1.0) -> LlamaModel:
        """Return a model with random weights (deterministic in ``seed``).

        Args:
            config: The shape.
            seed: Seed of the weights.
            scale: Scale of the projection weights (1: unit-variance outputs).
        """
        g = torch.Generator().manual_seed(seed)
        d, f, hd = config.dim, config.ffn_dim, config.head_dim

        def w(out: int, inp: int) -> torch.Tensor:
            return torch.randn(out, inp, generator=g) * (scale / inp**0.5)

        layers = {
            i: LayerWeights(
                attn_norm=1.0 + 0.1 * torch.randn(d, generator=g),
                wq=w(d, d),
                wk=w(config.n_kv_heads * hd, d),
                wv=w(config.n_kv_heads * hd, d),
                wo=w(d, d),
                ffn_norm=1.0 + 0.1 * torch.randn(d, generator=g),
                w_gate=w(f, d),
                w_up=w(f, d),
                w_down=w(d, f),
            )
            for i in range(config.n_layers)
        }
        emb = torch.randn(config.vocab_size, d, generator=g)
        out = torch.randn(config.vocab_size, d, generator=g) * 2.0
        return cls(config, layers, emb, torch.ones(d), out)

    def slice(self, start: int, end: int, *, embed: bool, head: bool) -> LlamaModel:
        """Return a model holding layers ``[start, end)`` only (a pipeline stage).

        Args:
            start: First global layer index.
            end: One past the last.
            embed: Keep the token embeddings.
            head: Keep the final norm and head (and the embeddings when the head is tied).

        Raises:
            InvalidInputError: This model does not hold a layer of the slice.
        """
        missing = [i for i in range(start, end) if i not in self.layers]
        if missing:
            raise InvalidInputError(
                f"LlamaModel.slice: layers {missing} are not held by this model"
            )
        return LlamaModel(
            self.config,
            {i: self.layers[i] for i in range(start, end)},
            self.embedding if (embed or (head and self.output is None)) else None,
            self.norm if head else None,
            self.output if head else None,
        )

    def new_cache(self, layers: Sequence[int] | None = None) -> KVCache:
        """Return an empty cache for the layers this model holds (or those given)."""
        return KVCache(tuple(self.layers if layers is None else layers))

    # -- pieces ---------------------------------------------------------------------------

    def embed(self, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Return ``(m, dim)`` embeddings of ``tokens``.

        Raises:
            InvalidStateError: This slice holds no embeddings.
            InvalidInputError: A token id is outside the vocabulary.
        """
        if self.embedding is None:
            raise InvalidStateError("this model slice holds no token embeddings")
        ids = torch.as_tensor(tokens, dtype=torch.long)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise InvalidInputError(
                f"token ids must lie in [0, {self.config.vocab_size}), got {tokens}"
            )
        return self.embedding[ids]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Return ``(m, vocab)`` logits of final hidden states ``h``.

        Raises:
            InvalidStateError: This slice holds no final norm or head.
        """
        if self.norm is None:
            raise InvalidStateError("this model slice holds no final norm / head")
        head = self.output if self.output is not None else self.embedding
        if head is None:
            raise InvalidStateError("this model slice holds no output head")
        return _rms_norm(h, self.norm, self.config.norm_eps) @ head.T

    def _block(self, i: int, h: torch.Tensor, seq: int, cache: KVCache | None) -> torch.Tensor:
        c, L = self.config, self.layers[i]
        m, hd = h.shape[0], c.head_dim
        x = _rms_norm(h, L.attn_norm, c.norm_eps)
        q = (x @ L.wq.T).view(m, c.n_heads, hd).transpose(0, 1)
        k = (x @ L.wk.T).view(m, c.n_kv_heads, hd).transpose(0, 1)
        v = (x @ L.wv.T).view(m, c.n_kv_heads, hd).transpose(0, 1)
        past = cache.get(seq, i) if cache is not None else None
        p = 0 if past is None else int(past[0].shape[1])
        pos = torch.arange(p, p + m)
        q, k = _rope(q, pos, c.rope_base), _rope(k, pos, c.rope_base)
        if past is not None:
            k = torch.cat([past[0], k], dim=1)
            v = torch.cat([past[1], v], dim=1)
        if cache is not None:
            cache.put(seq, i, k, v)
        rep = c.n_heads // c.n_kv_heads
        kk = k.repeat_interleave(rep, dim=0)
        vv = v.repeat_interleave(rep, dim=0)
        mask = torch.arange(p + m)[None, :] <= (pos[:, None])
        att = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
        h = h + att.transpose(0, 1).reshape(m, c.dim) @ L.wo.T
        x = _rms_norm(h, L.ffn_norm, c.norm_eps)
        return h + (F.silu(x @ L.w_gate.T) * (x @ L.w_up.T)) @ L.w_down.T

    @torch.no_grad()
    def run_layers(
        self,
        h: torch.Tensor,
        seq: int = 0,
        cache: KVCache | None = None,
        start: int | None = None,
        end: int | None = None,
    ) -> torch.Tensor:
        """Run layers ``[start, end)`` (default: all held) on hidden states ``h``.

        With a cache, the new positions follow those cached for ``seq`` and their keys and
        values are appended; without one, ``h`` is the whole sequence from position 0.

        Args:
            h: ``(m, dim)`` hidden states of ``m`` new positions.
            seq: The sequence id in ``cache``.
            cache: Keys and values of earlier positions (``None``: no earlier positions).
            start: First layer (default: the first held).
            end: One past the last layer (default: one past the last held).

        Raises:
            InvalidInputError: A layer of the range is not held by this slice.
        """
        held = list(self.layers)
        lo = held[0] if start is None else start
        hi = held[-1] + 1 if end is None else end
        for i in range(lo, hi):
            if i not in self.layers:
                raise InvalidInputError(f"layer {i} is not held by this model slice ({held})")
            h = self._block(i, h, seq, cache)
        return h

    @torch.no_grad()
    def forward(
        self, tokens: Sequence[int], seq: int = 0, cache: KVCache | None = None
    ) -> torch.Tensor:
        """Run the whole model on ``tokens`` and return ``(m, vocab)`` logits.

        Args:
            tokens: Token ids of the new positions.
            seq: The sequence id in ``cache``.
            cache: Keys and values of earlier positions (``None``: ``tokens`` start at 0).
        """
        return self.logits(self.run_layers(self.embed(tokens), seq, cache))

    @torch.no_grad()
    def greedy(self, prompt: Sequence[int], n_new: int, *, use_cache: bool = True) -> list[int]:
        """Return ``n_new`` greedy tokens after ``prompt`` (with or without the KV cache).

        Args:
            prompt: Prompt token ids (at least one).
            n_new: Tokens to generate.
            use_cache: Feed only the new token each step (``False``: recompute the whole
                sequence, a check of the cache).

        Raises:
            InvalidInputError: The prompt is empty.
        """
        if not prompt:
            raise InvalidInputError("greedy: the prompt must hold at least one token")
        tokens = list(prompt)
        cache = self.new_cache() if use_cache else None
        pending = list(tokens)
        for _ in range(n_new):
            if cache is not None:
                logits = self.forward(pending, 0, cache)
            else:
                logits = self.forward(tokens, 0, None)
            nxt = int(torch.argmax(logits[-1]))
            tokens.append(nxt)
            pending = [nxt]
        return tokens[len(prompt) :]
