"""A feature-level draft head: drafts from the target's own last hidden state.

Our design, after EAGLE (Li et al., ICML 2024) and its "training-time test" (EAGLE-3,
2025): instead of a separate small language model, the draft is one Llama block at the
target's width that reads the target's final hidden state (its *feature*, before the final
norm) at position ``t`` together with the embedding of token ``t + 1`` and predicts the
feature at ``t + 1``; the target's own final norm and (frozen, tied) output rows, restricted
to a draft vocabulary of the tokens the target chooses most often, turn that prediction into
token ``t + 2``. Chained drafts feed the head's predicted features back in.

* :func:`extract_features` — one teacher-forced pass of the target over many sequences (no
  generation): features and the target's top-``k`` next-token probabilities per position.
* :func:`train_feature_draft` — train the head on those: smooth-L1 loss on the next feature
  (scaled by the features' RMS) plus a soft cross-entropy against the target's distribution,
  uniform noise on the input features, and ``unroll`` steps in which the head reads its own
  predicted features (each unrolled row attends to the true-feature rows before it and to
  itself, as at drafting time).
* :func:`teacher_forced_accuracy` — the fast check before any MPI run: how often the head's
  first draft token equals the target's choice, given true features, in one batched pass.
* :func:`load_or_train_feature_draft` — the same, cached as safetensors (no pickle) under
  ``cache_root() / "speculative_drafts"``, keyed on the target's hash, the settings and the
  training data (the :mod:`hpcnb.cachefile` rules: damaged or mismatched files are retrained
  with a warning, saves are atomic).
* :class:`FeatureDraft` — the drafter used by the head rank: its own KV cache over rows
  ``(feature_t, token_{t+1})``; true features arrive from the pipeline's last rank
  (:meth:`FeatureDraft.observe`), rows past them use the head's own predictions.
* :class:`CascadeDraft` — prompt lookup first (when the context's last ``n`` tokens occurred
  before), the feature draft otherwise.
* :class:`FeatureDraftSpec` — the ``"feature"`` kind of the draft registry.

Example (a tiny random target; a second of training):
    >>> from hpcnb.speculative.model import LlamaModel, tiny_config
    >>> target = LlamaModel.random(tiny_config(n_layers=2, vocab_size=48), seed=1)
    >>> seqs = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 8, 7, 6, 5, 4]]
    >>> s = FeatureDraftSettings(vocab=48, steps=3, batch=2)
    >>> trained = train_feature_draft(target, seqs, s)
    >>> draft = FeatureDraft.from_target(trained.head, target)
    >>> feats = target_features(target, seqs[0][:5])
    >>> draft.observe(seqs[0][:5], 0, feats)
    >>> len(draft.propose(seqs[0][:5], 3)), len(trained.meta["loss"])
    (3, 3)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from hpcnb.cachefile import CacheWarning, best_effort, write_private_atomic
from hpcnb.errors import InvalidInputError
from hpcnb.paths import cache_root
from hpcnb.speculative.contracts import DraftSpec, SpecError, register_draft
from hpcnb.speculative.distill import (
    DistillError,
    _final,
    _greedy,
    _hidden,
    _rms,
    block_qkv,
    block_rest,
    read_draft_file,
)
from hpcnb.speculative.drafts import NgramDraft
from hpcnb.speculative.head import lcp
from hpcnb.speculative.model import LayerWeights, LlamaConfig, LlamaModel

__all__ = [
    "CascadeDraft",
    "FeatureDraft",
    "FeatureDraftSettings",
    "FeatureDraftSpec",
    "FeatureHead",
    "SequenceFeatures",
    "TrainedFeatureDraft",
    "extract_features",
    "feature_draft_cache_path",
    "greedy_features",
    "initial_head",
    "load_feature_draft",
    "load_or_train_feature_draft",
    "save_feature_draft",
    "target_features",
    "teacher_forced_accuracy",
    "train_feature_draft",
]

FORMAT = "hpcnb-feature-draft-1"


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


# -- the target's features ------------------------------------------------------------------


@dataclass
class SequenceFeatures:
    """A teacher-forced pass of the target over one token sequence.

    Attributes:
        tokens: ``(L,)`` token ids.
        features: ``(L, dim)`` final hidden states before the final norm.
        top_p: ``(L, top_k)`` the target's largest next-token probabilities per position.
        top_ids: ``(L, top_k)`` their token ids (column 0: the target's greedy choice).
    """

    tokens: torch.Tensor
    features: torch.Tensor
    top_p: torch.Tensor
    top_ids: torch.Tensor


def _with_labels(
    target: LlamaModel, tokens: torch.Tensor, h: torch.Tensor, top_k: int
) -> SequenceFeatures:
    """Features ``h`` of ``tokens`` with the target's top-``k`` next-token probabilities."""
    norm, head = _final(target)
    logits = _rms(h, norm, target.config.norm_eps) @ head.T
    top, top_ids = logits.topk(top_k, dim=-1)
    top_p = (top - logits.logsumexp(-1, keepdim=True)).exp()
    return SequenceFeatures(tokens, h, top_p, top_ids)


@torch.no_grad()
def greedy_features(
    target: LlamaModel,
    prompts: Sequence[Sequence[int]],
    n_new: int,
    *,
    top_k: int = 8,
    batch: int = 64,
) -> list[SequenceFeatures]:
    """The target's greedy continuations of ``prompts`` with their features, in one go.

    Generation runs every position through the target anyway; its final hidden states are
    kept, so the target's own text needs no second, teacher-forced pass. Each sequence is
    the prompt and the first ``n_new - 1`` generated tokens (the last generated token was
    never run through the model); its labels (``top_ids[:, 0]``) on the continuation are
    the generated tokens themselves.

    Args:
        target: The complete target model.
        prompts: Prompt token lists (each non-empty).
        n_new: Tokens generated per prompt (at least 1).
        top_k: Probabilities kept per position.
        batch: Prompts per batched generation.

    Raises:
        DistillError: An empty prompt or ``n_new`` below 1.
    """
    if n_new < 1:
        raise DistillError(f"greedy_features: n_new must be >= 1, got {n_new}")
    hidden: list[torch.Tensor] = []
    conts, _ = _greedy(target, prompts, n_new, batch, False, hidden=hidden)
    out = []
    for p, cont, h in zip(prompts, conts, hidden, strict=True):
        tokens = torch.tensor([*map(int, p), *cont[:-1]])
        out.append(_with_labels(target, tokens, h, top_k))
    return out


def target_features(target: LlamaModel, tokens: Sequence[int]) -> torch.Tensor:
    """Return the target's ``(len(tokens), dim)`` final hidden states (one pass, no cache).

    Args:
        target: The complete target model.
        tokens: Token ids from position 0.
    """
    return target.run_layers(target.embed(list(tokens)))


@torch.no_grad()
def extract_features(
    target: LlamaModel,
    seqs: Sequence[Sequence[int]],
    *,
    top_k: int = 8,
    batch_tokens: int = 4096,
    progress: Callable[[int], None] | None = None,
) -> list[SequenceFeatures]:
    """Teacher-forced features and soft labels of the target over many sequences.

    Sequences are sorted by length and run in right-padded batches of about
    ``batch_tokens`` positions; attention is causal, so padding never reaches a real
    position and each row equals the target's pass over that sequence alone (up to float
    rounding).

    Args:
        target: The complete target model.
        seqs: Token lists (each non-empty).
        top_k: Probabilities kept per position.
        batch_tokens: Padded positions per forward pass.
        progress: Called with the number of sequences done after each batch.

    Returns:
        One :class:`SequenceFeatures` per sequence, in the order given.

    Raises:
        DistillError: An empty sequence.
    """
    if any(len(s) == 0 for s in seqs):
        raise DistillError("extract_features: every sequence must hold at least one token")
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out: list[SequenceFeatures | None] = [None] * len(seqs)
    i = done = 0
    while i < len(order):
        T = len(seqs[order[i]])
        j = i + 1
        while j < len(order) and (j - i + 1) * len(seqs[order[j]]) <= batch_tokens:
            j += 1
        group = order[i:j]
        T = max(len(seqs[g]) for g in group)
        ids = torch.tensor([list(map(int, seqs[g])) + [0] * (T - len(seqs[g])) for g in group])
        pos = torch.arange(T)[None, :].expand(len(group), T)
        h = _hidden(target, ids, pos, None)
        for r, g in enumerate(group):
            n = len(seqs[g])
            out[g] = _with_labels(target, ids[r, :n].clone(), h[r, :n].clone(), top_k)
        done += len(group)
        if progress is not None:
            progress(done)
        i = j
    return [o for o in out if o is not None]


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


# -- the cache ------------------------------------------------------------------------------


def _key(target_hash: str, settings: FeatureDraftSettings, data_key: str) -> str:
    blob = json.dumps(
        {"target": target_hash, "settings": dataclasses.asdict(settings), "data": data_key},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def feature_draft_cache_path(
    target_hash: str, settings: FeatureDraftSettings, data_key: str = ""
) -> Path:
    """Return the cache file of a feature draft for this target, settings and data.

    Args:
        target_hash: Identifies the target's weights.
        settings: Training settings.
        data_key: Identifies the training sequences.
    """
    key = _key(target_hash, settings, data_key)
    return cache_root() / "speculative_drafts" / f"feature-{key[:24]}.safetensors"


def save_feature_draft(path: str | Path, trained: TrainedFeatureDraft) -> Path:
    """Write a feature head as safetensors (config, scale and ``meta`` in the header).

    The write is atomic (:func:`hpcnb.cachefile.write_private_atomic`); the folder is
    created when missing.

    Args:
        path: Destination file.
        trained: The head and its record.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    from safetensors.torch import save

    head = trained.head
    tensors = {k: v.detach().contiguous() for k, v in head.tensors().items()}
    tensors["vocab"] = torch.as_tensor(head.vocab, dtype=torch.int64)
    header = {
        "format": FORMAT,
        "config": json.dumps(dataclasses.asdict(head.config)),
        "scale": repr(float(head.scale)),
        "meta": json.dumps({k: v for k, v in trained.meta.items() if k not in ("cached", "path")}),
    }
    return write_private_atomic(Path(path), save(tensors, metadata=header))


def load_feature_draft(path: str | Path, expect_key: str | None = None) -> TrainedFeatureDraft:
    """Read a feature head written by :func:`save_feature_draft`.

    Args:
        path: The safetensors file.
        expect_key: When given, the ``key`` stored in the file must equal it.

    Raises:
        MissingFileError: No such file.
        DistillError: Not a feature-draft file, damaged, or trained for another key.
    """
    path = Path(path)
    header, tensors, meta = read_draft_file(path, FORMAT, expect_key)
    try:
        cfg = LlamaConfig(**json.loads(header["config"]))
        fields = [f.name for f in dataclasses.fields(LayerWeights)]
        layer = LayerWeights(**{f: tensors[f"layer.{f}"] for f in fields})
        head = FeatureHead(
            cfg,
            tensors["fc"],
            tensors["fc_bias"],
            layer,
            [int(t) for t in tensors["vocab"].tolist()],
            float(header["scale"]),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise DistillError(f"{path}: damaged feature draft ({type(err).__name__}: {err})") from err
    if head.fc.shape != (cfg.dim, 2 * cfg.dim):
        raise DistillError(
            f"{path}: projection of shape {tuple(head.fc.shape)} for width {cfg.dim}"
        )
    return TrainedFeatureDraft(head, meta)


def load_or_train_feature_draft(
    target: LlamaModel,
    target_hash: str,
    seqs: Sequence[Sequence[int] | SequenceFeatures]
    | Callable[[], Sequence[Sequence[int] | SequenceFeatures]],
    settings: FeatureDraftSettings = FeatureDraftSettings(),
    *,
    data_key: str = "",
    path: str | Path | None = None,
    progress: Callable[[int, float], None] | None = None,
    monitor: Callable[[FeatureHead], float] | None = None,
) -> TrainedFeatureDraft:
    """Return the cached feature head for this target, settings and data; train it when absent.

    A damaged file, or one trained for another key, is retrained with a
    :class:`~hpcnb.cachefile.CacheWarning` naming it; a cache that cannot be written gives
    one warning and the head trained now.

    Args:
        target: The complete target model.
        target_hash: Identifies the target's weights (e.g. the SHA-256 of its file).
        seqs: Training sequences, or a function that returns them (called only when the
            head must be trained, so a cached head needs no data; its seconds are
            ``meta["data_s"]``).
        settings: Training settings.
        data_key: Identifies ``seqs`` (part of the key).
        path: Cache file (default: :func:`feature_draft_cache_path`).
        progress: Passed to :func:`train_feature_draft`.
        monitor: Passed to :func:`train_feature_draft`.
    """
    key = _key(target_hash, settings, data_key)
    path = (
        Path(path)
        if path is not None
        else feature_draft_cache_path(target_hash, settings, data_key)
    )
    if path.is_file():
        try:
            found = load_feature_draft(path, expect_key=key)
            found.meta.update(cached=True, path=str(path))
            return found
        except (DistillError, OSError) as err:
            reason = str(err).removeprefix(f"{path}: ")
            warnings.warn(
                f"feature draft cache {path}: ignored, {reason}; trained again, the file is "
                "replaced",
                CacheWarning,
                stacklevel=2,
            )
    t0 = time.perf_counter()
    data = seqs() if callable(seqs) else seqs
    data_s = time.perf_counter() - t0
    trained = train_feature_draft(target, data, settings, progress=progress, monitor=monitor)
    trained.meta.update(
        key=key,
        target_sha256=target_hash,
        settings=dataclasses.asdict(settings),
        data_key=data_key,
        data_s=data_s,
    )
    with best_effort(path, "feature draft cache"):
        save_feature_draft(path, trained)
    trained.meta.update(cached=False, path=str(path))
    return trained


# -- drafting -------------------------------------------------------------------------------


class FeatureDraft:
    """Draft tokens from the target's features with a trained :class:`FeatureHead`.

    The drafter keeps a KV cache over *rows*: row ``t`` reads feature ``t`` and token
    ``t + 1`` and predicts feature ``t + 1``. Row ``t`` uses the target's true feature when
    it is known (:meth:`observe`) and the drafter's own prediction (the output of row
    ``t - 1``) otherwise, so chains drafted on unverified tokens extend on predicted
    features. When a true feature arrives for a row computed from a prediction, the rows
    from there on are recomputed on the next :meth:`propose`.

    Args:
        head: The trained head.
        embedding: The target's token embeddings.
        norm: The target's final norm weight.
        output: The target's output head (``(vocab, dim)``; the embeddings when tied).
        cutoff: Stop drafting when the top probability falls below this.
        shift: Add this to every proposed id (modulo the vocabulary): ``shift=1`` makes a
            never-accepted control draft of the same cost.
        name: Label.
    """

    def __init__(
        self,
        head: FeatureHead,
        embedding: torch.Tensor,
        norm: torch.Tensor,
        output: torch.Tensor,
        *,
        cutoff: float = 0.0,
        shift: int = 0,
        name: str = "feature",
    ) -> None:
        c = head.config
        if embedding.shape[1] != c.dim or output.shape[1] != c.dim:
            raise InvalidInputError(
                f"feature draft of width {c.dim} for a target of width {embedding.shape[1]}"
            )
        self.head = head
        self.vocab = list(head.vocab)
        rows = output[torch.as_tensor(self.vocab)]
        self.block = LlamaModel(c, {0: head.layer}, embedding, norm, rows)
        self.cutoff, self.shift, self.name = float(cutoff), int(shift), name
        self._cache = self.block.new_cache()
        self._row_tokens: list[int] = []  # token t+1 of each cached row
        self._row_true: list[bool] = []  # whether the row read a true feature
        self._outs: list[torch.Tensor] = []  # predicted feature t+1 of row t
        self._ctx: list[int] = []  # tokens under which the true features hold
        self._true = torch.zeros(0, c.dim)  # true features by position
        self.calls = 0

    @classmethod
    def from_target(cls, head: FeatureHead, target: LlamaModel, **kwargs: Any) -> FeatureDraft:
        """Return the drafter over ``target``'s embeddings, final norm and output rows.

        Args:
            head: The trained head.
            target: A model holding the embeddings, final norm and output head.
            **kwargs: ``cutoff``, ``shift``, ``name``.
        """
        if target.embedding is None:
            raise DistillError("the feature draft needs the target's token embeddings")
        norm, out = _final(target)
        return cls(head, target.embedding, norm, out, **kwargs)

    def reset(self) -> None:
        """Forget every feature and row."""
        self._cache.clear()
        self._row_tokens, self._row_true, self._outs, self._ctx = [], [], [], []
        self._true = self._true[:0]

    def known(self) -> int:
        """Number of positions whose true feature is known."""
        return int(self._true.shape[0])

    def observe(self, tokens: Sequence[int], start: int, feats: torch.Tensor) -> None:
        """Take the target's true features of positions ``start, start + 1, ...``.

        Args:
            tokens: The tokens the target computed them under (at least
                ``start + len(feats)`` of them).
            start: Position of the first feature.
            feats: ``(m, dim)`` final hidden states (before the final norm).

        Raises:
            InvalidInputError: A wrong width, or fewer tokens than positions.
        """
        feats = torch.as_tensor(feats, dtype=torch.float32)
        m = int(feats.shape[0]) if feats.ndim == 2 else -1
        if feats.ndim != 2 or feats.shape[1] != self.head.config.dim:
            raise InvalidInputError(
                f"features must be (m, {self.head.config.dim}), got {tuple(feats.shape)}"
            )
        if start < 0 or len(tokens) < start + m:
            raise InvalidInputError(
                f"features of positions {start}..{start + m - 1} need {start + m} tokens, "
                f"got {len(tokens)}"
            )
        toks = [int(t) for t in tokens]
        keep = min(self.known(), lcp(self._ctx, toks))  # features t < keep still hold
        if start > keep:  # a gap: keep what holds, drop the rest
            self._true = self._true[:keep]
        else:
            self._true = torch.cat([self._true[:start], feats])
        self._ctx = toks

    def _true_until(self, context: Sequence[int]) -> int:
        """Positions ``t`` below the result have a true feature valid for ``context``."""
        return min(self.known(), lcp(self._ctx, context))

    @torch.no_grad()
    def _rows_for(self, context: list[int]) -> bool:
        """Bring the cached rows to ``0 .. len(context) - 2``; False when none can start."""
        n_rows = len(context) - 1
        true_n = self._true_until(context)
        if true_n == 0:
            return False
        keep = 0
        while keep < min(n_rows, len(self._row_tokens)):
            want_true = keep < true_n
            if self._row_tokens[keep] != context[keep + 1] or self._row_true[keep] != want_true:
                break
            keep += 1
        if keep < len(self._row_tokens):
            self._cache.truncate(0, keep)
            del self._row_tokens[keep:], self._row_true[keep:], self._outs[keep:]
        if keep < min(true_n, n_rows):  # rows on true features: one batched pass
            hi = min(true_n, n_rows)
            self._run(self._true[keep:hi], context[keep + 1 : hi + 1], True)
            keep = hi
        while keep < n_rows:  # rows past the true features read the previous prediction
            self._run(self._outs[-1][None], [context[keep + 1]], False)
            keep += 1
        return True

    def _run(self, feats: torch.Tensor, tokens: list[int], true: bool) -> None:
        E = self.block.embedding
        assert E is not None
        z = self.head.project(E, feats, torch.as_tensor(tokens))
        out = self.block.run_layers(z, 0, self._cache)
        self._row_tokens.extend(tokens)
        self._row_true.extend([true] * len(tokens))
        self._outs.extend(out)
        self.calls += 1

    @torch.no_grad()
    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Return up to ``k`` draft tokens continuing ``context`` (none before any feature).

        Args:
            context: Tokens so far (committed, then possibly unverified ones).
            k: Most tokens to propose.
        """
        ctx = [int(t) for t in context]
        if k <= 0 or len(ctx) < 2 or not self._rows_for(ctx):
            return []
        out: list[int] = []
        for _ in range(k):
            logits = self.block.logits(self._outs[-1][None])[0]
            p = torch.softmax(logits, -1)
            conf, idx = torch.max(p, -1)
            if float(conf) < self.cutoff:
                break
            tok = self.vocab[int(idx)]
            out.append(tok)
            if len(out) < k:
                self._run(self._outs[-1][None], [tok], False)
        if self.shift:
            out = [(t + self.shift) % self.head.config.vocab_size for t in out]
        return out


class CascadeDraft:
    """Prompt lookup first, a model draft where no n-gram of the context matches.

    The rule: when the context's last ``n`` tokens (``n`` from ``max_n`` down to ``min_n``)
    occurred earlier in the context, propose what followed them (:class:`NgramDraft`);
    otherwise ask the second draft. ``last_source`` names the draft that made the latest
    proposal, so acceptance can be counted per source.

    Args:
        second: The draft asked when no n-gram matches (e.g. a :class:`FeatureDraft`).
        min_n: Shortest trailing n-gram that counts as a match.
        max_n: Longest one tried.
    """

    def __init__(self, second: Any, min_n: int = 3, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise InvalidInputError(f"need 1 <= min_n={min_n} <= max_n={max_n}")
        self.first = NgramDraft(max_n=max_n, min_n=min_n)
        self.second = second
        self.name = f"ngram+{getattr(second, 'name', 'draft')}"
        self.last_source = ""

    def observe(self, tokens: Sequence[int], start: int, feats: torch.Tensor) -> None:
        """Pass the target's features on to the second draft (when it takes them).

        Args:
            tokens: The tokens the target computed them under.
            start: Position of the first feature.
            feats: ``(m, dim)`` final hidden states.
        """
        if hasattr(self.second, "observe"):
            self.second.observe(tokens, start, feats)

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Return the n-gram's continuation when one matches, else the second draft's.

        Args:
            context: Tokens so far.
            k: Most tokens to propose.
        """
        d = self.first.propose(context, k)
        if d:
            self.last_source = "ngram"
            return d
        self.last_source = getattr(self.second, "name", "second")
        return list(self.second.propose(context, k))


@register_draft("feature")
@dataclass(frozen=True)
class FeatureDraftSpec(DraftSpec):
    """A feature draft (:class:`FeatureDraft`) read from its safetensors file.

    The head rank builds it over its copy of the target's embeddings, final norm and output
    head, and the pipeline's last rank returns the final hidden states of every run with its
    tokens (:meth:`needs_features`).

    Attributes:
        path: The head's file (``TrainedFeatureDraft.meta["path"]``).
        cutoff: Confidence cutoff (see :class:`FeatureDraft`).
        shift: ``1`` makes the never-accepted control of the same cost.
        ngram_first: Try prompt lookup first (:class:`CascadeDraft`).
        min_n: Shortest trailing n-gram the cascade accepts as a match.
    """

    path: str
    cutoff: float = 0.0
    shift: int = 0
    ngram_first: bool = False
    min_n: int = 3

    def build(self, head_model: LlamaModel | None) -> FeatureDraft | CascadeDraft:
        """Load the head on the head rank and attach it to the target's own rows.

        Args:
            head_model: The head rank's model, with embeddings, final norm and output head.

        Raises:
            SpecError: No head model was given.
            MissingFileError: The file does not exist.
            DistillError: The file is not a feature draft, or is for another width.
        """
        if head_model is None:
            raise SpecError("the feature draft needs the head's model (embeddings and head)")
        trained = load_feature_draft(self.path)
        name = "feature" if not self.shift else "feature_never_accepted"
        draft = FeatureDraft.from_target(
            trained.head, head_model, cutoff=float(self.cutoff), shift=int(self.shift), name=name
        )
        if self.ngram_first:
            return CascadeDraft(draft, min_n=int(self.min_n), max_n=max(int(self.min_n), 4))
        return draft

    def needs_features(self) -> bool:
        """The last rank returns the target's final hidden states with every result."""
        return True
