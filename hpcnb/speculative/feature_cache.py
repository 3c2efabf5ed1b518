"""The cache of trained feature draft heads: safetensors keyed on target, settings and data.

* :func:`load_or_train_feature_draft` — the cached head for this target (its file's hash),
  settings and training data, trained (:func:`~hpcnb.speculative.feature.train_feature_draft`)
  when absent, under ``cache_root() / "speculative_drafts"`` (no pickle). The
  :mod:`hpcnb.cachefile` rules hold: damaged or mismatched files are retrained with a warning,
  saves are atomic, a folder that cannot be written gives one warning and an uncached head.
* :func:`save_feature_draft` / :func:`load_feature_draft` — one file.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from hpcnb.speculative.feature import FeatureDraftSettings, train_feature_draft
    >>> from hpcnb.speculative.model import LlamaModel, tiny_config
    >>> target = LlamaModel.random(tiny_config(n_layers=2, vocab_size=48), seed=1)
    >>> trained = train_feature_draft(target, [[1, 2, 3, 4]], FeatureDraftSettings(steps=2))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = save_feature_draft(Path(tmp) / "head.safetensors", trained)
    ...     load_feature_draft(path).head.vocab == trained.head.vocab
    True
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from hpcnb.cachefile import best_effort, write_private_atomic
from hpcnb.paths import cache_root
from hpcnb.speculative.distill import (
    DistillError,
    draft_key,
    load_cached_draft,
    read_draft_file,
)
from hpcnb.speculative.feature import (
    FeatureDraftSettings,
    FeatureHead,
    TrainedFeatureDraft,
    train_feature_draft,
)
from hpcnb.speculative.features import SequenceFeatures
from hpcnb.speculative.model import LayerWeights, LlamaConfig, LlamaModel

__all__ = [
    "feature_draft_cache_path",
    "load_feature_draft",
    "load_or_train_feature_draft",
    "save_feature_draft",
]

FORMAT = "hpcnb-feature-draft-1"


def feature_draft_cache_path(
    target_hash: str, settings: FeatureDraftSettings, data_key: str = ""
) -> Path:
    """Return the cache file of a feature draft for this target, settings and data.

    Args:
        target_hash: Identifies the target's weights.
        settings: Training settings.
        data_key: Identifies the training sequences.
    """
    key = draft_key(target_hash, settings, data_key)
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
    settings: FeatureDraftSettings | None = None,
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
        settings: Training settings (``None``: the defaults).
        data_key: Identifies ``seqs`` (part of the key).
        path: Cache file (default: :func:`feature_draft_cache_path`).
        progress: Passed to :func:`train_feature_draft`.
        monitor: Passed to :func:`train_feature_draft`.
    """
    settings = FeatureDraftSettings() if settings is None else settings
    key = draft_key(target_hash, settings, data_key)
    path = (
        Path(path)
        if path is not None
        else feature_draft_cache_path(target_hash, settings, data_key)
    )
    found = load_cached_draft(path, load_feature_draft, key, "feature draft cache")
    if found is not None:
        return found
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
