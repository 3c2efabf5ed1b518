"""The target's features: final hidden states and next-token probabilities per position.

What a feature-level draft (:mod:`hpcnb.speculative.feature`) learns from and drafts on:

* :func:`extract_features` — one teacher-forced pass of the target over many sequences (no
  generation): features and the target's top-``k`` next-token probabilities per position.
* :func:`greedy_features` — the target's greedy answers to prompts, with the features the
  generation computed anyway.
* :func:`target_features` — the features of one sequence (for offline replays).

Example:
    >>> from hpcnb.speculative.model import LlamaModel, tiny_config
    >>> target = LlamaModel.random(tiny_config(n_layers=2, vocab_size=48), seed=1)
    >>> x = extract_features(target, [[1, 2, 3, 4]], top_k=2)[0]
    >>> tuple(x.features.shape), tuple(x.top_ids.shape)
    ((4, 64), (4, 2))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from hpcnb.speculative.distill import DistillError, _final, _greedy, _hidden, _rms
from hpcnb.speculative.model import LlamaModel

__all__ = ["SequenceFeatures", "extract_features", "greedy_features", "target_features"]


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
