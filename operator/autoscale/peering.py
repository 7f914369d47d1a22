"""Whether this operator replica is the active one, from kopf's ClusterKopfPeering.

kopf pauses a replica's watches while a live peer has a higher priority (and every replica
sharing the top priority), but a task the operator starts itself is not paused. The autoscaler
reads the same peering object and applies the same rule, so only the active replica scales."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any


def is_active(peers: Mapping[str, Any], own_priority: int, now: datetime) -> bool:
    """``peers`` is the peering object's status: identity -> {priority, lastseen, lifetime}. Our
    own entry is one of them; an entry is live until lastseen + lifetime."""
    live = [int(info.get("priority", 0)) for info in peers.values() if _live(info, now)]
    if any(p > own_priority for p in live):
        return False
    # Our own entry, and nobody else's, holds our priority: otherwise kopf pauses us all.
    return live.count(own_priority) == 1


def _live(info: Mapping[str, Any], now: datetime) -> bool:
    try:
        seen = datetime.fromisoformat(str(info["lastseen"]))
        lifetime = timedelta(seconds=int(info.get("lifetime", 60)))
    except (KeyError, ValueError, TypeError):
        return False
    if seen.tzinfo is None:
        seen = seen.replace(tzinfo=now.tzinfo)
    return seen + lifetime > now
