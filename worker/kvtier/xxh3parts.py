"""XXH3-64 of a long input taken apart, so that a GPU can compute the part that reads the bytes
(:mod:`~strata.worker.kvtier.devicehash`) and the host finishes it: the same value as
:func:`~strata.worker.kvtier.arena.checksum`, so a block hashed on the GPU is checked by the
sidecar, the NVMe tier and recovery like any other.

XXH3 over more than 240 bytes (xxhash.h's ``XXH3_hashLong_64``): eight 64-bit accumulators; the
input is read in stripes of 64 bytes, 16 stripes to a 1 KiB block, stripe ``s`` keyed by the
secret's bytes from ``8 * s``; after each whole block the accumulators are scrambled. The last,
partial block's stripes are keyed the same way, then the input's last 64 bytes with the
secret's bytes from 121; the accumulators are then merged into one word and avalanched. The
accumulation is all the work (it reads the block). Here: the layout, the keys and the merge's
start, as plain ints (no torch, no GPU).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from strata.worker.kvtier import native

MASK64 = (1 << 64) - 1
PRIME32_1 = 0x9E3779B1
PRIME32_2 = 0x85EBCA77
PRIME32_3 = 0xC2B2AE3D
PRIME64_1 = 0x9E3779B185EBCA87
PRIME64_2 = 0xC2B2AE3D27D4EB4F
PRIME64_3 = 0x165667B19E3779F9
PRIME64_4 = 0x85EBCA77C2B2AE63
PRIME64_5 = 0x27D4EB2F165667C5
PRIME_MX1 = 0x165667919E3779F9
INITIAL_ACCS = (PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1)

STRIPE_BYTES = 64
STRIPES_PER_BLOCK = 16  # (secret bytes - a stripe) / 8: each stripe's key starts 8 bytes on
BLOCK_BYTES = STRIPE_BYTES * STRIPES_PER_BLOCK
LANES = 8  # accumulators, one per 8-byte word of a stripe
SECRET_BYTES = 192
LAST_STRIPE_KEY_START = SECRET_BYTES - STRIPE_BYTES - 7  # XXH_SECRET_LASTACC_START
MERGE_KEY_START = 11  # XXH_SECRET_MERGEACCS_START
SMALLEST = 241  # shorter inputs take XXH3's other paths, which read no stripes


@dataclass(frozen=True)
class Layout:
    """Where a ``length``-byte input's stripes fall, in 8-byte words."""

    length: int
    whole_blocks: int  # blocks of 16 stripes, each followed by a scramble
    tail_stripes: int  # stripes of the partial block after them (no scramble)
    last_word: int  # the first word of the last 64 bytes, hashed with their own key


def layout(length: int) -> Layout:
    """The layout of an input the GPU path hashes: longer than 240 bytes, whole words."""
    if length < SMALLEST or length % 8:
        raise ValueError(f"length: the GPU hash takes whole 8-byte words over 240 bytes, got {length}")
    whole = (length - 1) // BLOCK_BYTES
    tail = ((length - 1) - whole * BLOCK_BYTES) // STRIPE_BYTES
    return Layout(length, whole, tail, (length - STRIPE_BYTES) // 8)


@functools.cache
def secret() -> bytes:
    """XXH3's default secret, from the host's own copy of xxhash (one copy of the 192 bytes): the
    compiled copy-and-checksum's, else the system header's. RuntimeError where there is neither."""
    routine = native.copyhash()
    data = routine.secret() if routine is not None else from_header(native.header())
    if len(data) != SECRET_BYTES:
        raise RuntimeError(f"XXH3's secret has {len(data)} bytes, not {SECRET_BYTES}")
    return data


def available() -> bool:
    """Whether the secret can be had here (the GPU's hash needs it)."""
    try:
        secret()
    except RuntimeError:
        return False
    return True


def from_header(header: Path | None) -> bytes:
    if header is None:
        raise RuntimeError("no xxhash.h and no compiled copy-and-checksum: install libxxhash-dev")
    text = header.read_text()
    table = re.search(r"XXH3_kSecret\[XXH_SECRET_DEFAULT_SIZE\]\s*=\s*\{([^}]*)\}", text)
    if table is None:
        raise RuntimeError(f"{header}: XXH3_kSecret not found")
    return bytes(int(byte, 16) for byte in re.findall(r"0x([0-9a-fA-F]{2})", table.group(1)))


def _word(offset: int) -> int:
    return int.from_bytes(secret()[offset : offset + 8], "little")


def stripe_keys() -> list[int]:
    """The keys of a block's words, row by stripe: stripe ``s``, lane ``i`` is keyed by the
    secret's word at byte ``8 * (s + i)``."""
    return [_word(8 * (s + i)) for s in range(STRIPES_PER_BLOCK) for i in range(LANES)]


def scramble_keys() -> list[int]:
    return [_word(SECRET_BYTES - STRIPE_BYTES + 8 * i) for i in range(LANES)]


def last_stripe_keys() -> list[int]:
    return [_word(LAST_STRIPE_KEY_START + 8 * i) for i in range(LANES)]


@functools.cache
def merge_keys() -> tuple[int, ...]:
    return tuple(_word(MERGE_KEY_START + 8 * i) for i in range(LANES))


def start(length: int) -> int:
    """Where a ``length``-byte input's merge starts."""
    return (length * PRIME64_1) & MASK64
