"""How much of the memory-backed volume the DRAM tier's slots may take.

A page past a full tmpfs is a SIGBUS in whoever touches it, and Docker's default ``/dev/shm`` is
64 MiB: the sidecar fits its DRAM tier's slots to the volume (``shm_room``) as well as to its
memory (``strata.common.kvbudget.fit``).
"""

from __future__ import annotations

import os
from pathlib import Path

from strata.worker.kvtier.sightings import SHM_LEAVE_FREE


def shm_room(arena: Path, staging_bytes: int) -> int | None:
    """Bytes of the memory-backed volume holding ``arena`` that the DRAM tier's slots may take:
    what is free, and what the arena file holds already (a restart finds it), less the staging
    slots and ``SHM_LEAVE_FREE`` for the engine's own use and the admission state. None where the
    volume cannot be read. ValueError when not even the staging slots fit."""
    directory = arena.parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    try:
        volume = os.statvfs(directory)
    except OSError:
        return None
    try:
        held = os.stat(arena).st_blocks * 512
    except OSError:
        held = 0
    room = volume.f_bavail * volume.f_frsize + held
    if room < staging_bytes:
        raise ValueError(
            f"dram.shm_path: {arena.parent} has {room} bytes free, and the staging slots alone need "
            f"{staging_bytes}: give the pod a larger /dev/shm (Docker: --shm-size)"
        )
    return room - staging_bytes - SHM_LEAVE_FREE
