"""The shared tier's janitor: keeps a service's shared volume within its size, for all of the
service's workers together.

Why: each worker bounds only what it wrote since it started (``SharedTier.index``). Every
replica may write the whole size, a restarted worker forgets what it wrote before, a scaled-down
one leaves its blocks behind, and a writer killed mid-write leaves its temporary file. Without
someone looking at the volume as a whole it fills, and then every write fails (ENOSPC).

How: one sidecar at a time holds an exclusive lock on ``<root>/.janitor.lock`` (``flock``,
which Linux's NFS client takes as a lock on the server; it is released when its holder dies,
on NFSv4 once the holder's lease lapses) and looks at the volume every ``SWEEP_EVERY_S``: it
sweeps when the file system's usage is over the high watermark (``needs_scan``), at least every
``FULL_SCAN_EVERY_S``, and at once when a write found the volume full. A sweep scans every file,
removes temporary files older than ``STALE_TMP_S``
and, when the blocks take more than ``HIGH_WATERMARK`` of the size, the least recently used
until they take ``LOW_WATERMARK`` (a read bumps a block's mtime, ``FilesystemBlockStore``).
The others try for the lock at each period, so a new janitor takes over within one.

A sweep holds no list of the volume's files: 500 GiB of a 7B model's 0.9 MiB blocks is 570k
files, and a list of them took 270 MB. Its first pass counts the blocks' bytes by minute of
last use (``Tally``); if they are over the watermark, the oldest minutes that must go are known
(``cutoff``) and a second pass removes their files as it meets them, holding only the files of
the minute where removal stops, ordered exactly there (``boundary``). Those decisions are pure;
walking the volume and unlinking are the glue around them.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from strata.worker.kvtier.background import Loop
from strata.worker.kvtier.shared import BLOCK_SUFFIX, FAN_OUT, TEMP_SUFFIX

log = logging.getLogger(__name__)

LOCK_NAME = ".janitor.lock"
SWEEP_EVERY_S = 60.0
STALE_TMP_S = 600.0  # a temporary file this old lost its writer (a write takes milliseconds)
HIGH_WATERMARK = 0.95  # a sweep removes blocks only above this share of the size ...
LOW_WATERMARK = 0.90  # ... and down to this one, so the next writes find room
# A file another worker removed meanwhile: not found, or (on NFS) a stale handle.
GONE = (errno.ENOENT, errno.ESTALE)
FULL_SCAN_EVERY_S = 900.0  # between sweeps the volume's usage (one call) says whether to scan
BUCKET_S = 60  # a sweep's first pass counts bytes per minute of last use


@dataclass(frozen=True, slots=True)
class Found:
    """A file of the shared volume, as a scan saw it."""

    path: Path
    size: int
    mtime: float
    temporary: bool  # a block being written (``.<name>.<uuid>.tmp``), or one whose writer died


@dataclass(frozen=True)
class Sweep:
    """What one sweep found and removed (``stats``, the metrics)."""

    at: float
    files: int
    used_bytes: int  # blocks and temporary files before the sweep
    removed_stale: int
    removed_lru: int
    left_bytes: int


def is_stale(found: Found, now: float) -> bool:
    """A temporary file whose writer is surely gone (a write takes milliseconds)."""
    return found.temporary and now - found.mtime > STALE_TMP_S


def bucket(mtime: float) -> int:
    return int(mtime) // BUCKET_S


@dataclass
class Tally:
    """A first pass over the volume: the files kept (stale temporary files aside) and their
    bytes; the blocks' bytes by ``bucket`` of their last use."""

    files: int = 0
    used: int = 0
    blocks_by_bucket: Counter[int] = field(default_factory=Counter)

    def add(self, found: Found) -> None:
        self.files += 1
        self.used += found.size
        if not found.temporary:
            self.blocks_by_bucket[bucket(found.mtime)] += found.size


@dataclass(frozen=True)
class Cut:
    """Remove every block last used before ``bucket``, and ``excess`` bytes of those in it."""

    bucket: int
    excess: int


def cutoff(tally: Tally, capacity: int) -> Cut | None:
    """Where removal stops so that what is left fits under ``LOW_WATERMARK`` of ``capacity``;
    None while everything fits under ``HIGH_WATERMARK``."""
    if tally.used <= HIGH_WATERMARK * capacity:
        return None
    excess = tally.used - int(LOW_WATERMARK * capacity)
    for minute in sorted(tally.blocks_by_bucket):
        if tally.blocks_by_bucket[minute] >= excess:
            return Cut(minute, excess)
        excess -= tally.blocks_by_bucket[minute]
    return Cut(max(tally.blocks_by_bucket, default=0) + 1, 0)  # every block, and still over


def boundary(found: Sequence[Found], excess: int) -> list[Found]:
    """The blocks of the cut's bucket to remove: the least recently used until ``excess`` bytes
    are gone. Among blocks used in the same second the later-written goes first: a chain is
    read and written head first, so its tail (useless without the head) leaves before its head."""
    victims: list[Found] = []
    for block in sorted(found, key=lambda f: (int(f.mtime), -f.mtime)):
        if excess <= 0:
            break
        victims.append(block)
        excess -= block.size
    return victims


def scan(root: Path) -> Iterator[Found]:
    """Every block and temporary file under ``root`` (``FilesystemBlockStore``'s layout), a
    directory's listing at a time; files that vanish meanwhile (another worker's eviction) are
    skipped."""
    for directory in _subdirectories(root):
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except FileNotFoundError:
            continue
        for entry in entries:
            if not entry.name.endswith((BLOCK_SUFFIX, TEMP_SUFFIX)):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as err:
                if err.errno in GONE:
                    continue
                raise
            yield Found(Path(entry.path), st.st_size, st.st_mtime, entry.name.endswith(TEMP_SUFFIX))


def _subdirectories(root: Path) -> Iterable[Path]:
    try:
        with os.scandir(root) as entries:
            fanned = (e for e in entries if len(e.name) == FAN_OUT and e.is_dir(follow_symlinks=False))
            return [Path(e.path) for e in fanned]
    except FileNotFoundError:
        return []


def filesystem_used(root: Path) -> int:
    """Bytes in use on the file system holding ``root``, as it reports them."""
    st = os.statvfs(root)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def remove(files: Iterable[Found]) -> int:
    """Unlinks ``files``; returns how many were still there."""
    removed = 0
    for f in files:
        try:
            f.path.unlink()
            removed += 1
        except OSError as err:
            if err.errno not in GONE:
                raise
    return removed


class Janitor:
    """Sweeps ``root`` while this sidecar holds the volume's janitor lock (see the module)."""

    def __init__(
        self,
        root: Path,
        capacity: int,
        on_sweep: Callable[[Sweep], None] | None = None,
        every_s: float = SWEEP_EVERY_S,
        legacy: Path | None = None,
    ) -> None:
        self.root, self.capacity, self.every_s = root, capacity, every_s
        # Blocks of the layout before per-tenant directories (the volume's own fan-out
        # directories), which no sidecar reads any more: removed at each sweep as stale.
        self.legacy = legacy
        self.on_sweep = on_sweep
        self.last: Sweep | None = None
        self._lock_fd: int | None = None
        self._due = 0.0  # time.monotonic() of the next look at the volume
        self._scan_by = 0.0  # ... and of the next full scan, whatever the volume's usage says
        self._loop: Loop | None = None

    def start(self) -> None:
        self._loop = Loop("janitor", self._step, wake_s=min(self.every_s, 5.0))
        self._loop.wake()  # the first sweep (or try for the lock) at once

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.stop()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock for the next janitor
            self._lock_fd = None

    def full(self) -> None:
        """A write found the volume full: sweep now (if this sidecar is the janitor)."""
        self._due = self._scan_by = 0.0
        if self._loop is not None:
            self._loop.wake()

    @property
    def holding(self) -> bool:
        return self._lock_fd is not None

    def _step(self) -> bool:
        now = time.monotonic()
        if now >= self._due:
            self._due = now + self.every_s
            try:
                if self.take_lock() and self.needs_scan(now):
                    self.sweep()
            except OSError as err:  # the volume unreachable: the next period tries again
                log.warning(
                    "shared janitor: sweep failed: %s",
                    err,
                    extra={"event": "shared_janitor", "state": "failed"},
                )
        return False

    def _remove_oldest(self, cut: Cut) -> tuple[int, int]:
        """The second pass: the blocks last used before the cut's bucket go as they are met;
        those in it are held and ordered (``boundary``). Returns (files removed, their bytes)."""
        removed = freed = 0
        at_cut: list[Found] = []
        for found in scan(self.root):
            minute = bucket(found.mtime)
            if found.temporary or minute > cut.bucket:
                continue
            if minute == cut.bucket:
                at_cut.append(found)
            elif remove([found]):
                removed, freed = removed + 1, freed + found.size
        for found in boundary(at_cut, cut.excess):
            if remove([found]):
                removed, freed = removed + 1, freed + found.size
        return removed, freed

    def take_lock(self) -> bool:
        """True while this sidecar is the volume's janitor (taking the lock if free)."""
        if self._lock_fd is not None:
            return True
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            log.warning("shared janitor: cannot open its lock: %s", err)
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # another sidecar is the janitor
            return False
        self._lock_fd = fd
        log.info(
            "shared janitor: this sidecar keeps %s within %d bytes",
            self.root,
            self.capacity,
            extra={"event": "shared_janitor", "state": "holding", "capacity_bytes": self.capacity},
        )
        return True

    def needs_scan(self, now: float) -> bool:
        """Whether to stat every file now. A scan costs a GETATTR per file on NFS (about 250k for
        500 GiB of 2 MiB blocks); the file system's own usage (``statvfs``, one call) tells when
        the blocks cannot be over the watermark: the volume is the service's own claim, so its
        usage is at least theirs. Some volumes report a whole shared file system's usage, which
        only makes scans more frequent. A scan comes at least every ``FULL_SCAN_EVERY_S`` anyway,
        for temporary files, and at once after a write found the volume full."""
        return now >= self._scan_by or filesystem_used(self.root) > HIGH_WATERMARK * self.capacity

    def sweep(self) -> Sweep:
        self._scan_by = time.monotonic() + FULL_SCAN_EVERY_S
        now, tally, stale = time.time(), Tally(), []
        for found in scan(self.root):
            if is_stale(found, now):
                stale.append(found)
            else:
                tally.add(found)
        if self.legacy is not None:
            stale += scan(self.legacy)
        removed_stale = remove(stale)
        cut = cutoff(tally, self.capacity)
        removed_lru, freed = self._remove_oldest(cut) if cut is not None else (0, 0)
        used, left = tally.used + sum(f.size for f in stale), tally.used - freed
        self.last = Sweep(time.time(), tally.files + len(stale), used, removed_stale, removed_lru, left)
        if removed_stale or removed_lru:
            log.info(
                "shared janitor: removed %d blocks and %d stale temporary files; %d of %d bytes left",
                removed_lru,
                removed_stale,
                left,
                self.capacity,
                extra={"event": "shared_janitor", "state": "swept", **asdict(self.last)},
            )
        if self.on_sweep is not None:
            self.on_sweep(self.last)
        return self.last
