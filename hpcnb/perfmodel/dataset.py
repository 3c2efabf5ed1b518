"""The timing data set of ConvMeter: zoo families × widths × resolutions × batches, cached.

Each configuration builds a network of the zoo (:mod:`hpcnb.models`) scaled by a width
multiplier, computes its features once per input resolution
(:func:`hpcnb.perfmodel.features.network_features`) and times inference and training at
each batch size (:mod:`hpcnb.perfmodel.timing`).

Measurements depend on the machine, so they are cached in the one hpcnb cache
(:func:`hpcnb.paths.cache_root`: ``$HPCNB_CACHE``, else the user cache folder) as
``perfmodel/timings-<key>.json``, where the key is a digest of
:func:`hpcnb.paths.machine_key` (CPU model, cores, architecture) and the torch version.
Entries are keyed by the configuration and the timing settings; a later run with a superset
grid measures only what is missing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from hpcnb.paths import cache_root, machine_key
from hpcnb.perfmodel.estimator import Measurement
from hpcnb.perfmodel.features import NetworkFeatures, network_features
from hpcnb.perfmodel.timing import TimingConfig, time_inference, time_training

#: Format of the cache file; a file of another format is measured afresh.
CACHE_VERSION = 2
FAMILIES = ("resnet", "vgg", "mobilenet_v2", "shufflenet", "densenet")

__all__ = ["FAMILIES", "GridConfig", "build_network", "cache_file", "collect_dataset"]


def _scale(channels: int, width: float, multiple: int = 1) -> int:
    return max(multiple, round(channels * width / multiple) * multiple)


def build_network(
    family: str, width: float = 1.0, in_channels: int = 3, num_classes: int = 10
) -> nn.Module:
    """Build a zoo network of ``family`` with every channel count scaled by ``width``.

    Args:
        family: One of :data:`FAMILIES`.
        width: Channel multiplier (1.0 = the zoo's default size).
        in_channels: Input image channels.
        num_classes: Classifier outputs.

    Raises:
        ValueError: Unknown family or non-positive width.
    """
    from hpcnb import models

    if width <= 0:
        raise ValueError(f"width={width}: expected a positive multiplier")
    common = {"num_classes": num_classes, "in_channels": in_channels}
    if family == "resnet":
        return models.resnet_cifar(depth=20, width=_scale(16, width), **common)
    if family == "vgg":
        cfg = (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512)
        scaled = tuple(c if c == "M" else _scale(int(c), width) for c in cfg)
        return models.vgg(cfg=scaled, hidden=_scale(256, width), **common)
    if family == "mobilenet_v2":
        settings = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 3, 2), (6, 96, 2, 1))
        scaled_settings = tuple((t, _scale(c, width), n, s) for t, c, n, s in settings)
        return models.mobilenet_v2(
            settings=scaled_settings, stem=_scale(32, width), last=_scale(640, width), **common
        )
    if family == "shufflenet":
        return models.shufflenet(
            widths=tuple(_scale(c, width, 2) for c in (48, 96, 192)),
            stem=_scale(24, width),
            last=_scale(512, width),
            **common,
        )
    if family == "densenet":
        return models.densenet(growth=_scale(12, width), stem=_scale(24, width), **common)
    raise ValueError(f"family={family!r}: expected one of {FAMILIES}")


@dataclass(frozen=True)
class GridConfig:
    """The configurations of the data set.

    Attributes:
        families: Architecture families (see :func:`build_network`).
        widths: Channel multipliers.
        resolutions: Square input sizes in pixels.
        batches: Batch sizes.
        in_channels: Input channels.
        timing: Thread count, warm-up and repeats.
        seed: Seed of weights and inputs.
    """

    families: tuple[str, ...] = FAMILIES
    widths: tuple[float, ...] = (0.25, 0.5)
    resolutions: tuple[int, ...] = (16, 32)
    batches: tuple[int, ...] = (2, 8, 32)
    in_channels: int = 3
    timing: TimingConfig = field(default_factory=TimingConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        for family in self.families:
            if family not in FAMILIES:
                raise ValueError(f"GridConfig.families: {family!r} not in {FAMILIES}")
        if not self.widths or min(self.widths) <= 0:
            raise ValueError(f"GridConfig.widths={self.widths}: need positive multipliers")
        if not self.resolutions or min(self.resolutions) < 8:
            raise ValueError(f"GridConfig.resolutions={self.resolutions}: need sizes >= 8")
        if not self.batches or min(self.batches) < 2:
            raise ValueError(
                f"GridConfig.batches={self.batches}: need sizes >= 2 (BatchNorm in training)"
            )

    @property
    def size(self) -> int:
        """Number of configurations (rows) in the grid."""
        return len(self.families) * len(self.widths) * len(self.resolutions) * len(self.batches)


def cache_file(directory: str | Path | None = None) -> Path:
    """Path of this machine's timing cache file.

    The file name holds a digest of :func:`hpcnb.paths.machine_key` and the torch version:
    timings measured on another machine or with another torch are never read. (Files
    written before this naming, ``perfmodel/<host>-<digest>.json``, are simply not found.)

    Args:
        directory: Cache root instead of :func:`hpcnb.paths.cache_root`.
    """
    root = Path(directory) if directory else cache_root()
    raw = f"{machine_key()} | torch {torch.__version__}"
    digest = hashlib.sha1(raw.encode()).hexdigest()[:12]
    return root / "perfmodel" / f"timings-{digest}.json"


def _load_cache(path: Path) -> dict[str, dict]:
    if not path.is_file():
        return {"features": {}, "timings": {}}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        print(f"perfmodel cache {path} is unreadable; measuring afresh")
        return {"features": {}, "timings": {}}
    if data.get("version") != CACHE_VERSION:
        return {"features": {}, "timings": {}}
    return {"features": data.get("features", {}), "timings": data.get("timings", {})}


def _save_cache(path: Path, cache: dict[str, dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": CACHE_VERSION, **cache}))
    tmp.replace(path)


def collect_dataset(
    grid: GridConfig,
    *,
    use_cache: bool = True,
    cache_dir: str | Path | None = None,
    progress: Callable[[Sequence], Sequence] | None = None,
) -> list[Measurement]:
    """Measure every configuration of ``grid`` (reusing cached measurements).

    Args:
        grid: The configurations and timing settings.
        use_cache: Read and update the on-disk cache of this machine.
        cache_dir: Cache root instead of :func:`hpcnb.paths.cache_root`.
        progress: Wraps the list of configurations (e.g. ``tqdm.auto.tqdm``).

    Returns:
        One :class:`Measurement` per configuration, in grid order.
    """
    path = cache_file(cache_dir)
    cache = _load_cache(path) if use_cache else {"features": {}, "timings": {}}
    t = grid.timing
    jobs = [(fam, w, r) for fam in grid.families for w in grid.widths for r in grid.resolutions]
    rows: list[Measurement] = []
    dirty = False
    for fam, w, r in progress(jobs) if progress else jobs:
        name = f"{fam}_w{w:g}_r{r}"
        shape = (grid.in_channels, r, r)
        torch.manual_seed(grid.seed)
        model = build_network(fam, w, grid.in_channels)
        fkey = f"{name}_c{grid.in_channels}"
        if fkey in cache["features"]:
            feats = NetworkFeatures.from_json(cache["features"][fkey])
        else:
            feats = network_features(model, shape, name=name, family=fam)
            cache["features"][fkey] = feats.to_json()
            dirty = True
        for b in grid.batches:
            tkey = f"{fkey}_b{b}_t{t.threads}_w{t.warmup}_n{t.repeats}_{t.clock}_s{grid.seed}"
            if tkey not in cache["timings"]:
                gen = torch.Generator().manual_seed(grid.seed)
                x = torch.randn(b, *shape, generator=gen)
                y = torch.randint(0, 10, (b,), generator=gen)
                torch.manual_seed(grid.seed)
                model = build_network(fam, w, grid.in_channels)
                inf = time_inference(model, x, t).median
                train = time_training(model, x, y, t).median
                cache["timings"][tkey] = {"inference_s": inf, "training_s": train}
                dirty = True
            entry = cache["timings"][tkey]
            rows.append(Measurement(feats, b, entry["inference_s"], entry["training_s"]))
        if use_cache and dirty:
            _save_cache(path, cache)
            dirty = False
    return rows
