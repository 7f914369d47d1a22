"""The NVMe tier's storage: one preallocated data file of fixed-size slots and an append-only
index log, so that a restarted sidecar finds its blocks again.

Ordering makes a block durable: its data is written and ``fdatasync``-ed before its index
record is appended and the log ``fsync``-ed; only then is the block *committed*. A crash loses
at most uncommitted blocks. A record whose slot was later overwritten without a committed
record is caught by the block checksum on read, so a torn block is never served. Each record
carries its own crc32, so a torn tail of the log is cut off on replay.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import struct
import zlib
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_RECORD = struct.Struct("<B16s16sIiQ")  # op, key, parent, slot, priority, block checksum
_CRC = struct.Struct("<I")
RECORD_BYTES = _RECORD.size + _CRC.size
OP_PUT, OP_DEL = 1, 2
FORMAT_VERSION = 2


@dataclass(frozen=True)
class Record:
    key: bytes
    parent: bytes
    slot: int
    priority: int
    checksum: int


def encode(op: int, record: Record) -> bytes:
    body = _RECORD.pack(op, record.key, record.parent, record.slot, record.priority, record.checksum)
    return body + _CRC.pack(zlib.crc32(body))


def decode_log(data: bytes) -> tuple[dict[bytes, Record], int]:
    """Live records after replaying ``data``, and the length of its intact prefix."""
    live: dict[bytes, Record] = {}
    by_slot: dict[int, bytes] = {}
    offset = 0
    while offset + RECORD_BYTES <= len(data):
        body = data[offset : offset + _RECORD.size]
        (crc,) = _CRC.unpack_from(data, offset + _RECORD.size)
        if zlib.crc32(body) != crc:
            break
        op, key, parent, slot, priority, block_crc = _RECORD.unpack(body)
        if op == OP_PUT:
            previous = by_slot.get(slot)
            if previous is not None:
                live.pop(previous, None)
            if key in live:
                by_slot.pop(live[key].slot, None)
            live[key] = Record(key, parent, slot, priority, block_crc)
            by_slot[slot] = key
        elif op == OP_DEL and key in live:
            by_slot.pop(live.pop(key).slot, None)
        offset += RECORD_BYTES
    return live, offset


class NvmeStore:
    """Slots on disk. Not thread-safe for index changes: the sidecar calls it under its lock;
    the data I/O of a batch runs on ``io_threads`` threads."""

    def __init__(
        self, directory: str | Path, slot_bytes: int, block_bytes: int, num_slots: int, io_threads: int
    ) -> None:
        self.directory = Path(directory)
        self.slot_bytes = slot_bytes
        self.block_bytes = block_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        self._data_path = self.directory / "blocks.dat"
        self._log_path = self.directory / "index.log"
        self._meta_path = self.directory / "meta.json"
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="kvtier-nvme")
        self._data_fd = os.open(self._data_path, os.O_RDWR | os.O_CREAT, 0o600)
        self.num_slots = self._preallocate(num_slots)
        self._log_fd = os.open(self._log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        self._log_records = 0

    def _preallocate(self, num_slots: int) -> int:
        """Reserve the data file's blocks now, so a full disk shows up at start as a smaller
        tier instead of failed writes later. Halves the request until it fits."""
        while num_slots > 0:
            try:
                os.posix_fallocate(self._data_fd, 0, num_slots * self.slot_bytes)
                return num_slots
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                    raise
                log.warning("nvme: cannot preallocate %d slots (%s); trying fewer", num_slots, err)
                num_slots //= 2
        return 0

    def recover(self, persistent: bool) -> dict[bytes, Record]:
        """Committed blocks of a previous run (when ``persistent`` and the layout matches);
        otherwise an empty index. Either way the log is rewritten compactly."""
        live: dict[bytes, Record] = {}
        if persistent and self._meta_matches():
            live, _ = decode_log(self._log_path.read_bytes())
            live = {k: r for k, r in live.items() if r.slot < self.num_slots}
        self._rewrite_log(live.values())
        self._meta_path.write_text(json.dumps(self._meta()))
        return live

    def _meta(self) -> dict[str, int]:
        return {"version": FORMAT_VERSION, "slot_bytes": self.slot_bytes, "block_bytes": self.block_bytes}

    def _meta_matches(self) -> bool:
        try:
            return bool(json.loads(self._meta_path.read_text()) == self._meta())
        except (OSError, ValueError):
            return False

    def _rewrite_log(self, records: Iterable[Record]) -> None:
        tmp = self._log_path.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            count = 0
            for record in records:
                out.write(encode(OP_PUT, record))
                count += 1
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self._log_path)
        _fsync_dir(self.directory)
        os.close(self._log_fd)
        self._log_fd = os.open(self._log_path, os.O_RDWR | os.O_APPEND)
        self._log_records = count

    def compact_if_needed(self, live: Sequence[Record]) -> None:
        if self._log_records > 4 * len(live) + 4096:
            self._rewrite_log(live)

    def write(self, batch: Sequence[tuple[Record, memoryview]]) -> None:
        """Write each block to its slot, then commit their records. Raises OSError (e.g.
        ENOSPC) before anything is committed if a write fails."""
        if not batch:
            return
        list(self._pool.map(lambda item: self._pwrite(item[0].slot, item[1]), batch))
        os.fdatasync(self._data_fd)
        os.write(self._log_fd, b"".join(encode(OP_PUT, record) for record, _ in batch))
        os.fsync(self._log_fd)
        self._log_records += len(batch)

    def _pwrite(self, slot: int, data: memoryview) -> None:
        offset = slot * self.slot_bytes
        written = 0
        while written < len(data):
            written += os.pwritev(self._data_fd, [data[written:]], offset + written)

    def forget(self, keys: Sequence[bytes]) -> None:
        """Record evictions. Not fsync-ed: a lost delete only resurrects a block whose slot
        either still holds it or fails its checksum."""
        if keys:
            zero = b"\0" * 16
            os.write(self._log_fd, b"".join(encode(OP_DEL, Record(k, zero, 0, 0, 0)) for k in keys))
            self._log_records += len(keys)

    def read(self, requests: Sequence[tuple[int, memoryview]]) -> list[bool]:
        """Read slot ``s`` into each buffer, in parallel; False where the read came up short."""
        return list(self._pool.map(lambda item: self._pread(item[0], item[1]), requests))

    def _pread(self, slot: int, out: memoryview) -> bool:
        offset = slot * self.slot_bytes
        done = 0
        while done < len(out):
            n = os.preadv(self._data_fd, [out[done:]], offset + done)
            if n == 0:
                return False
            done += n
        return True

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        os.close(self._data_fd)
        os.close(self._log_fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
