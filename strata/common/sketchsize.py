"""The bytes the KV-tier sidecar's admission sketches take, from the tiers' capacities alone:
the sidecar builds its sketches to these sizes (``strata.worker.kvtier.admission``) and the
operator gives it the memory they need (``kvbudget``), so both read them from here."""

from __future__ import annotations

# A doorkeeper only asks "seen before?": counters of up to 3 (two bits) gave the same hit ratios
# as 4-bit ones (TinyLFU's) on both traces, within 0.0003 at every capacity, at a quarter of the
# memory the byte-wide counters took (32 bytes per block of capacity instead of 128).
COUNTER_MAX = 3
PACKED_MAX = 3  # counters up to this are packed four to a byte
# A sketch's most bytes: 2M blocks' worth of a doorkeeper's (at 32 per block), so that a DRAM and
# an NVMe tier's sketches, the admit_after_hits counts and a save's copy of the largest stay
# within the sidecar's fixed memory overhead (operator/render/pod.py) whatever the block size.
SKETCH_MAX_BYTES = 64 << 20
DOORKEEPER_WINDOW = 16
SHADOW_BLOCKS = 2048  # shadow tiers are sampled down to about this many blocks
SIGHTINGS_WINDOW = 1 << 20  # most sightings between halvings of the NVMe tier's admit_after_hits counts
SIGHTINGS_MOST = 255  # the NVMe tier's admit_after_hits counts: byte-wide counters


def sketch_width(sample_size: int, most: int = COUNTER_MAX, max_bytes: int = SKETCH_MAX_BYTES) -> int:
    """Columns of a frequency sketch (``strata.worker.kvtier.admission``): the power of two at or
    above ``2 x sample_size`` (at least 16 sightings), narrower where its table would outgrow
    ``max_bytes``."""
    column_bytes = 1 if most <= PACKED_MAX else 4
    widest = 1 << max(4, (max_bytes // column_bytes).bit_length() - 1)  # a power of two
    return min(1 << (2 * max(16, sample_size) - 1).bit_length(), widest)


def sketch_bytes(sample_size: int, most: int = COUNTER_MAX, max_bytes: int = SKETCH_MAX_BYTES) -> int:
    """The table a frequency sketch of these parameters takes."""
    width = sketch_width(sample_size, most, max_bytes)
    return width if most <= PACKED_MAX else 4 * width


def shadows(capacity: int) -> tuple[int, int]:
    """An adaptive policy's sampling rate (one key in ``rate``) and its shadow tiers' capacity."""
    capacity = max(1, capacity)
    rate = max(1, capacity // SHADOW_BLOCKS)
    return rate, max(1, capacity // rate)


def footprint(name: str, capacity: int) -> tuple[int, int]:
    """What the policy ``name`` holds for a tier of ``capacity`` blocks: its sketches' bytes,
    and the keys its shadow tiers index (keys and eviction order only, no data)."""
    if name == "always":
        return 0, 0
    gate = sketch_bytes(DOORKEEPER_WINDOW * max(1, capacity))
    if name == "doorkeeper":
        return gate, 0
    _, shadow_capacity = shadows(capacity)
    return gate + sketch_bytes(DOORKEEPER_WINDOW * shadow_capacity), 2 * shadow_capacity


def sightings_window(capacity: int) -> int:
    """Sightings between halvings of the NVMe tier's admit_after_hits counts."""
    return min(SIGHTINGS_WINDOW, DOORKEEPER_WINDOW * max(1, capacity))


def sightings_table_bytes(capacity: int) -> int:
    return sketch_bytes(sightings_window(capacity), SIGHTINGS_MOST)
