"""Drafting with a feature-level draft head on the head rank of the pipeline.

* :class:`FeatureDraft` — its own KV cache over rows ``(feature_t, token_{t+1})``; true
  features arrive from the pipeline's last rank (:meth:`FeatureDraft.observe`, called by
  :meth:`~hpcnb.speculative.head.HeadPolicy.on_result` with the features of verified
  positions), rows past them use the head's own predictions.
* :class:`CascadeDraft` — prompt lookup first (when the context's last ``n`` tokens occurred
  before), the feature draft otherwise.
* :class:`FeatureDraftSpec` — the ``"feature"`` kind of the draft registry: the head is read
  from its file (:mod:`hpcnb.speculative.feature`) and attached to the head rank's copy of
  the target's embeddings, final norm and output head.

Example (a tiny random target; a second of training):
    >>> from hpcnb.speculative.feature import FeatureDraftSettings, train_feature_draft
    >>> from hpcnb.speculative.features import target_features
    >>> from hpcnb.speculative.model import LlamaModel, tiny_config
    >>> target = LlamaModel.random(tiny_config(n_layers=2, vocab_size=48), seed=1)
    >>> seqs = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 8, 7, 6, 5, 4]]
    >>> trained = train_feature_draft(target, seqs, FeatureDraftSettings(vocab=48, steps=3))
    >>> draft = FeatureDraft.from_target(trained.head, target)
    >>> draft.propose(seqs[0][:5], 3)  # no feature of the target yet: nothing to draft from
    []
    >>> draft.observe(seqs[0][:5], 0, target_features(target, seqs[0][:4]))
    >>> len(draft.propose(seqs[0][:5], 3))
    3
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hpcnb.errors import InvalidInputError
from hpcnb.speculative.contracts import DraftSpec, SpecError, register_draft
from hpcnb.speculative.distill import DistillError, _final
from hpcnb.speculative.drafts import NgramDraft
from hpcnb.speculative.feature import FeatureHead
from hpcnb.speculative.feature_cache import load_feature_draft
from hpcnb.speculative.head import lcp
from hpcnb.speculative.model import LlamaModel

__all__ = ["CascadeDraft", "FeatureDraft", "FeatureDraftSpec"]


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
