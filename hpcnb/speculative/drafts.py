"""Draft models that guess the target's next tokens.

* :class:`NgramDraft` — prompt lookup: find the latest earlier occurrence of the last
  ``n`` tokens in the context and propose what followed it (free, no model).
* :class:`ModelDraft` — greedy decoding with any small :class:`LlamaModel`, with its own
  KV cache that follows the context (only new tokens are computed) and a confidence
  cutoff (stop drafting when the draft's top probability drops below it).
* :func:`early_exit_draft` — self-drafting: the target's first ``k`` layers, then the
  target's final norm and head.
* :func:`measure_acceptance` — acceptance rate of a draft against a known greedy
  continuation, replaying standard speculative decoding offline.

A job names its draft by a *draft spec* (:class:`~hpcnb.speculative.contracts.DraftSpec`),
a frozen dataclass of the draft's options that builds it. The built-in kinds are registered
in :data:`~hpcnb.speculative.contracts.DRAFTS`: :class:`NgramDraftSpec` (``"ngram"``),
:class:`EarlyExitDraftSpec` (``"early_exit"``) and :class:`DistilledDraftSpec`
(``"distilled"``, a trained draft read from its safetensors file). A draft of your own lives
in your own module::

    # mypkg/drafts.py
    @register_draft("my_kind")  # optional: gives the class a short name
    @dataclass(frozen=True)
    class MyDraftSpec(DraftSpec):
        size: int = 2

        def build(self, head_model):
            return MyDraft(self.size)

A job's JSON names it ``{"kind": "mypkg.drafts:MyDraftSpec", "size": 3}`` (registered or
not), ``{"kind": "mypkg.drafts:", "size": 3}`` (the module registers one kind) or, once the
module is imported, ``{"kind": "my_kind", "size": 3}``; in Python,
``GenerationSpec(..., draft=MyDraftSpec(3))``. Every MPI rank resolves the name through the
same registry and imports ``mypkg.drafts`` itself (it must be importable there: installed,
or on ``PYTHONPATH``), and the job's JSON names a user's class by its reference. Override
:meth:`~hpcnb.speculative.contracts.DraftSpec.head_layers` when the draft needs the target's
first layers on the head rank.

Example:
    >>> from hpcnb.speculative.contracts import DraftSpec
    >>> spec = DraftSpec.from_json({"kind": "ngram", "max_n": 2})
    >>> spec, spec.build(None).propose([1, 2, 3, 1, 2], 2)
    (NgramDraftSpec(max_n=2), [3, 1])
    >>> DraftSpec.from_json({"kind": "hpcnb.speculative.drafts:NgramDraftSpec"}).to_json()
    {'kind': 'ngram', 'max_n': 3}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hpcnb.errors import InvalidInputError
from hpcnb.speculative.contracts import DRAFTS, DraftSpec, SpecError, register_draft
from hpcnb.speculative.head import lcp
from hpcnb.speculative.model import LlamaModel

__all__ = [
    "DRAFTS",
    "DistilledDraftSpec",
    "DraftSpec",
    "EarlyExitDraftSpec",
    "ModelDraft",
    "NgramDraft",
    "NgramDraftSpec",
    "early_exit_draft",
    "measure_acceptance",
    "register_draft",
]


@dataclass
class NgramDraft:
    """Prompt-lookup draft: continue the latest earlier match of the trailing n-gram.

    Args:
        max_n: Longest n-gram tried (then shorter ones down to ``min_n``).
        min_n: Shortest n-gram accepted as a match.
    """

    max_n: int = 3
    min_n: int = 1
    name: str = "ngram"

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Return up to ``k`` tokens that followed the latest earlier match.

        Args:
            context: Tokens so far (prompt and committed or assumed ones).
            k: Most tokens to propose.
        """
        ctx = list(context)
        for n in range(min(self.max_n, len(ctx) - 1), self.min_n - 1, -1):
            pat = ctx[-n:]
            for start in range(len(ctx) - n - 1, -1, -1):
                if ctx[start : start + n] == pat:
                    follow = ctx[start + n : start + n + k]
                    if follow:
                        return follow
        return []


class ModelDraft:
    """Greedy drafting with a small model and an incremental KV cache.

    Args:
        model: A complete (small) model: embeddings, layers, norm and head.
        cutoff: Stop drafting when the softmax probability of the top token is below this.
        name: Label.
        vocab: Token id of each output row when the head covers only part of the
            vocabulary (a distilled draft's); ``None``: row ``i`` is token ``i``.
        shift: Add this to every proposed id (modulo the vocabulary): ``shift=1`` makes a
            control draft with the same cost whose tokens are (almost) never accepted.
    """

    def __init__(
        self,
        model: LlamaModel,
        cutoff: float = 0.0,
        name: str = "model",
        vocab: Sequence[int] | None = None,
        shift: int = 0,
    ) -> None:
        self.model = model
        self.cutoff = float(cutoff)
        self.name = name
        self.vocab = None if vocab is None else [int(t) for t in vocab]
        self.shift = int(shift)
        self._cache = model.new_cache()
        self._tokens: list[int] = []
        self.calls = 0

    def reset(self) -> None:
        """Forget the cached context."""
        self._cache.clear()
        self._tokens = []

    @torch.no_grad()
    def _advance(self, new: list[int]) -> torch.Tensor:
        h = self.model.run_layers(self.model.embed(new), 0, self._cache)
        self._tokens.extend(new)
        self.calls += 1
        return self.model.logits(h[-1:])[0]

    @torch.no_grad()
    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Return up to ``k`` greedy draft tokens continuing ``context``.

        Args:
            context: Tokens so far; the cache keeps the longest prefix it shares with the
                previous call's context.
            k: Most tokens to propose (fewer when the confidence drops below ``cutoff``).
        """
        ctx = [int(t) for t in context]
        if k <= 0 or not ctx:
            return []
        keep = min(lcp(self._tokens, ctx), len(ctx) - 1)
        if keep < len(self._tokens):
            if keep == 0:
                self._cache.clear()
            else:
                self._cache.truncate(0, keep)
            self._tokens = self._tokens[:keep]
        last = self._advance(ctx[keep:])
        out: list[int] = []
        for _ in range(k):
            p = torch.softmax(last, -1)
            conf, idx = torch.max(p, -1)
            if float(conf) < self.cutoff:
                break
            tok = int(idx) if self.vocab is None else self.vocab[int(idx)]
            out.append(tok)
            if len(out) < k:
                last = self._advance([tok])
        if self.shift:
            out = [(t + self.shift) % self.model.config.vocab_size for t in out]
        return out


def early_exit_draft(target: LlamaModel, n_layers: int, cutoff: float = 0.0) -> ModelDraft:
    """Return a self-draft: the target's first ``n_layers`` layers, final norm and head.

    Args:
        target: The target model, holding at least its first ``n_layers`` layers with
            embeddings, final norm and head.
        n_layers: Layers of the draft, in ``[1, target.config.n_layers]``.
        cutoff: Confidence cutoff (see :class:`ModelDraft`).

    Raises:
        InvalidInputError: ``n_layers`` is out of range.
    """
    if not 1 <= n_layers <= target.config.n_layers:
        raise InvalidInputError(f"n_layers={n_layers} must lie in [1, {target.config.n_layers}]")
    return ModelDraft(
        target.slice(0, n_layers, embed=True, head=True), cutoff, name=f"early_exit_{n_layers}"
    )


@register_draft("ngram")
@dataclass(frozen=True)
class NgramDraftSpec(DraftSpec):
    """Prompt lookup (:class:`NgramDraft`) with n-grams of up to ``max_n`` tokens."""

    max_n: int = 3

    def build(self, head_model: LlamaModel | None) -> NgramDraft:
        """Return the draft (needs no model).

        Args:
            head_model: Unused.
        """
        return NgramDraft(max_n=int(self.max_n))


@register_draft("early_exit")
@dataclass(frozen=True)
class EarlyExitDraftSpec(DraftSpec):
    """Self-drafting with the target's first ``layers`` layers (:func:`early_exit_draft`)."""

    layers: int
    cutoff: float = 0.0

    def build(self, head_model: LlamaModel | None) -> ModelDraft:
        """Return the draft over the head's copy of the target's first layers.

        Args:
            head_model: The head's model, holding at least ``layers`` layers.

        Raises:
            SpecError: No head model was given.
        """
        if head_model is None:
            raise SpecError("the early-exit draft needs the head's model")
        return early_exit_draft(head_model, int(self.layers), float(self.cutoff))

    def head_layers(self) -> int:
        """The head holds the target's first ``layers`` layers."""
        return int(self.layers)


@register_draft("distilled")
@dataclass(frozen=True)
class DistilledDraftSpec(DraftSpec):
    """A draft trained on the target's greedy outputs (:mod:`hpcnb.speculative.distill`).

    Attributes:
        path: Its safetensors file (``TrainedDraft.meta["path"]`` after
            :func:`~hpcnb.speculative.distill.load_or_distill`).
        cutoff: Confidence cutoff (see :class:`ModelDraft`).
        shift: ``1`` makes the never-accepted control draft of the same cost (see
            :class:`ModelDraft`); ``0`` the draft itself.
    """

    path: str
    cutoff: float = 0.0
    shift: int = 0

    def build(self, head_model: LlamaModel | None) -> ModelDraft:
        """Load the draft from its file on the head rank.

        Args:
            head_model: Unused (the draft is a model of its own).

        Raises:
            MissingFileError: The file does not exist.
            hpcnb.speculative.distill.DistillError: The file is not a draft.
        """
        from hpcnb.speculative.distill import load_draft

        trained = load_draft(self.path)
        name = "distilled" if not self.shift else "distilled_never_accepted"
        return ModelDraft(
            trained.model, float(self.cutoff), name, vocab=trained.vocab, shift=int(self.shift)
        )


def measure_acceptance(
    draft: Any,
    prompt: Sequence[int],
    greedy: Sequence[int],
    k: int = 4,
    *,
    features: torch.Tensor | None = None,
) -> dict[str, float]:
    """Replay standard speculative decoding against a known greedy continuation.

    A draft that reads the target's features (one with ``observe``) is given, before each
    proposal, the features of every position the target has computed and verified by
    then, as in the pipeline: none before the first pass (the prompt's), and after a pass
    that leaves ``n`` tokens committed, positions ``0 .. n - 2``.

    Args:
        draft: The draft (``propose(context, k)``; optionally ``observe`` and
            ``last_source``).
        prompt: Prompt tokens.
        greedy: The target's greedy continuation of ``prompt``.
        k: Draft tokens per verification.
        features: ``(len(prompt) + len(greedy), dim)`` the target's final hidden states
            over prompt and continuation (:func:`hpcnb.speculative.feature.target_features`),
            for drafts that read them.

    Returns:
        ``acceptance_rate`` (accepted / drafted), ``token_acceptance`` (accepted / judged
        tokens: a draft's tokens after its first rejection are never judged; the chance
        that a token is right given the ones before it were), ``tokens_per_pass``
        (committed tokens per target pass), ``accepted``, ``drafted``, ``rejected`` and
        ``passes`` (counts, as floats); for a draft with ``last_source`` (a cascade),
        also ``"{source}.accepted"``, ``"{source}.drafted"`` and ``"{source}.rejected"``
        per source.
    """
    full = list(prompt) + list(greedy)
    pos, drafted, accepted, rejected, passes = len(prompt), 0, 0, 0, 0
    observe = getattr(draft, "observe", None) if features is not None else None
    seen = 0
    by_source: dict[str, float] = {}
    while pos < len(full):
        if observe is not None and features is not None and passes and pos - 1 > seen:
            observe(full, seen, features[seen : pos - 1])
            seen = pos - 1
        d = draft.propose(full[:pos], min(k, len(full) - pos))
        drafted += len(d)
        a = lcp(d, full[pos : pos + len(d)])
        accepted += a
        rejected += int(a < len(d))
        source = getattr(draft, "last_source", None)
        if source and d:
            for name, n in (("accepted", a), ("drafted", len(d)), ("rejected", int(a < len(d)))):
                key = f"{source}.{name}"
                by_source[key] = by_source.get(key, 0.0) + n
        pos += a + 1
        passes += 1
    return {
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "token_acceptance": accepted / (accepted + rejected) if accepted + rejected else 0.0,
        "tokens_per_pass": len(greedy) / passes if passes else 0.0,
        "accepted": float(accepted),
        "drafted": float(drafted),
        "rejected": float(rejected),
        "passes": float(passes),
        **by_source,
    }
