"""The DRAM tier's slot table: which block each DRAM slot holds, kept in shared memory beside
the arena (``<dram.shm_path>.slots``), so that a sidecar restarted after a crash or an OOM kill
finds the blocks whose bytes are still in the pod's memory-backed volume.

Its own file, not a header region of the arena: the engine's client computes a slot's offset
as ``slot * slot_bytes`` from the start of ``shm_path`` (and that code is not the sidecar's),
so the arena keeps its layout and the table has its own. It is small: one 64-byte record per
DRAM slot (a cache line each, so a record never straddles two), 8 MiB for 256 GiB of 2 MiB
blocks, and a 64-byte header with the layout (format version, block and slot size, DRAM slot
count, and the arena file's inode, so a recreated arena is not taken for the old one).

A record holds state, key, parent and the block's XXH3-64 checksum, a crc32 of those, and a
sequence number: the order blocks were last saved or used in, for their recency at recovery.
The sequence number is outside the crc so that a DRAM hit renews it with one aligned 8-byte
store (``touch``); a torn one could only misorder recency, never make a block valid.

Why a crash at any instant never makes a torn or stale block look valid:

- A record is written only once its block's bytes are complete in the slot and its checksum
  is known: at ``put`` (the client copied the bytes before sending it), when the sealer has
  hashed it, or when a promotion has read and checked it. Before that the slot has no record
  and a restart ignores it.
- A record is cleared (all 64 bytes zeroed) when its slot is given back, under the sidecar's
  lock, before the slot can go back to the free pool: no one writes into a slot until it is
  handed out again, so while a record is valid its slot holds the bytes it describes. Zeroing
  the whole record, crc included, means a half-written successor can never pair with the old
  record's crc.
- A record written halfway (the process killed in the middle of the 64-byte copy) fails its
  crc32 and is ignored. Both writes are plain stores into a shared mapping: a killed process's
  stores are in the page cache already, nothing needs flushing (a node reboot loses the tmpfs
  anyway).
- Last line of defence: every recovered block is hashed again and must match the record's
  checksum before it is served (see ``recovery``).

Staging slots are never recorded: their blocks are passing through to a lower tier.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"STRKVDT1"
VERSION = 1
HEADER_BYTES = 64
RECORD_BYTES = 64
_HEADER = struct.Struct("<8sIQQQQ")  # magic, version, block_bytes, slot_bytes, slots, arena inode
_BODY = struct.Struct("<B7x16s16sQ")  # state, key, parent, block checksum: what the crc covers
_CRC = struct.Struct("<I")
_RECORD = struct.Struct(f"<{_BODY.size}sI4xQ")  # the body, its crc32, the sequence number (at 56)
_SEQ = struct.Struct("<Q")
SEQ_OFFSET = _RECORD.size - _SEQ.size
CHECKED_BYTES = _BODY.size + _CRC.size  # the bytes a torn write cannot change unnoticed
_pack_body, _pack_record_into, _crc32 = _BODY.pack, _RECORD.pack_into, zlib.crc32  # put path: bound once
VALID = 1
_EMPTY = bytes(RECORD_BYTES)


@dataclass(frozen=True)
class Layout:
    """What the table's records mean: a record is trusted only under the same layout."""

    block_bytes: int
    slot_bytes: int
    slots: int  # DRAM slots (staging slots follow them in the arena and are not recorded)
    arena_inode: int


@dataclass(slots=True)  # a restart holds one a DRAM block until its recovery pass verifies it
class SlotRecord:
    slot: int
    key: bytes
    parent: bytes
    checksum: int
    seq: int


def table_path(shm_path: str | Path) -> Path:
    return Path(f"{shm_path}.slots")


def encode_header(layout: Layout) -> bytes:
    packed = _HEADER.pack(
        MAGIC, VERSION, layout.block_bytes, layout.slot_bytes, layout.slots, layout.arena_inode
    )
    return packed.ljust(HEADER_BYTES, b"\0")


def decode_header(data: bytes) -> Layout | None:
    """The layout a table was written under; None when it is no table of this format."""
    if len(data) < _HEADER.size:
        return None
    magic, version, block_bytes, slot_bytes, slots, inode = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        return None
    return Layout(block_bytes, slot_bytes, slots, inode)


def mismatch(found: Layout | None, wanted: Layout) -> str | None:
    """Why a table written under ``found`` cannot be trusted now; None when it can."""
    if found is None:
        return "no slot table of this format"
    for name in ("block_bytes", "slot_bytes", "slots", "arena_inode"):
        was, now = getattr(found, name), getattr(wanted, name)
        if was != now:
            return f"{name} changed: {was} -> {now}"
    return None


def encode_record(key: bytes, parent: bytes, checksum: int, seq: int) -> bytes:
    body = _BODY.pack(VALID, key, parent, checksum)
    return _RECORD.pack(body, zlib.crc32(body), seq)


def decode_record(slot: int, data: bytes | memoryview) -> SlotRecord | None:
    """The record of ``slot``; None when empty, cleared or torn (crc mismatch)."""
    (crc,) = _CRC.unpack_from(data, _BODY.size)
    body = bytes(data[: _BODY.size])
    if body[0] != VALID or zlib.crc32(body) != crc:
        return None
    _, key, parent, checksum = _BODY.unpack(body)
    (seq,) = _SEQ.unpack_from(data, SEQ_OFFSET)
    return SlotRecord(slot, key, parent, checksum, seq)


def recovery_order(records: Iterable[SlotRecord]) -> tuple[list[SlotRecord], list[SlotRecord]]:
    """(records to recover, least recently saved or used first, so that re-entering them in
    this order keeps their recency; records to drop: a key recorded in two slots keeps only its
    newest record)."""
    newest: dict[bytes, SlotRecord] = {}
    dropped: list[SlotRecord] = []
    for record in sorted(records, key=lambda r: r.seq):
        if record.key in newest:
            dropped.append(newest.pop(record.key))  # re-entered below, at its newer place
        newest[record.key] = record
    for record in newest.values():  # each parent its parent's key object (49 bytes a block)
        parent = newest.get(record.parent)
        if parent is not None:
            record.parent = parent.key
    return list(newest.values()), dropped


class SlotTable:
    """The table file of ``layout.slots`` records. Opening it keeps its records when its header
    matches ``layout`` (``mismatch`` is None), otherwise empties it (``mismatch`` says why).
    Not thread-safe: the sidecar writes it under its lock."""

    def __init__(self, path: str | Path, layout: Layout) -> None:
        self.path = Path(path)
        self.layout = layout
        size = HEADER_BYTES + RECORD_BYTES * layout.slots
        self.mismatch = mismatch(_read_header(self.path), layout)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if self.mismatch is not None or os.fstat(fd).st_size != size:
                self.mismatch = self.mismatch or "slot table has the wrong size"
                os.ftruncate(fd, 0)  # every old record gone before any slot is handed out
                os.ftruncate(fd, size)
                os.pwrite(fd, encode_header(layout), 0)
            # Every page now: on a full memory-backed volume a store into a page the mapping
            # has not got yet would kill the sidecar with SIGBUS; here it is an OSError.
            os.posix_fallocate(fd, 0, size)
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._seq = 0

    def records(self) -> list[SlotRecord]:
        """The valid records (any order); later commits get sequence numbers above theirs."""
        found: list[SlotRecord] = []
        view = memoryview(self._mmap)
        for slot in range(self.layout.slots):
            offset = HEADER_BYTES + slot * RECORD_BYTES
            if view[offset] == VALID:
                record = decode_record(slot, view[offset : offset + RECORD_BYTES])
                if record is not None:
                    found.append(record)
        view.release()
        self._seq = max((r.seq for r in found), default=0)
        return found

    def commit(self, slot: int, key: bytes, parent: bytes, checksum: int) -> None:
        """Record that ``slot`` holds this block (its bytes complete, its checksum taken)."""
        self._seq = seq = self._seq + 1
        body = _pack_body(VALID, key, parent, checksum)  # encode_record, in place
        _pack_record_into(self._mmap, HEADER_BYTES + slot * RECORD_BYTES, body, _crc32(body), seq)

    def touch(self, slot: int) -> None:
        """``slot``'s block was just used: it is the most recent at a restart (one 8-byte store;
        on a slot without a record it stays without one, the crc failing)."""
        self._seq += 1
        _SEQ.pack_into(self._mmap, HEADER_BYTES + slot * RECORD_BYTES + SEQ_OFFSET, self._seq)

    def clear(self, slot: int) -> None:
        """Forget ``slot``'s block: called before the slot can be handed out again."""
        offset = HEADER_BYTES + slot * RECORD_BYTES
        self._mmap[offset : offset + RECORD_BYTES] = _EMPTY

    def close(self) -> None:
        self._mmap.close()


def _read_header(path: Path) -> Layout | None:
    try:
        with open(path, "rb") as table:
            return decode_header(table.read(HEADER_BYTES))
    except OSError:
        return None


def remove(shm_path: str | Path) -> None:
    """``dram.persistent: false``: no table, and none left behind for a later run to trust
    (this run's slots are reused without records)."""
    table_path(shm_path).unlink(missing_ok=True)
