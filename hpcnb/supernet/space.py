"""The elastic search space of a supernet: dimensions, subnet configurations, sampling.

A :class:`SearchSpace` is a list of :class:`Dimension` objects. Each dimension is one
channel group of the IR (a width or a number of attention heads) or one skippable
residual block (depth). A :class:`SubnetConfig` holds one chosen value per dimension,
in the order of the space. The space knows nothing of models; :class:`~hpcnb.supernet.
supernet.Supernet` turns a configuration into ``keep``/``skip_blocks`` for
:func:`hpcnb.ir.extract`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from hpcnb.errors import InvalidInputError

__all__ = ["Dimension", "SearchSpace", "SubnetConfig", "width_choices"]

_KINDS = ("width", "heads", "depth")


def width_choices(size: int, ratios: Sequence[float], minimum: int = 1) -> tuple[int, ...]:
    """Return the distinct kept sizes ``round(size * r)`` for each ratio, ascending.

    Args:
        size: Full size of the dimension (channels, hidden units or heads).
        ratios: Fractions in (0, 1] of the full size.
        minimum: Smallest size allowed.

    Raises:
        InvalidInputError: A ratio is outside (0, 1] or ``size`` is below 1.
    """
    if size < 1:
        raise InvalidInputError(f"size={size}: a dimension needs at least one element")
    out = set()
    for r in ratios:
        if not 0 < r <= 1:
            raise InvalidInputError(f"width ratio {r}: expected a fraction in (0, 1]")
        out.add(min(size, max(minimum, math.ceil(size * r - 1e-9))))
    out.add(size)
    return tuple(sorted(out))


@dataclass(frozen=True)
class Dimension:
    """One elastic dimension of the space.

    Attributes:
        name: Identifier of the IR object it controls (a group id or a block id).
        kind: ``"width"`` (channels / hidden units), ``"heads"`` or ``"depth"``.
        choices: Allowed values, ascending. For depth: ``(0, 1)`` (0 = skip the block).
        full: Size of the dimension in the supernet (1 for depth).
        label: Human-readable description (parameter names it slices).
    """

    name: str
    kind: str
    choices: tuple[int, ...]
    full: int
    label: str = ""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise InvalidInputError(f"dimension {self.name!r}: kind {self.kind!r} not in {_KINDS}")
        if not self.choices or list(self.choices) != sorted(set(self.choices)):
            raise InvalidInputError(
                f"dimension {self.name!r}: choices {self.choices} must be distinct, ascending"
            )
        if self.choices[-1] != self.full:
            raise InvalidInputError(
                f"dimension {self.name!r}: the largest choice {self.choices[-1]} must equal "
                f"the full size {self.full}"
            )


@dataclass(frozen=True)
class SubnetConfig:
    """One subnet: a value for each dimension of a :class:`SearchSpace`, in order.

    Attributes:
        values: The chosen value per dimension.
    """

    values: tuple[int, ...]

    def key(self) -> str:
        """Return a short string that identifies the configuration."""
        return "-".join(str(v) for v in self.values)

    def to_list(self) -> list[int]:
        """Return the values as a JSON-friendly list."""
        return [int(v) for v in self.values]


class SearchSpace:
    """A product space of elastic dimensions.

    Args:
        dims: The dimensions, in a fixed order.

    Raises:
        InvalidInputError: Two dimensions share a name.
    """

    def __init__(self, dims: Sequence[Dimension]) -> None:
        names = [d.name for d in dims]
        if len(set(names)) != len(names):
            raise InvalidInputError(f"search space: duplicate dimension names in {names}")
        self.dims: tuple[Dimension, ...] = tuple(dims)

    def __len__(self) -> int:
        return len(self.dims)

    def __repr__(self) -> str:
        kinds = {k: sum(d.kind == k for d in self.dims) for k in _KINDS}
        return f"SearchSpace({len(self.dims)} dims {kinds}, size {self.size():.3g})"

    def size(self) -> float:
        """Return the number of distinct configurations (a float; it can be huge)."""
        return float(np.prod([len(d.choices) for d in self.dims], dtype=np.float64))

    def max(self) -> SubnetConfig:
        """Return the largest configuration (the supernet itself)."""
        return SubnetConfig(tuple(d.choices[-1] for d in self.dims))

    def min(self) -> SubnetConfig:
        """Return the smallest configuration."""
        return SubnetConfig(tuple(d.choices[0] for d in self.dims))

    def sample(self, rng: np.random.Generator) -> SubnetConfig:
        """Draw a configuration uniformly (each dimension independently)."""
        return SubnetConfig(tuple(int(d.choices[rng.integers(len(d.choices))]) for d in self.dims))

    def validate(self, config: SubnetConfig) -> SubnetConfig:
        """Check that ``config`` belongs to this space and return it.

        Raises:
            InvalidInputError: Wrong length or a value not among a dimension's choices.
        """
        if len(config.values) != len(self.dims):
            raise InvalidInputError(
                f"config has {len(config.values)} values, the space has {len(self.dims)} dims"
            )
        for d, v in zip(self.dims, config.values, strict=True):
            if v not in d.choices:
                raise InvalidInputError(
                    f"config value {v} for dimension {d.name!r} not in {d.choices}"
                )
        return config

    def mutate(
        self, config: SubnetConfig, rng: np.random.Generator, prob: float = 0.2
    ) -> SubnetConfig:
        """Return a copy of ``config`` with each value moved to a neighbouring choice.

        Args:
            config: The parent.
            rng: Random generator.
            prob: Probability that a dimension changes (at least one always does).
        """
        values = list(config.values)
        changed = False
        for i, d in enumerate(self.dims):
            if len(d.choices) > 1 and rng.random() < prob:
                values[i] = self._step(d, values[i], rng)
                changed = True
        if not changed:
            movable = [i for i, d in enumerate(self.dims) if len(d.choices) > 1]
            if movable:
                i = int(rng.choice(movable))
                values[i] = self._step(self.dims[i], values[i], rng)
        return SubnetConfig(tuple(values))

    @staticmethod
    def _step(d: Dimension, value: int, rng: np.random.Generator) -> int:
        idx = d.choices.index(value)
        moves = [j for j in (idx - 1, idx + 1) if 0 <= j < len(d.choices)]
        return int(d.choices[int(rng.choice(moves))])

    def crossover(self, a: SubnetConfig, b: SubnetConfig, rng: np.random.Generator) -> SubnetConfig:
        """Return a uniform crossover of two configurations.

        Args:
            a: First parent.
            b: Second parent.
            rng: Generator of the per-dimension coin flips.
        """
        pick = rng.random(len(self.dims)) < 0.5
        return SubnetConfig(
            tuple(int(x if p else y) for x, y, p in zip(a.values, b.values, pick, strict=True))
        )

    def enumerate(self, limit: int = 100_000) -> Iterator[SubnetConfig]:
        """Yield every configuration (for exhaustive search of small spaces).

        Raises:
            InvalidInputError: The space has more than ``limit`` configurations.
        """
        if self.size() > limit:
            raise InvalidInputError(
                f"search space has {self.size():.3g} configurations, above limit={limit}; "
                "use evolutionary search"
            )
        for combo in np.ndindex(*[len(d.choices) for d in self.dims]):
            yield SubnetConfig(
                tuple(int(d.choices[i]) for d, i in zip(self.dims, combo, strict=True))
            )

    def fraction(self, config: SubnetConfig) -> float:
        """Return the mean kept fraction over dimensions (1.0 for the max config)."""
        fr = [
            v / d.full if d.kind != "depth" else float(v)
            for d, v in zip(self.dims, config.values, strict=True)
        ]
        return float(np.mean(fr)) if fr else 1.0

    def describe(self, config: SubnetConfig) -> dict[str, int]:
        """Return ``{dimension name: value}`` for a configuration."""
        self.validate(config)
        return {d.name: int(v) for d, v in zip(self.dims, config.values, strict=True)}
