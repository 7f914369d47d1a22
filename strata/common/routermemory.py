"""The memory a router needs for the block keys it follows: the operator gives a service's
routers the memory to follow every block its replicas may hold (``memory_to_follow``), and a
router follows at most what its memory limit allows (``followed_limit``)."""

from __future__ import annotations

import math

# What the budget counts: followed lower-tier keys (about 91 bytes each in a set)
# and the routed-block records' entries (106, and the key they keep alive, 49), at 160 each;
# together they may take half the router's memory (the rest: the interpreter, the tokenizer,
# the connections).
FOLLOWED_BYTES_PER_KEY = 160
FOLLOWED_SHARE = 0.5


def followed_limit(memory_bytes: int | None) -> int | None:
    """The keys a router with ``memory_bytes`` (None: unknown) follows at most."""
    if memory_bytes is None:
        return None
    return int(memory_bytes * FOLLOWED_SHARE) // FOLLOWED_BYTES_PER_KEY


def memory_to_follow(keys: int) -> int:
    """The container memory limit under which a router follows ``keys`` (``followed_limit``'s
    inverse): what the operator gives the routers of a service whose block size it knows."""
    return math.ceil(keys * FOLLOWED_BYTES_PER_KEY / FOLLOWED_SHARE)
