"""The NVMe tier's storage: one preallocated data file of fixed-size slots and an append-only
index log, so that a restarted sidecar finds its blocks again.

Ordering makes a block durable: its data is written and ``fdatasync``-ed before its index
record is appended and the log ``fsync``-ed; only then is the block *committed*. A crash loses
at most uncommitted blocks. A record whose slot was later overwritten without a committed
record is caught by the block checksum on read, so a torn block is never served. Each record
carries its own crc32, so a torn tail of the log is cut off on replay.

Block data moves with ``O_DIRECT`` where the file system allows it and the buffer is page
aligned (the sidecar's slots are): the device reads and writes the shared-memory slot itself,
with no copy through the page cache (which would also hold a second, useless copy of blocks
DRAM already caches). Other buffers go through the page cache.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from strata.worker.kv_connector import PAGE
from strata.worker.kvtier.arena import checksum

log = logging.getLogger(__name__)

_RECORD = struct.Struct("<B16s16sIiQ")  # op, key, parent, slot, priority, block checksum
_CRC = struct.Struct("<I")
RECORD_BYTES = _RECORD.size + _CRC.size
OP_PUT, OP_DEL = 1, 2
FORMAT_VERSION = 2


@dataclass(slots=True)  # a restart holds one a block while it rebuilds the index
class Record:
    key: bytes
    parent: bytes
    slot: int
    priority: int
    checksum: int | None  # None only before ``write``, which takes it from the bytes


def log_outgrown(records: int, live: int) -> bool:
    """A log of ``records`` appended records is rewritten once it holds over four times the
    ``live`` blocks (plus slack, so a small tier does not rewrite it all the time)."""
    return records > 4 * live + 4096


def _sum(record: Record) -> int:
    assert record.checksum is not None, "records are written with their checksum"
    return record.checksum


def encode(op: int, record: Record) -> bytes:
    body = _RECORD.pack(op, record.key, record.parent, record.slot, record.priority, _sum(record))
    return body + _CRC.pack(zlib.crc32(body))


def decode_log(data: bytes) -> tuple[dict[bytes, Record], int]:
    """Live records after replaying ``data``, and the length of its intact prefix."""
    replay = LogReplay()
    replay.feed(data)
    return replay.finish(), replay.intact


class LogReplay:
    """Replays the index log fed in pieces (a log may hold four times the live blocks: it is
    not read whole). ``live``: the live records, in the order of their last put. ``intact``:
    the length of the log's intact prefix; nothing after a torn record counts, nor a record
    the log ends within."""

    def __init__(self) -> None:
        self.live: dict[bytes, Record] = {}
        self._by_slot: dict[int, bytes] = {}
        self.intact = 0
        self._torn = False
        self._tail = b""  # the start of a record the last piece ended within

    def feed(self, data: bytes) -> None:
        """The next piece of the log (of any length: a record may span two pieces)."""
        if self._torn:
            return
        if self._tail:
            data, self._tail = self._tail + data, b""
        offset = 0
        while offset + RECORD_BYTES <= len(data):
            body = data[offset : offset + _RECORD.size]
            (crc,) = _CRC.unpack_from(data, offset + _RECORD.size)
            if zlib.crc32(body) != crc:
                self._torn = True
                return
            self._apply(*_RECORD.unpack(body))
            offset += RECORD_BYTES
            self.intact += RECORD_BYTES
        self._tail = data[offset:]

    def finish(self) -> dict[bytes, Record]:
        """The live records, each parent the key object of its parent's record where that is
        live (not an equal copy: 49 bytes a block the index would hold). A batch's child may
        be logged before its parent, so this is done once the whole log is read."""
        live = self.live
        for record in live.values():
            held = live.get(record.parent)
            if held is not None:
                record.parent = held.key
        return live

    def _apply(self, op: int, key: bytes, parent: bytes, slot: int, priority: int, block_crc: int) -> None:
        live, by_slot = self.live, self._by_slot
        if op == OP_PUT:
            previous = by_slot.get(slot)
            if previous is not None:
                live.pop(previous, None)
            if key in live:
                by_slot.pop(live.pop(key).slot, None)
            live[key] = Record(key, parent, slot, priority, block_crc)
            by_slot[slot] = key
        elif op == OP_DEL and key in live:
            by_slot.pop(live.pop(key).slot, None)


LOG_READ_RECORDS = 1 << 16  # records read at a time on replay (3.5 MB)


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
        self._direct_fd = _open_direct(self._data_path)
        self.num_slots = self._preallocate(num_slots)
        self._log_fd = os.open(self._log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        self._log_records = 0
        self._log_lock = threading.Lock()  # appends (a demotion commits without the service's lock)

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
            replay = LogReplay()
            with open(self._log_path, "rb") as log_file:
                while piece := log_file.read(LOG_READ_RECORDS * RECORD_BYTES):
                    replay.feed(piece)
            live = replay.finish()
            for key in [k for k, r in live.items() if r.slot >= self.num_slots]:
                del live[key]
        try:
            self._rewrite_log(live.values())
            self._meta_path.write_text(json.dumps(self._meta()))
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            return self._recover_on_full_volume(live, err)
        return live

    def _recover_on_full_volume(self, live: dict[bytes, Record], err: OSError) -> dict[bytes, Record]:
        """No room to rewrite the log (someone filled the volume): a restart must not crash on
        it. The old log, read just now, stays as it is where its blocks are kept; otherwise it
        is emptied, which takes no room."""
        self._log_path.with_suffix(".tmp").unlink(missing_ok=True)
        if not (live and self._meta_matches()):
            os.ftruncate(self._log_fd, 0)
            live = {}
        log.warning(
            "nvme: volume full at start (%s): log kept as it was, %d blocks recovered", err, len(live)
        )
        self._log_records = len(live)
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

    def needs_compaction(self, live: int) -> bool:
        """Whether the log has grown past ``live`` blocks enough to rewrite it: a count, so
        that a commit does not build every live record (an index of millions) to find out."""
        return log_outgrown(self._log_records, live)

    def compact(self, live: Iterable[Record], count: int) -> None:
        """Rewrite the log with the ``count`` records of ``live``, taken one at a time: an index
        of millions is not copied into a list of records first."""
        with self._log_lock:
            if log_outgrown(self._log_records, count):
                self._rewrite_log(live)

    def write(self, batch: Sequence[tuple[Record, memoryview]]) -> list[Record]:
        """Write each block to its slot, then commit their records; returns the records, with
        the checksums taken here where they had none (each I/O thread hashes its block just
        before writing it, while the others' writes are in flight). Raises OSError (e.g.
        ENOSPC) before anything is committed if a write fails. A buffer may be the whole slot
        (page-aligned: written directly) or just the block."""
        return self.commit(self.written(self.submit(batch)))

    def submit(self, batch: Sequence[tuple[Record, memoryview]]) -> list[Future[Record]]:
        """Queue the writes of a batch on the I/O threads and return at once: a batch queued
        while the one before is being synced keeps the device busy meanwhile."""
        return [self._pool.submit(self._pwrite, record, data) for record, data in batch]

    @staticmethod
    def written(pending: Sequence[Future[Record]]) -> list[Record]:
        """The records of a submitted batch once every write has ended; raises the first
        write's OSError only then, so no write is still running into a slot the caller is
        about to give back."""
        wait(pending)
        return [future.result() for future in pending]

    def commit(self, records: Sequence[Record]) -> list[Record]:
        """Make written blocks durable, data first: ``fdatasync`` (also the extent conversions
        of direct writes), then their index records appended and ``fsync``-ed."""
        if not records:
            return []
        os.fdatasync(self._data_fd)
        with self._log_lock:
            os.write(self._log_fd, b"".join(encode(OP_PUT, record) for record in records))
            os.fsync(self._log_fd)
            self._log_records += len(records)
        return list(records)

    def _pwrite(self, record: Record, data: memoryview) -> Record:
        if record.checksum is None:
            record = dataclasses.replace(record, checksum=checksum(data[: self.block_bytes]))
        write_all(self._fd_for(data), data, record.slot * self.slot_bytes)
        return record

    @property
    def direct_fd(self) -> int | None:
        """The data file opened with ``O_DIRECT`` (None where the file system refuses it): what
        an engine doing its own block I/O is handed."""
        return self._direct_fd

    def _fd_for(self, buffer: memoryview) -> int:
        if self._direct_fd is not None and _page_aligned(buffer) and len(buffer) <= self.slot_bytes:
            return self._direct_fd
        return self._data_fd

    def forget(self, keys: Sequence[bytes]) -> None:
        """Record evictions. Not fsync-ed: a lost delete only resurrects a block whose slot
        either still holds it or fails its checksum."""
        if keys:
            zero = b"\0" * 16
            with self._log_lock:
                os.write(self._log_fd, b"".join(encode(OP_DEL, Record(k, zero, 0, 0, 0)) for k in keys))
                self._log_records += len(keys)

    def read(self, requests: Sequence[tuple[int, memoryview]]) -> list[int | None]:
        """Read slot ``s`` into each buffer, in parallel, and hash each block right after its
        read (one pass over fresh data per thread); the checksums, None where a read came up
        short."""
        return list(self._pool.map(lambda item: self._read_hashed(item[0], item[1]), requests))

    def read_unhashed(self, requests: Sequence[tuple[int, memoryview]]) -> list[bool]:
        """``read`` for a reader that checks the blocks itself (as it copies them out): whether
        each read was whole."""
        return list(self._pool.map(lambda item: self._read_into(item[0], item[1]), requests))

    def _read_hashed(self, slot: int, out: memoryview) -> int | None:
        return checksum(out[: self.block_bytes]) if self._read_into(slot, out) else None

    def _read_into(self, slot: int, out: memoryview) -> bool:
        return read_all(self._fd_for(out), out, slot * self.slot_bytes)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        os.close(self._data_fd)
        if self._direct_fd is not None:
            os.close(self._direct_fd)
        os.close(self._log_fd)


def write_all(fd: int, data: memoryview, offset: int) -> None:
    """All of ``data`` at ``offset`` of ``fd`` (a write may come back short)."""
    written = 0
    while written < len(data):
        written += os.pwritev(fd, [data[written:]], offset + written)


def read_all(fd: int, out: memoryview, offset: int) -> bool:
    """Fill ``out`` from ``offset`` of ``fd``; False where the file ended first."""
    done = 0
    while done < len(out):
        count = os.preadv(fd, [out[done:]], offset + done)
        if count == 0:
            return False
        done += count
    return True


def _open_direct(path: Path) -> int | None:
    """A second descriptor with ``O_DIRECT``, or None where the file system refuses it
    (tmpfs, some overlays)."""
    try:
        return os.open(path, os.O_RDWR | getattr(os, "O_DIRECT", 0))
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise
        log.info("nvme: %s does not take O_DIRECT; block I/O goes through the page cache", path)
        return None


def _page_aligned(buffer: memoryview) -> bool:
    """Direct I/O needs the address and length in whole pages."""
    if buffer.readonly or len(buffer) % PAGE or not buffer.contiguous:
        return False
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer)) % PAGE == 0


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
