"""The C allocator's thresholds for the sidecar's process, fixed at its start.

Why: glibc serves a request of 128 KiB or more with its own ``mmap`` and gives it back when
freed, but each time it frees one it raises that threshold to the freed size (up to 32 MiB), and
the trim threshold to twice it. From then on such requests come from the heap, and freed, stay
in the process's RSS. A sidecar building its indexes grows dicts and lists of a block each
(the DRAM tier's slot records at a restart, the NVMe log's replay, the index itself), and every
growth frees the smaller table: restarted on 120,000 DRAM blocks it held 1,019 bytes a block of
RSS where its Python objects took about 610; with the thresholds fixed at glibc's default,
659 (``python -m bench kvtier``: ``index_memory``). Fixed thresholds cost an ``mmap`` and a
``munmap`` for each large request, which the sidecar makes rarely (a router's snapshot of the
keys, the admission state's copies), not for each block: its blocks live in shared memory. The
bandwidth benchmark's tier paths, three pairs with and without, differed by no more than runs
of either differ among themselves.

Elsewhere (musl, macOS) there is nothing to set and nothing is done.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
THRESHOLD_BYTES = 128 * 1024  # glibc's own starting value; setting it stops the raising


def fix_thresholds() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; whether they were set."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.info("kvtier: no glibc mallopt here; the allocator's thresholds are left as they are")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    fixed = all(mallopt(param, THRESHOLD_BYTES) == 1 for param in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD))
    if not fixed:
        log.warning("kvtier: glibc refused fixed allocator thresholds; a restart may keep more memory")
    return fixed
