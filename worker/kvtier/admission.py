"""Admission: whether a block a tier does not hold may enter it (eviction decides what leaves).

Pure and tensor-free, like the eviction orders: the trace simulation runs this very code.

- ``always``: every block offered enters (evicting by the tier's order).
- ``doorkeeper``: a block enters on its second sighting. Sightings are counted in a bounded,
  aging frequency sketch (count-min, halved every ``window`` x capacity sightings), so a block
  seen once long ago is forgotten and memory stays fixed. Most KV blocks are used once (the
  Mooncake paper: over half are never reused); refusing them keeps room for those that are.
- ``adaptive``: which of the two wins depends on capacity and load (the doorkeeper wins at
  small capacities and loses where most blocks come back within the cache's reach). It runs
  both on shadow tiers (keys only, a hash-sampled share of the blocks, capacity scaled alike)
  and follows the one whose ghost hits have been higher recently.

A sighting is a request for a block: a hit (``record_hit``) or an offer of a block the tier does
not hold (``admits``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import Protocol

from strata.common.sketchsize import (
    COUNTER_MAX,
    DOORKEEPER_WINDOW,
    PACKED_MAX,
    SKETCH_MAX_BYTES,
    shadows,
    sightings_table_bytes,
    sightings_window,
    sketch_width,
)
from strata.common.sketchsize import SIGHTINGS_MOST as SIGHTINGS_MOST
from strata.common.sketchsize import footprint as footprint
from strata.common.sketchsize import sketch_bytes as sketch_bytes
from strata.worker.kvtier import policy

Key = Hashable
ADMISSIONS = ("always", "doorkeeper", "adaptive")

MASK64 = (1 << 64) - 1
SCORE_HORIZON = 10  # ghost hits are weighed over about this many times the capacity in sightings
EXPORT_SLICE = 1 << 22  # bytes of counters copied per hold of the GIL when exporting
_HALVE = bytes(v >> 1 for v in range(256))
_HALVE_PACKED = bytes((v >> 1) & 0x55 for v in range(256))  # each 2-bit field of a byte halved


def stable_hash(key: Key) -> int:
    """64 well-mixed bits, equal in every process (``hash`` of bytes is salted per process, and
    trace block ids are small consecutive integers). The multiply carries a key's low bits up
    through the word, so keys are read to put what tells them apart low: an integer as it is,
    up to 8 bytes little-endian (the simulator's block ids), longer keys big-endian and folded
    to 64 bits, every byte counting (16-byte keys made from small integers differ only in
    their last bytes; the engine's are hashes, any bits will do)."""
    if isinstance(key, bytes):
        if len(key) <= 8:
            value = int.from_bytes(key, "little")
        else:
            value = int.from_bytes(key, "big")
            while value > MASK64:
                value = (value & MASK64) ^ (value >> 64)
    elif isinstance(key, int):
        value = key
    else:
        value = hash(key)
    value = (value * 0x9E3779B97F4A7C15) & MASK64
    return value ^ (value >> 31)


class FrequencySketch:
    """Count-min sketch of small counters (four rows of ``width`` each, ``width`` the power of
    two at or above ``2 x sample_size``) that halves them all after ``sample_size`` increments:
    recent sightings count, old ones fade, and memory is fixed. Counters of up to 3 (``most``)
    take two bits, the four rows' counters at one column sharing a byte: ``width`` bytes, 32 per
    block of a doorkeeper's capacity. Larger ones take a byte each: ``4 x width`` bytes. At most
    ``max_bytes``: a sketch that would be larger is narrower instead, and less exact (more keys
    share counters, so more pass for seen before), rather than outgrow the sidecar's memory."""

    def __init__(self, sample_size: int, most: int = COUNTER_MAX, max_bytes: int = SKETCH_MAX_BYTES) -> None:
        if not 1 <= most <= 255:
            raise ValueError(f"most: a counter's ceiling must be 1..255, got {most}")
        self.sample_size = max(16, sample_size)
        self.most = most
        packed = most <= PACKED_MAX
        self._width = sketch_width(self.sample_size, most, max_bytes)
        self._mask = self._width - 1
        # Row r's counter for a column: byte ``r x row_bytes + column``, bits from ``shifts[r]``.
        self._row_bytes = 0 if packed else self._width
        self._shifts = (0, 2, 4, 6) if packed else (0, 0, 0, 0)
        self._field = 3 if packed else 255
        self._table = bytearray(self._width if packed else 4 * self._width)
        self._halve = _HALVE_PACKED if packed else _HALVE
        self._added = 0

    def _cells(self, key: Key) -> tuple[int, int, int, int]:
        """The byte holding each row's counter for ``key``."""
        h = stable_hash(key)
        step, mask, row = (h >> 32) | 1, self._mask, self._row_bytes
        return (
            h & mask,
            row + ((h + step) & mask),
            2 * row + ((h + 2 * step) & mask),
            3 * row + ((h + 3 * step) & mask),
        )

    def estimate(self, key: Key) -> int:
        a, b, c, d = self._cells(key)
        table, field, (s0, s1, s2, s3) = self._table, self._field, self._shifts
        return min(
            (table[a] >> s0) & field,
            (table[b] >> s1) & field,
            (table[c] >> s2) & field,
            (table[d] >> s3) & field,
        )

    def increment(self, key: Key) -> int:
        """Count a sighting; returns the estimate before it. Conservative update: only the
        smallest counters grow, which keeps the estimates tight. (Spelt out per row: this runs
        for every block a request names.)"""
        a, b, c, d = self._cells(key)
        table, field, (s0, s1, s2, s3) = self._table, self._field, self._shifts
        va, vb, vc, vd = (
            (table[a] >> s0) & field,
            (table[b] >> s1) & field,
            (table[c] >> s2) & field,
            (table[d] >> s3) & field,
        )
        low = min(va, vb, vc, vd)
        if low < self.most:  # a field below its ceiling: adding at its shift carries nowhere
            if va == low:
                table[a] += 1 << s0
            if vb == low:
                table[b] += 1 << s1
            if vc == low:
                table[c] += 1 << s2
            if vd == low:
                table[d] += 1 << s3
        self._added += 1
        if self._added >= self.sample_size:
            self._table = self._table.translate(self._halve)
            self._added //= 2
        return low

    def export(self) -> tuple[bytearray, int]:
        """A copy of the counters, and the sightings since the last halving. Safe while other
        threads count: it copies a slice at a time (``EXPORT_SLICE``), letting them run in
        between (a doorkeeper's sketch for 4M blocks is 128 MiB), so counters that change meanwhile are taken
        before or after, within what a sketch approximates anyway; a halving replaces the table
        whole, so every slice comes from one table."""
        table, added = self._table, self._added
        copy = bytearray(len(table))
        with memoryview(table) as view:
            for start in range(0, len(table), EXPORT_SLICE):
                copy[start : start + EXPORT_SLICE] = view[start : start + EXPORT_SLICE]
        return copy, added

    def restore(self, table: bytes | bytearray, added: int) -> None:
        """Counters ``export`` gave, of a sketch of the same ``sample_size``."""
        if len(table) != len(self._table) or not 0 <= added < self.sample_size:
            raise ValueError(f"sketch: {len(table)} counters, {added} added; expected {len(self._table)}")
        self._table = bytearray(table)
        self._added = added


@dataclass(frozen=True)
class Learnt:
    """What an admission policy has learnt from the sightings so far, worth keeping across a
    restart (``sightings``): its sketch's counters and, for adaptive, which rule has been
    winning (``score``). Adaptive's shadow tiers are not kept: refilled from scratch they agree
    with the kept score again within the trace replays' first requests."""

    sample_size: int
    table: bytes | bytearray
    added: int
    score: float = 0.0


class Learner(Protocol):
    def learnt(self) -> Learnt | None:
        """What to keep across a restart; None: nothing (``always``)."""
        ...

    def restore(self, learnt: Learnt) -> None:
        """Take back what ``learnt`` gave; ValueError when it does not fit this policy."""
        ...


class SketchLearner:
    """What a policy made of one sketch keeps across a restart: the sketch (a doorkeeper, the
    NVMe tier's sighting counts)."""

    sketch: FrequencySketch

    def learnt(self) -> Learnt:
        table, added = self.sketch.export()
        return Learnt(self.sketch.sample_size, table, added)

    def restore(self, learnt: Learnt) -> None:
        if learnt.sample_size != self.sketch.sample_size:
            raise ValueError(
                f"sketch: {learnt.sample_size} sightings per halving, expected {self.sketch.sample_size}"
            )
        self.sketch.restore(learnt.table, learnt.added)


class SightingCounts(SketchLearner):
    """How often each block was seen (saved or read) lately, for the NVMe tier's
    ``admit_after_hits``: a sketch with counters up to 255, halved every 16 capacities' worth of
    sightings (the doorkeeper's window), at most ``SIGHTINGS_WINDOW``. An estimate, as the
    doorkeeper's: a block may be taken for seen once more than it was where its counters
    collide (rarely: four rows, each twice as wide as the window). At most 8 MiB, where the
    dict of the last million keys it replaces took 168 MiB."""

    MOST = SIGHTINGS_MOST

    def __init__(self, capacity: int) -> None:
        self.sketch = FrequencySketch(sightings_window(capacity), most=self.MOST)

    @staticmethod
    def window(capacity: int) -> int:
        return sightings_window(capacity)

    @classmethod
    def table_bytes(cls, capacity: int) -> int:
        return sightings_table_bytes(capacity)

    def saw(self, key: Key) -> None:
        self.sketch.increment(key)

    def count(self, key: Key) -> int:
        return self.sketch.estimate(key)


class Admission(Learner, Protocol):
    def record_hit(self, key: Key, parent: Key | None) -> None:
        """A requested block the tier holds."""
        ...

    def admits(self, key: Key, parent: Key | None) -> bool:
        """A requested block the tier does not hold: may it enter?"""
        ...

    @property
    def rule(self) -> str:
        """The rule admitting now: ``always`` or ``doorkeeper`` (adaptive follows one)."""
        ...


class Always:
    rule = "always"

    def record_hit(self, key: Key, parent: Key | None) -> None:
        pass

    def admits(self, key: Key, parent: Key | None) -> bool:
        return True

    def learnt(self) -> Learnt | None:
        return None

    def restore(self, learnt: Learnt) -> None:
        raise ValueError("always: learns nothing")


class Doorkeeper(SketchLearner):
    """Admit a block seen before (within about ``window`` x ``capacity`` sightings)."""

    rule = "doorkeeper"

    def __init__(self, capacity: int, window: int = DOORKEEPER_WINDOW) -> None:
        self.sketch = FrequencySketch(window * max(1, capacity))

    def record_hit(self, key: Key, parent: Key | None) -> None:
        self.sketch.increment(key)

    def admits(self, key: Key, parent: Key | None) -> bool:
        return self.sketch.increment(key) > 0


class Shadow:
    """A keys-only tier run under one admission policy, counting its hits (ghost hits)."""

    def __init__(self, capacity: int, eviction: str, admission: Admission) -> None:
        self.capacity = capacity
        self.order = policy.make_order(eviction)
        self.admission = admission
        self.keys: set[Key] = set()
        self.hits = 0
        self._tick = 0

    def access(self, key: Key, parent: Key | None) -> None:
        self._tick += 1
        if key in self.keys:
            self.hits += 1
            self.admission.record_hit(key, parent)
            self.order.touch(key, self._tick)
        elif self.admission.admits(key, parent) or len(self.keys) < self.capacity:  # as TierIndex
            if len(self.keys) >= self.capacity:
                victim = self.order.victim()
                if victim is None:
                    return
                self.order.remove(victim)
                self.keys.discard(victim)
            self.keys.add(key)
            self.order.add(key, parent, 0, self._tick, True)


class Adaptive:
    """Doorkeeper or always, whichever is winning: both run on shadow tiers of a sampled
    ``1/rate`` of the keys (capacity scaled alike), and the difference of their hits, decayed
    over about ``SCORE_HORIZON`` x capacity sightings, picks the rule for the real tier. The
    real tier's doorkeeper counts every sighting either way, so switching is seamless."""

    def __init__(self, capacity: int, eviction: str) -> None:
        self.rate, shadow_capacity = shadows(capacity)
        capacity = max(1, capacity)
        self.always = Shadow(shadow_capacity, eviction, Always())
        self.doorkeeper = Shadow(shadow_capacity, eviction, Doorkeeper(shadow_capacity))
        self.gate = Doorkeeper(capacity)
        self.keep = 1.0 - 1.0 / max(1.0, SCORE_HORIZON * shadow_capacity)
        self.score = 0.0  # > 0: the doorkeeper has been winning

    @property
    def using_doorkeeper(self) -> bool:
        return self.score > 0

    @property
    def rule(self) -> str:
        return "doorkeeper" if self.using_doorkeeper else "always"

    def _shadow(self, key: Key, parent: Key | None) -> None:
        if self.rate > 1 and (stable_hash(key) >> 40) % self.rate:
            return
        before = self.doorkeeper.hits - self.always.hits
        self.always.access(key, parent)
        self.doorkeeper.access(key, parent)
        self.score = self.score * self.keep + (self.doorkeeper.hits - self.always.hits - before)

    def record_hit(self, key: Key, parent: Key | None) -> None:
        self._shadow(key, parent)
        self.gate.record_hit(key, parent)

    def admits(self, key: Key, parent: Key | None) -> bool:
        self._shadow(key, parent)
        seen = self.gate.admits(key, parent)
        return seen or not self.using_doorkeeper

    def learnt(self) -> Learnt:
        return replace(self.gate.learnt(), score=self.score)

    def restore(self, learnt: Learnt) -> None:
        if not math.isfinite(learnt.score):
            raise ValueError(f"score: {learnt.score} is not a finite number")
        self.gate.restore(learnt)
        self.score = learnt.score


def make_admission(name: str, capacity: int, eviction: str) -> Admission:
    makers: dict[str, Callable[[], Admission]] = {
        "always": Always,
        "doorkeeper": lambda: Doorkeeper(capacity),
        "adaptive": lambda: Adaptive(capacity, eviction),
    }
    if name not in makers:
        raise ValueError(f"admission: unknown policy {name!r}; expected one of {ADMISSIONS}")
    return makers[name]()
