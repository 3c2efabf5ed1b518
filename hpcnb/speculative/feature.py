"""A feature-level draft head: a draft that reads the target's own last hidden state.

Our design, after EAGLE (Li et al., ICML 2024) and its "training-time test" (EAGLE-3,
2025): instead of a separate small language model, the draft is one Llama block at the
target's width that reads the target's final hidden state (its *feature*, before the final
norm) at position ``t`` together with the embedding of token ``t + 1`` and predicts the
feature at ``t + 1``; the target's own final norm and (frozen, tied) output rows, restricted
to a draft vocabulary of the tokens the target chooses most often, turn that prediction into
token ``t + 2``. Chained drafts feed the head's predicted features back in. This module
trains and stores the head; :mod:`hpcnb.speculative.feature_draft` drafts with it, and
:mod:`hpcnb.speculative.features` extracts what it learns from.

* :func:`train_feature_draft` — train the head on teacher-forced target features: smooth-L1
  loss on the next feature (scaled by the features' RMS) plus a soft cross-entropy against
  the target's distribution, uniform noise on the input features, and ``unroll`` passes in
  which the head reads its own predicted features (each unrolled row attends to the
  true-feature rows before it and to itself, as at drafting time).
* :func:`teacher_forced_accuracy` — the fast check before any MPI run: how often the head's
  first draft token equals the target's choice, given true features, in one batched pass.

The cache of trained heads is :mod:`hpcnb.speculative.feature_cache`.

Example (a tiny random target; a second of training):
    >>> from hpcnb.speculative.model import LlamaModel, tiny_config
    >>> target = LlamaModel.random(tiny_config(n_layers=2, vocab_size=48), seed=1)
    >>> seqs = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 8, 7, 6, 5, 4]]
    >>> trained = train_feature_draft(target, seqs, FeatureDraftSettings(vocab=48, steps=3))
    >>> data = extract_features(target, seqs)
    >>> hits, rows = teacher_forced_accuracy(trained.head, target, data)
    >>> rows, len(trained.meta["loss"])
    (12, 3)
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from hpcnb.speculative.distill import (
    DistillError,
    _final,
    _rms,
    block_qkv,
    block_rest,
)
from hpcnb.speculative.features import SequenceFeatures, extract_features
from hpcnb.speculative.model import LayerWeights, LlamaConfig, LlamaModel

__all__ = [
    "FeatureDraftSettings",
    "FeatureHead",
    "TrainedFeatureDraft",
    "initial_head",
    "teacher_forced_accuracy",
    "train_feature_draft",
]


@dataclass(frozen=True)
class FeatureDraftSettings:
    """How the feature draft is trained (part of the cache key).

    Attributes:
        vocab: Rows of the draft's output: the tokens the target chose most often in the
            training data (the draft can never propose another token).
        steps: Optimiser steps.
        batch: Sequences per step.
        lr: Peak AdamW learning rate (linear warm-up over 5 % of the steps, cosine decay).
        unroll: Passes per step: 1 trains on true input features only; each further pass
            feeds the previous pass's predicted features back in (chained drafts).
        unroll_decay: Weight of the ``i``-th unrolled pass's loss is ``unroll_decay**i``.
        feature_weight: Weight of the smooth-L1 loss on the next feature.
        ce_weight: Weight of the soft cross-entropy against the target's distribution.
        noise: Uniform noise on input features, as a fraction of their RMS (peak to peak).
        top_k: Target probabilities kept per position (the soft labels).
        max_len: Longest training sequence (longer ones are cut).
        bf16: Run the training's matrix products in bfloat16 (autocast; weights, losses
            and the optimiser stay float32), about 3x faster on CPUs with bfloat16 units.
        train_block: Train the block's projections (``False``: only the input projection
            and the block's norms learn; the block stays the target's last layer).
        seed: Seed of the initial weights, the noise and the batch order.
    """

    vocab: int = 8192
    steps: int = 600
    batch: int = 16
    lr: float = 1e-3
    unroll: int = 2
    unroll_decay: float = 0.8
    feature_weight: float = 1.0
    ce_weight: float = 0.1
    noise: float = 0.2
    top_k: int = 8
    max_len: int = 384
    bf16: bool = True
    train_block: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        """Check the values.

        Raises:
            DistillError: A count below 1, a non-positive rate or a negative weight.
        """
        for name in ("vocab", "steps", "batch", "unroll", "top_k", "max_len"):
            if int(getattr(self, name)) < 1:
                raise DistillError(
                    f"FeatureDraftSettings.{name} must be >= 1, got {getattr(self, name)}"
                )
        if not self.lr > 0:
            raise DistillError(f"FeatureDraftSettings.lr must be > 0, got {self.lr}")
        for name in ("unroll_decay", "feature_weight", "ce_weight", "noise"):
            if float(getattr(self, name)) < 0:
                raise DistillError(
                    f"FeatureDraftSettings.{name} must be >= 0, got {getattr(self, name)}"
                )


# -- the head -------------------------------------------------------------------------------


@dataclass
class FeatureHead:
    """The trained weights of a feature draft.

    The target's embeddings, final norm and output rows are not part of it: they are the
    target's own, frozen.

    Attributes:
        config: The target's shape (the block has the target's width and heads).
        fc: ``(dim, 2 dim)`` projection of ``[embedding of token t+1, feature t]``.
        fc_bias: ``(dim,)``.
        layer: The block's weights.
        vocab: Token id of each output row (rows of the target's output head).
        scale: RMS of the training features (scales the feature loss and the noise).
    """

    config: LlamaConfig
    fc: torch.Tensor
    fc_bias: torch.Tensor
    layer: LayerWeights
    vocab: list[int]
    scale: float

    def tensors(self) -> dict[str, torch.Tensor]:
        """The trained tensors by name (``fc``, ``fc_bias``, ``layer.{field}``)."""
        out = {"fc": self.fc, "fc_bias": self.fc_bias}
        for f in dataclasses.fields(LayerWeights):
            out[f"layer.{f.name}"] = getattr(self.layer, f.name)
        return out

    def project(
        self, embedding: torch.Tensor, feats: torch.Tensor, nxt: torch.Tensor
    ) -> torch.Tensor:
        """Return the block's input ``fc([E[token t+1], feature t]) + bias``.

        Args:
            embedding: The target's ``(vocab, dim)`` token embeddings.
            feats: ``(..., dim)`` features at ``t``.
            nxt: ``(...)`` token ids at ``t + 1``.
        """
        return torch.cat([embedding[nxt], feats], dim=-1) @ self.fc.T + self.fc_bias

    def forward(
        self,
        embedding: torch.Tensor,
        feats: torch.Tensor,
        nxt: torch.Tensor,
        pos: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Predicted next features of a batch of rows (differentiable).

        Args:
            embedding: The target's token embeddings.
            feats: ``(B, T, dim)`` input features (true or predicted).
            nxt: ``(B, T)`` tokens at ``t + 1``.
            pos: ``(B, T)`` positions ``t``.
            past: Keys and values of a previous pass over the same rows: row ``t`` then
                attends to that pass's rows ``< t`` and to itself (an unrolled pass);
                ``None``: causal attention over this pass's rows.

        Returns:
            ``(B, T, dim)`` predicted features at ``t + 1``, and this pass's keys and values.
        """
        c = self.config
        z = self.project(embedding, feats, nxt)
        q, k, v = block_qkv(c, self.layer, z, pos)
        rep = c.n_heads // c.n_kv_heads
        if past is None:
            kk, vv, mask, causal = k, v, None, True
        else:
            T = z.shape[1]
            kk, vv = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            eye = torch.eye(T, dtype=torch.bool)
            mask = torch.cat([torch.ones(T, T, dtype=torch.bool).tril(-1), eye], dim=1)
            causal = False
        att = F.scaled_dot_product_attention(
            q,
            kk.repeat_interleave(rep, dim=1),
            vv.repeat_interleave(rep, dim=1),
            attn_mask=mask,
            is_causal=causal,
        )
        return block_rest(c, self.layer, z, att), (k, v)


@dataclass
class TrainedFeatureDraft:
    """A trained feature head and how it was made.

    Attributes:
        head: The head.
        meta: Settings, key, loss per step, seconds (``extract_s``, ``train_s``), training
            positions (``tokens``), ``vocab_coverage`` and, after a cache look-up,
            ``cached`` and ``path``.
    """

    head: FeatureHead
    meta: dict[str, Any]


def initial_head(
    target: LlamaModel, vocab: Sequence[int], scale: float, seed: int = 0
) -> FeatureHead:
    """Return an untrained head: where training starts, and a baseline for the trained one.

    The block is a copy of the target's last layer; the projection passes the feature
    through, plus a little noise so that the embedding half starts to learn.

    Args:
        target: The complete target model.
        vocab: Token ids of the output rows.
        scale: RMS of the features.
        seed: Seed of the noise.
    """
    vocab = [int(t) for t in vocab]
    c = target.config
    g = torch.Generator().manual_seed(seed)
    last = target.layers[max(target.layers)]
    layer = LayerWeights(**{k: v.clone() for k, v in last.__dict__.items()})
    d = c.dim
    fc = torch.zeros(d, 2 * d)
    fc[:, d:] = torch.eye(d)
    fc += torch.randn(d, 2 * d, generator=g) * (0.5 / math.sqrt(2 * d))
    cfg = dataclasses.replace(c, n_layers=1)
    return FeatureHead(cfg, fc, torch.zeros(d), layer, vocab, scale)


def _draft_vocab(data: Sequence[SequenceFeatures], limit: int) -> list[int]:
    """The ``limit`` tokens most often chosen by the target in ``data`` (ties: lower id)."""
    counts: dict[int, int] = {}
    for x in data:
        for t in x.top_ids[:, 0].tolist():
            counts[t] = counts.get(t, 0) + 1
    return sorted(sorted(counts), key=lambda t: -counts[t])[:limit]


def _epoch(data: Sequence[SequenceFeatures], batch: int, rng: random.Random) -> list[list[int]]:
    """One epoch of batches, each of sequences of similar lengths, in shuffled order.

    The sequences are shuffled, sorted by length within chunks of 8 batches and cut into
    batches.
    """
    order = list(range(len(data)))
    rng.shuffle(order)
    size = min(batch, len(data))
    out: list[list[int]] = []
    chunk = 8 * size
    for c in range(0, len(order), chunk):
        part = sorted(order[c : c + chunk], key=lambda i: len(data[i].tokens))
        out.extend(part[j : j + size] for j in range(0, len(part), size))
    rng.shuffle(out)
    return out


def _pad(t: torch.Tensor, n: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros((n - t.shape[0], *t.shape[1:]))]) if t.shape[0] < n else t


def _rows(
    data: Sequence[SequenceFeatures], pick: Sequence[int], max_len: int
) -> dict[str, torch.Tensor]:
    """Training rows of the sequences ``pick``: row ``t`` reads feature ``t`` and token ``t+1``."""
    T = min(max(len(data[i].tokens) for i in pick), max_len) - 1
    cut = [(data[i], min(len(data[i].tokens), max_len)) for i in pick]
    return {
        "feats": torch.stack([_pad(x.features[: n - 1], T) for x, n in cut]),
        "nxt": torch.stack([_pad(x.tokens[1:n], T) for x, n in cut]),
        "target": torch.stack([_pad(x.features[1:n], T) for x, n in cut]),
        "top_p": torch.stack([_pad(x.top_p[1:n], T) for x, n in cut]),
        "top_ids": torch.stack([_pad(x.top_ids[1:n], T) for x, n in cut]),
        "valid": torch.stack([_pad(torch.ones(n - 1), T) for _, n in cut]),
    }


def _losses(
    head: FeatureHead,
    norm: torch.Tensor,
    out_rows: torch.Tensor,
    index: torch.Tensor,
    out: torch.Tensor,
    b: dict[str, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Feature loss, soft cross-entropy and top-1 agreement of predicted features ``out``."""
    valid = b["valid"]
    n = valid.sum().clamp_min(1.0)
    fl = F.smooth_l1_loss(out / head.scale, b["target"] / head.scale, reduction="none")
    feat_loss = (fl.mean(-1) * valid).sum() / n
    logp = torch.log_softmax(_rms(out, norm, head.config.norm_eps) @ out_rows.T, dim=-1)
    rows = index[b["top_ids"]]  # draft-vocabulary row of each target choice, -1 outside
    w = b["top_p"] * (rows >= 0)
    w = w / w.sum(-1, keepdim=True).clamp_min(1e-9)
    ce = -(torch.gather(logp, -1, rows.clamp_min(0)) * w).sum(-1)
    ce_loss = (ce * valid).sum() / n
    agree = ((logp.argmax(-1) == rows[..., 0]).float() * valid).sum() / n
    return feat_loss, ce_loss, agree


def _row_index(vocab: Sequence[int], size: int) -> torch.Tensor:
    """Output row of every token id (-1 for tokens outside the draft vocabulary)."""
    index = torch.full((size,), -1, dtype=torch.long)
    index[torch.as_tensor(list(vocab))] = torch.arange(len(vocab))
    return index


_BLOCK_PROJECTIONS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def _step_loss(
    head: FeatureHead,
    s: FeatureDraftSettings,
    embedding: torch.Tensor,
    norm: torch.Tensor,
    out_rows: torch.Tensor,
    index: torch.Tensor,
    b: dict[str, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss of one batch over ``s.unroll`` passes, and the first pass's top-1 agreement.

    Pass ``i`` reads, at row ``t``, the prediction of row ``t - 1`` of pass ``i - 1`` (row
    0 keeps its true feature) and attends to the first pass's rows before it and to itself.
    """
    B, T = b["nxt"].shape
    pos = torch.arange(T)[None, :].expand(B, T)
    feats = b["feats"]
    loss = torch.zeros(())
    past = None
    agree = torch.zeros(())
    for i in range(s.unroll):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=s.bf16):
            out, kv = head.forward(embedding, feats, b["nxt"], pos, past)
            out = out.float()
            fl, ce, ag = _losses(head, norm, out_rows, index, out, b)
        loss = loss + s.unroll_decay**i * (s.feature_weight * fl + s.ce_weight * ce)
        if i == 0:
            agree, past = ag, kv
        feats = torch.cat([feats[:, :1], out[:, :-1]], dim=1)
    return loss, agree


def _optimise(
    head: FeatureHead,
    data: Sequence[SequenceFeatures],
    s: FeatureDraftSettings,
    frozen_parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    progress: Callable[[int, float], None] | None,
    monitor: Callable[[FeatureHead], float] | None,
    monitor_every: int,
) -> tuple[list[float], list[float], list[list[float]]]:
    """Train ``head`` in place; return loss and agreement per step and the monitor's values.

    ``frozen_parts`` are the target's embeddings, final norm, output rows of the draft
    vocabulary and the row of every token id.
    """
    embedding, norm, out_rows, index = frozen_parts
    scale = head.scale
    frozen = set() if s.train_block else {f"layer.{w}" for w in _BLOCK_PROJECTIONS}
    params = [t for name, t in head.tensors().items() if name not in frozen]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=s.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warm = max(1, s.steps // 20)
    gen = torch.Generator().manual_seed(s.seed)
    rng = random.Random(s.seed)
    batches: list[list[int]] = []
    losses, agreement, monitored = [], [], []
    for step in range(s.steps):
        lr = s.lr * min(1.0, (step + 1) / warm)
        lr *= 0.5 * (1 + math.cos(math.pi * max(0, step - warm) / max(1, s.steps - warm)))
        for group in opt.param_groups:
            group["lr"] = lr
        if not batches:
            batches = _epoch(data, s.batch, rng)
        b = _rows(data, batches.pop(), s.max_len)
        if s.noise:
            noise = torch.rand(b["feats"].shape, generator=gen) - 0.5
            b["feats"] = b["feats"] + noise * (s.noise * scale)
        loss, agree = _step_loss(head, s, embedding, norm, out_rows, index, b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        agreement.append(float(agree.detach()))
        if progress is not None:
            progress(step, losses[-1])
        if monitor is not None and ((step + 1) % monitor_every == 0 or step + 1 == s.steps):
            with torch.no_grad():
                monitored.append([step + 1, float(monitor(head))])
    for p in params:
        p.requires_grad_(False)
    return losses, agreement, monitored


def train_feature_draft(
    target: LlamaModel,
    seqs: Sequence[Sequence[int] | SequenceFeatures],
    settings: FeatureDraftSettings = FeatureDraftSettings(),
    *,
    data: Sequence[SequenceFeatures] | None = None,
    progress: Callable[[int, float], None] | None = None,
    monitor: Callable[[FeatureHead], float] | None = None,
    monitor_every: int = 100,
) -> TrainedFeatureDraft:
    """Train a feature head on teacher-forced target features over ``seqs``.

    Batches hold sequences of similar length (length-sorted chunks in shuffled order, a
    new shuffle every epoch), so little of a batch is padding.

    Args:
        target: The complete target model (its embeddings, final norm and output rows are
            used frozen).
        seqs: Training token sequences (each at least 2 tokens): chat-formatted text, the
            target's own greedy continuations, or both; items that are
            :class:`SequenceFeatures` already (e.g. from :func:`greedy_features`) are used
            as they are, the others run through :func:`extract_features`.
        settings: Training settings.
        data: Features of ``seqs`` already extracted (:func:`extract_features`); ``None``:
            extracted here.
        progress: Called as ``progress(step, loss)`` after every step.
        monitor: Called as ``monitor(head)`` every ``monitor_every`` steps and after the
            last (e.g. a held-out accuracy); its values go to ``meta["monitor"]``.
        monitor_every: Steps between calls of ``monitor``.

    Returns:
        The trained head; ``meta`` holds ``loss`` and ``agreement`` (on training rows)
        per step, ``monitor`` (``[step, value]`` pairs), ``extract_s``, ``train_s``,
        ``tokens``, ``sequences`` and ``vocab_coverage``.

    Raises:
        DistillError: No sequence, or one shorter than 2 tokens.
    """
    lengths = [len(q.tokens) if isinstance(q, SequenceFeatures) else len(q) for q in seqs]
    if not seqs or min(lengths) < 2:
        raise DistillError("train_feature_draft needs sequences of at least 2 tokens")
    s = settings
    t0 = time.perf_counter()
    if data is None:
        ready = [q for q in seqs if isinstance(q, SequenceFeatures)]
        tokens = [q for q in seqs if not isinstance(q, SequenceFeatures)]
        data = ready + extract_features(target, tokens, top_k=s.top_k)
    extract_s = time.perf_counter() - t0
    embedding = target.embedding
    if embedding is None:
        raise DistillError("the target holds no token embeddings")
    norm, out_full = _final(target)
    vocab = _draft_vocab(data, s.vocab)
    index = _row_index(vocab, target.config.vocab_size)
    out_rows = out_full[torch.as_tensor(vocab)]
    scale = float(torch.cat([x.features for x in data]).pow(2).mean().sqrt())
    head = initial_head(target, vocab, scale, s.seed)
    t1 = time.perf_counter()
    losses, agreement, monitored = _optimise(
        head, data, s, (embedding, norm, out_rows, index), progress, monitor, monitor_every
    )
    labels = torch.cat([x.top_ids[:, 0] for x in data])
    return TrainedFeatureDraft(
        head,
        {
            "loss": losses,
            "agreement": agreement,
            "monitor": monitored,
            "extract_s": extract_s,
            "train_s": time.perf_counter() - t1,
            "tokens": int(labels.numel()),
            "sequences": len(data),
            "vocab_coverage": float((index[labels] >= 0).float().mean()),
        },
    )


@torch.no_grad()
def teacher_forced_accuracy(
    head: FeatureHead,
    target: LlamaModel,
    data: Sequence[SequenceFeatures],
    starts: Sequence[int] | None = None,
) -> tuple[int, int]:
    """Count how often the head's first draft token equals the target's choice.

    Row ``t`` reads the true feature ``t`` and token ``t + 1`` and proposes token ``t + 2``;
    it is compared with the target's greedy choice after position ``t + 1``. Only rows
    that propose a token at index ``>= starts[i]`` count (e.g. the prompt's length: only the
    generated tokens).

    Args:
        head: The head.
        target: The complete target model (embeddings, final norm, output rows).
        data: Teacher-forced passes (:func:`extract_features`) of held-out sequences.
        starts: First counted token index per sequence (default 2: every row).

    Returns:
        ``(hits, rows)``.
    """
    if target.embedding is None:
        raise DistillError("the target holds no token embeddings")
    norm, out_full = _final(target)
    vocab = torch.as_tensor(head.vocab)
    hits = rows = 0
    for i, x in enumerate(data):
        n = len(x.tokens)
        first = max(2, int(starts[i]) if starts is not None else 2)
        if n < 3 or first >= n + 1:
            continue
        feats, nxt = x.features[None, : n - 1], x.tokens[None, 1:]
        out, _ = head.forward(target.embedding, feats, nxt, torch.arange(n - 1)[None])
        logits = _rms(out[0], norm, head.config.norm_eps) @ out_full[vocab].T
        proposed = vocab[logits.argmax(-1)]  # row t proposes token t + 2
        wanted = x.top_ids[1:, 0]  # the target's choice after position t + 1
        lo = first - 2
        hits += int((proposed[lo:] == wanted[lo:]).sum())
        rows += int(n - 1 - lo)
    return hits, rows
