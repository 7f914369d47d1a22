"""Advisory file locks that live exactly as long as the process (or its fd) holding them."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def try_lock(path: Path) -> int | None:
    """An fd holding an exclusive lock on ``path`` (created if missing), or None when another
    process holds it. Closing the fd, or the holder's death, releases it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
