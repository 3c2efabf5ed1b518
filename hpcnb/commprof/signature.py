"""Signature memories: DiscoPoP's asymmetric signature and our tagged granule signature.

A signature memory answers, like the exact shadow, "who wrote this word last, and has this
thread read it since?", in a fixed number of slots however many words a program touches.
Budgets are stated in *slots per distinct word* (spw): a kernel touching ``n`` distinct words
profiled at spw ``s`` gets ``round(s * n)`` slots in all (the granule design rounds that down
to a power of two unless told not to, :class:`SignatureSpec`), and bytes per slot and per
distinct word are reported beside the exact hash table's.

**DiscoPoP's design** (Mazaheri et al., ICPP 2015, as far as its abstract describes it;
the table shapes are our reading): a write table holding the last writer per slot and a
read table holding the last reader since the slot's last write, one byte each, indexed by
``((addr >> 8) + addr) mod slots``; "asymmetric" = the two tables have separately chosen
sizes (``read_share`` of the slots). With fewer slots than words, words that share a slot
share its writer and reader: a read can see another word's writer (a false event) or be
suppressed by another word's reader (a missed one).

**Our design, ``granule``** (this module's contribution): one table of slots, each holding
a granule of ``G`` consecutive 8-byte words (``G`` = 1, 2 or 4, a tuning parameter):

* *Locality-preserving index.* Granule ``k = word >> log2(G)`` goes to slot ``k mod m``
  (hash ``modulo``; ``fibonacci`` hashes ``k`` multiplicatively instead), by a mask for a
  power-of-two ``m`` and otherwise by a multiplication with ``1 / m``
  (:func:`hpcnb.commprof.hooks.reduce_range`), never a division. In block decompositions
  consecutive words have one writer and one set of readers, and a contiguous range of ``n``
  words fills ``n / G`` slots without a collision.
* *Writers.* One writer byte per word of the granule (a word not written since the slot
  took the granule has an unknown writer, and reading it is no event).
* *Tags.* The slot keeps ``tag_bits`` bits (31 by default) of the quotient ``k // m`` in a
  uint32 whose top bit says whether its reader bits are in use (so a write to a slot without
  readers touches only the tag and the writer byte): a
  read whose tag differs from the slot's finds "writer unknown" and reports nothing, where
  DiscoPoP's table reports the colliding word's writer. Writes allocate the slot (evicting
  the previous granule, whose writers and readers are forgotten together); reads do not.
* *Readers.* 64 reader bits per slot: the set of threads that read each word since its write
  when ``G * T <= 64`` (exact suppression), otherwise the last reader and the words it read.
* *Bytes.* ``12 + G`` per slot (4-byte tag word, ``G`` writer bytes, 8 bytes of reader bits):
  16 bytes per slot, 4 bytes per distinct word at ``G = 4`` and a quarter slot per word,
  against 34 to 68 for the exact hash table (:func:`hpcnb.commprof.shadow.exact_table_bytes`).

Errors of the granule design: evictions only lose events (recall); false events need a tag
alias, two granules in one slot whose quotients agree in their low ``tag_bits`` bits, or, in
the last-reader mode only, a thread that reads a value again after another thread read the
same granule. With at least one slot per granule of a contiguous range of words (e.g. one
slot per word, order-preserving hash, ``G * T <= 64``) nothing is lost or aliased, and the
matrices equal the exact memory's.

Under the model of :func:`random_trace` (``n`` words at independent uniform random
addresses, so one word per granule; every word written once, in random order, by a uniform
random thread; then every word read once, in random order, by a uniform random thread) a
read of word ``a`` finds its own granule in its slot with probability

    h = (m / n) * (1 - (1 - 1/m)**n)        (the slot holds the last-written of its words)

and otherwise another word ``x`` whose tag matches with probability ``2**-b``; the event is
then false unless ``x``'s writer is the reader (no event) or equals ``a``'s writer (the right
event by luck), probability ``((T - 1) / T)**2``, and unless the reader's bit is already set
in the slot: ``x`` itself is read once, before ``a`` with probability 1/2 and by ``a``'s
reader with probability ``1/T`` (that read was an event, so it set the bit). The
false-positive rate per read is therefore

    FP = (1 - h) * 2**-b * ((T - 1) / T)**2 * (1 - 1 / (2 T))

to first order in the aliasing reads per slot, ``2**-b * n / m``; the neglected terms are
further suppressions by other aliasing reads of the same thread, so ``FP`` is also an upper
bound of the expected rate, tight when ``2**-b * n / m`` is small (within about 10 % at
``b >= 4`` and ``n / m <= 16``). :func:`false_positive_bound` evaluates it;
:func:`hpcnb.commprof.shadow.false_positive_rate` measures it. At ``b = 31`` it is below
``1e-9`` per read at a quarter slot per word; at ``b = 0`` (no tags: DiscoPoP's write-table
collisions) it stays an upper bound but a loose one, as aliasing reads per slot are then
frequent.

Which ``G``, hash (and for DiscoPoP, hash and ``read_share``) a profiler ships with is a
tuning step: :func:`hpcnb.commprof.shadow.signature_sweep_spw` sweeps :func:`default_specs`
and :func:`hpcnb.commprof.shadow.choose_signature` picks on tuning kernels only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import hpcnb.commprof.hooks as hooks
from hpcnb.commprof.runtime import MemoryConfig, slot_bytes
from hpcnb.errors import InvalidInputError

__all__ = [
    "DESIGNS",
    "SPW_BUDGETS",
    "SignatureSpec",
    "default_specs",
    "false_positive_bound",
    "random_trace",
    "signature_slots",
]

#: Signature designs (:data:`hpcnb.commprof.hooks.SIGNATURE_DESIGNS`).
DESIGNS = tuple(hooks.SIGNATURE_DESIGNS)
#: Budgets in slots per distinct word, from one slot per word to one per 16 words.
SPW_BUDGETS = (1.0, 1 / 2, 1 / 4, 1 / 8, 1 / 16)


@dataclass(frozen=True)
class SignatureSpec:
    """A signature configuration independent of the budget.

    Attributes:
        design: ``"discopop"`` or ``"granule"``.
        hash: Hash name the design accepts (:data:`hpcnb.commprof.hooks.DESIGN_HASHES`).
        read_share: DiscoPoP: share of the slots given to the read table (0 < share < 1);
            0 for the granule design.
        granule: Granule design: words per slot (1, 2 or 4); 1 for DiscoPoP.
        tag_bits: Granule design: tag bits per slot (0 to 31).
        pow2: Granule design: round the table down to a power of two within the budget
            (slot and tag by masks and shifts; otherwise exactly the budget's slots, reduced
            by :func:`hpcnb.commprof.hooks.reduce_range`).

    Raises:
        InvalidInputError: An unknown design or hash, a hash the design does not accept, a
            read share out of (0, 1) for DiscoPoP or non-zero for the granule design, or a
            granule or tag width out of range.
    """

    design: str = "granule"
    hash: str = "modulo"
    read_share: float = 0.0
    granule: int = 4
    tag_bits: int = hooks.MAX_TAG_BITS
    pow2: bool = True

    def __post_init__(self) -> None:
        if self.design not in hooks.SIGNATURE_DESIGNS:
            raise InvalidInputError(
                f"signature design {self.design!r}: expected one of {sorted(DESIGNS)}"
            )
        if self.design == "discopop" and not 0 < self.read_share < 1:
            raise InvalidInputError(
                f"read_share={self.read_share}: the discopop design needs 0 < read_share < 1"
            )
        if self.design == "granule" and self.read_share != 0:
            raise InvalidInputError(
                f"read_share={self.read_share}: the granule design has one table (use 0)"
            )
        self.memory(1)  # validates hash, granule and tag width

    def slots(self, n_words: int, spw: float) -> tuple[int, int]:
        """Write and read slots at ``spw`` slots per distinct word.

        DiscoPoP: ``spw * n`` slots split by ``read_share`` and made odd
        (:func:`signature_slots`); granule: ``(round(spw * n), 0)``, rounded down to a power
        of two when ``pow2``.

        Args:
            n_words: Distinct words the kernel touches (>= 1).
            spw: Slots per distinct word (> 0).

        Raises:
            InvalidInputError: ``n_words`` < 1 or ``spw`` not positive.
        """
        if n_words < 1 or not spw > 0:
            raise InvalidInputError(f"need n_words >= 1 and spw > 0, got {n_words}, {spw}")
        if self.design == "granule":
            budget = max(1, round(spw * n_words))
            return (1 << (budget.bit_length() - 1) if self.pow2 else budget), 0
        return signature_slots(n_words, spw, self.read_share)

    def memory(self, write_slots: int, read_slots: int = 0, *, exact: bool = False) -> MemoryConfig:
        """The :class:`~hpcnb.commprof.runtime.MemoryConfig` of this spec with given slots.

        Args:
            write_slots: Write-table slots (granule: all slots).
            read_slots: Read-table slots (DiscoPoP only).
            exact: Also keep the exact shadow memory.
        """
        return MemoryConfig(
            exact=exact,
            write_slots=int(write_slots),
            read_slots=int(read_slots),
            hash=self.hash,
            design=self.design,
            granule=self.granule if self.design == "granule" else 1,
            tag_bits=self.tag_bits,
        )

    @property
    def slot_bytes(self) -> int:
        """Bytes per slot (:func:`hpcnb.commprof.runtime.slot_bytes`)."""
        return slot_bytes(self.design, self.granule)

    @property
    def label(self) -> str:
        """Short name, e.g. ``granule G=4 modulo tag31 pow2`` or ``discopop discopop r=0.25``."""
        if self.design == "granule":
            size = " pow2" if self.pow2 else ""
            return f"granule G={self.granule} {self.hash} tag{self.tag_bits}{size}"
        return f"discopop {self.hash} r={self.read_share:g}"

    def row(self) -> dict[str, str | float | int]:
        """The spec's fields as sweep-row columns (``design``, ``hash``, ``read_share``, ...)."""
        return {
            "design": self.design,
            "hash": self.hash,
            "read_share": float(self.read_share),
            "granule": int(self.granule),
            "tag_bits": int(self.tag_bits),
            "pow2": int(self.pow2),
        }


def signature_slots(exact_bytes: int, fraction: float, read_share: float) -> tuple[int, int]:
    """Write and read slots of a DiscoPoP signature of ``fraction * exact_bytes`` one-byte slots.

    ``read = share * budget`` and ``write = budget - read`` slots of one byte each, both
    made odd (the DiscoPoP hash of 8-byte-aligned addresses would otherwise use only part
    of an even-sized table). With ``exact_bytes`` = distinct words, ``fraction`` is the
    budget in slots per word.

    Args:
        exact_bytes: Bytes of the exact shadow memory (or distinct words).
        fraction: Share of those bytes (or slots per word) the signature gets.
        read_share: Share of the signature's bytes given to the read table.

    Raises:
        InvalidInputError: ``fraction`` not positive or ``read_share`` not in (0, 1).
    """
    if fraction <= 0 or not 0 < read_share < 1:
        raise InvalidInputError(
            f"need fraction > 0 and 0 < read_share < 1, got {fraction}, {read_share}"
        )
    budget = int(fraction * exact_bytes)
    sr = max(1, int(read_share * budget) - 1) | 1
    sw = max(1, budget - sr - 1) | 1
    return sw, sr


def default_specs(
    designs: tuple[str, ...] = DESIGNS,
    granules: tuple[int, ...] = (1, 2, 4),
    read_shares: tuple[float, ...] = (0.1, 0.25, 0.5),
    pow2s: tuple[bool, ...] = (True,),
) -> list[SignatureSpec]:
    """The tuning grid: each design's hashes x its own parameters.

    Args:
        designs: Designs to include.
        granules: Granule design: words per slot.
        read_shares: DiscoPoP: read-table shares.
        pow2s: Granule design: power-of-two tables, exact budgets, or both.

    Raises:
        InvalidInputError: An unknown design, or a bad granule or share.
    """
    out: list[SignatureSpec] = []
    for d in designs:
        if d not in hooks.SIGNATURE_DESIGNS:
            raise InvalidInputError(f"signature design {d!r}: expected one of {sorted(DESIGNS)}")
        for h in hooks.DESIGN_HASHES[d]:
            if d == "granule":
                out += [
                    SignatureSpec("granule", h, 0.0, g, hooks.MAX_TAG_BITS, p)
                    for g in granules
                    for p in pow2s
                ]
            else:
                out += [SignatureSpec("discopop", h, s, 1) for s in read_shares]
    return out


def false_positive_bound(spw: float, tag_bits: int, nthreads: int, n_words: int = 1 << 16) -> float:
    """Upper bound of the granule design's false events per read (module docstring).

    Args:
        spw: Slots per distinct word (> 0).
        tag_bits: Tag bits per slot (0 to 31).
        nthreads: Threads (>= 1).
        n_words: Distinct words of the model (>= 1).

    Returns:
        ``(1 - h) * 2**-tag_bits * ((T - 1) / T)**2 * (1 - 1 / (2 T))`` with
        ``h = (m / n) * (1 - (1 - 1/m)**n)``, ``m = max(1, round(spw * n))``.

    Raises:
        InvalidInputError: A value out of range.
    """
    if not spw > 0 or nthreads < 1 or n_words < 1 or not 0 <= tag_bits <= hooks.MAX_TAG_BITS:
        raise InvalidInputError(
            f"need spw > 0, nthreads >= 1, n_words >= 1, 0 <= tag_bits <= "
            f"{hooks.MAX_TAG_BITS}; got {spw}, {nthreads}, {n_words}, {tag_bits}"
        )
    n = float(n_words)
    m = float(max(1, round(spw * n_words)))
    hit = (m / n) * (1.0 - (1.0 - 1.0 / m) ** n) if m > 1 else 1.0 / n
    T = float(nthreads)
    return (1.0 - hit) * 2.0**-tag_bits * ((T - 1) / T) ** 2 * (1 - 1 / (2 * T))


def random_trace(n_words: int, nthreads: int, seed: int = 0, span_bits: int = 44) -> np.ndarray:
    """A trace of the bound's model: random words, written once, then read once.

    Every one of ``n_words`` distinct 8-byte words at independent uniform random addresses
    below ``2**span_bits`` (so almost surely one word per granule) is written once, in a
    random order, by a uniform random thread; then every word is read once, in another
    random order, by a uniform random thread. One region, one phase.

    Args:
        n_words: Distinct words (>= 1).
        nthreads: Threads (1..64).
        seed: Seed.
        span_bits: Address range in bits (16 to 50).

    Returns:
        ``int64[2 * n_words, 6]`` trace (columns :data:`hpcnb.commprof.hooks.TRACE_COLUMNS`;
        the element column numbers the words 0..n-1 for the exact memory).

    Raises:
        InvalidInputError: A value out of range, or fewer word addresses than words.
    """
    if n_words < 1 or not 1 <= nthreads <= 64 or not 16 <= span_bits <= 50:
        raise InvalidInputError(
            f"need n_words >= 1, 1 <= nthreads <= 64, 16 <= span_bits <= 50; "
            f"got {n_words}, {nthreads}, {span_bits}"
        )
    if n_words > 1 << (span_bits - 4):
        raise InvalidInputError(f"{n_words} words do not fit sparsely in 2**{span_bits} bytes")
    rng = np.random.default_rng(seed)
    words = np.unique(rng.integers(0, 1 << (span_bits - 3), size=2 * n_words + 16))
    words = rng.permutation(words)[:n_words]
    if len(words) < n_words:
        raise InvalidInputError(f"could not draw {n_words} distinct words")
    tr = np.zeros((2 * n_words, 6), np.int64)
    for half, order in enumerate((rng.permutation(n_words), rng.permutation(n_words))):
        rows = slice(half * n_words, (half + 1) * n_words)
        tr[rows, 0] = rng.integers(0, nthreads, n_words)
        tr[rows, 2] = order
        tr[rows, 3] = words[order] << 3
        tr[rows, 4] = 1 - half
    return tr
