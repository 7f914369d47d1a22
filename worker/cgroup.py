"""The memory limit of the container a process runs in, from its cgroup.

Torch-free and dependency-free: the KV-tier sidecar fits its indexes within the limit
(``strata.common.kvbudget``) and the router its followed block keys (``strata.router``).
"""

from __future__ import annotations

from pathlib import Path

# Where a container finds its memory limit: cgroup v2, then v1. A value this large means none.
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
UNLIMITED = 1 << 60


def memory_limit(configured: int | None = None) -> int | None:
    """``configured`` when set, else the container's cgroup limit; None when there is none."""
    if configured:
        return configured
    for path in CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        return value if value < UNLIMITED else None
    return None
