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

Deciding what to remove (``plan``) is pure; scanning and unlinking are the glue around it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
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


@dataclass(frozen=True)
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


def plan(found: Sequence[Found], capacity: int, now: float) -> tuple[list[Found], list[Found]]:
    """(stale temporary files, least recently used blocks) to remove so that what is left fits
    under ``LOW_WATERMARK`` of ``capacity``; no block goes while everything fits under
    ``HIGH_WATERMARK``. Among blocks used in the same second the later-written goes first:
    a chain is read and written head first, so its tail (useless without the head) leaves
    before its head."""
    stale = [f for f in found if f.temporary and now - f.mtime > STALE_TMP_S]
    used = sum(f.size for f in found) - sum(f.size for f in stale)
    if used <= HIGH_WATERMARK * capacity:
        return stale, []
    blocks = sorted((f for f in found if not f.temporary), key=lambda f: (int(f.mtime), -f.mtime))
    victims: list[Found] = []
    for block in blocks:
        if used <= LOW_WATERMARK * capacity:
            break
        victims.append(block)
        used -= block.size
    return stale, victims


def scan(root: Path) -> list[Found]:
    """Every block and temporary file under ``root`` (``FilesystemBlockStore``'s layout); files that
    vanish meanwhile (another worker's eviction) are skipped."""
    found: list[Found] = []
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
            found.append(Found(Path(entry.path), st.st_size, st.st_mtime, entry.name.endswith(TEMP_SUFFIX)))
    return found


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
    ) -> None:
        self.root, self.capacity, self.every_s = root, capacity, every_s
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
        found = scan(self.root)
        stale, victims = plan(found, self.capacity, time.time())
        removed_stale, removed_lru = remove(stale), remove(victims)
        used = sum(f.size for f in found)
        left = used - sum(f.size for f in stale) - sum(f.size for f in victims)
        self.last = Sweep(time.time(), len(found), used, removed_stale, removed_lru, left)
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
