"""The shared tier's storage: blocks other workers of the same model and tenant can reuse.

:class:`BlockStore` is the interface an object store can implement later;
:class:`FilesystemBlockStore` keeps one file per block on a ReadWriteMany volume, written to a
temporary name, fsync-ed and renamed, so a reader never sees a half-written block. Each file
carries a header with its key, length and checksum, verified on every read; a read bumps
its mtime, by which the volume's janitor (``janitor``) removes the least recently used.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import uuid
from pathlib import Path
from typing import Protocol

from strata.worker.kvtier.arena import checksum
from strata.worker.kvtier.walls import PRIVATE_DIR, PRIVATE_FILE, inside

_HEADER = struct.Struct("<8sII16s16siQ")  # magic, version, length, key, parent, priority, checksum
_MAGIC = b"STRATAKV"
# The volume's layout, which the janitor reads too: <root>/<first FAN_OUT hex digits>/<key>.kv,
# each written as .<key>.kv.<uuid>.tmp beside it first.
FAN_OUT = 2
BLOCK_SUFFIX, TEMP_SUFFIX = ".kv", ".tmp"
_VERSION = 2
KEY_BYTES = 16


class CorruptBlock(Exception):
    """A stored block failed its checksum or header check (it has been deleted)."""


class BlockStore(Protocol):
    """Blocks by key. Methods raise OSError when the store is unreachable."""

    def contains(self, key: bytes) -> bool: ...

    def read_into(self, key: bytes, out: memoryview) -> bool:
        """Fill ``out`` with the block; False when absent; CorruptBlock when damaged."""
        ...

    def read_checked(self, key: bytes, out: memoryview) -> int | None:
        """``read_into``, returning the block's checksum it verified (None when absent), so
        that a reader that needs the checksum does not hash the block a second time."""
        ...

    def write(self, key: bytes, parent: bytes, priority: int, data: memoryview) -> None: ...

    def delete(self, key: bytes) -> None: ...


class FilesystemBlockStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, key: bytes) -> Path:
        """A key's file, always under the root: keys are fixed-size hashes, checked here again."""
        if len(key) != KEY_BYTES:
            raise ValueError(f"key: a block key is {KEY_BYTES} bytes, got {len(key)}")
        name = key.hex()
        return inside(self.root, self.root / name[:FAN_OUT] / f"{name}{BLOCK_SUFFIX}")

    def contains(self, key: bytes) -> bool:
        return self._path(key).is_file()

    def read_into(self, key: bytes, out: memoryview) -> bool:
        return self.read_checked(key, out) is not None

    def read_checked(self, key: bytes, out: memoryview) -> int | None:
        path = self._path(key)
        try:
            with open(path, "rb", buffering=0) as src:
                header = src.read(_HEADER.size)
                checked = self._check_header(header, key, len(out))
                got = src.readinto(out)
                tail = src.read(1)
        except FileNotFoundError:
            return None
        except OSError as err:
            if err.errno == errno.ESTALE:  # removed by another worker (or the janitor) on NFS
                return None
            raise
        if checked is None or got != len(out) or tail or checksum(out) != checked:
            self.delete(key)
            raise CorruptBlock(f"shared block {key.hex()} is corrupt")
        _touch(path)
        return checked

    @staticmethod
    def _check_header(header: bytes, key: bytes, length: int) -> int | None:
        if len(header) != _HEADER.size:
            return None
        magic, version, size, stored_key, _, _, crc = _HEADER.unpack(header)
        if magic != _MAGIC or version != _VERSION or size != length or stored_key != key:
            return None
        return int(crc)

    def write(self, key: bytes, parent: bytes, priority: int, data: memoryview) -> None:
        path = self._path(key)
        path.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}")
        header = _HEADER.pack(_MAGIC, _VERSION, len(data), key, parent, priority, checksum(data))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
            with open(fd, "wb", buffering=0) as dst:
                dst.write(header)
                dst.write(data)
                os.fsync(dst.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def delete(self, key: bytes) -> None:
        self._path(key).unlink(missing_ok=True)


def _touch(path: Path) -> None:
    """A read is a use: the volume's janitor removes the least recently used blocks by mtime
    (the volume's own access times are not kept by every mount). Best effort."""
    with contextlib.suppress(OSError):
        os.utime(path)
