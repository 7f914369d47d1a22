"""The KV cache tiers, fastest first: the engine's GPU memory (``hbm``), then the sidecar's host
memory (``dram``), the node's disk (``nvme``) and a volume every replica mounts (``shared``)."""

from __future__ import annotations

from typing import Literal, get_args

LowerTier = Literal["dram", "nvme", "shared"]  # the sidecar's, below the engine's
Tier = Literal["hbm", LowerTier]

TIERS: tuple[Tier, ...] = get_args(Tier)
LOWER_TIERS: tuple[LowerTier, ...] = get_args(LowerTier)
LOCAL_TIERS: tuple[Tier, ...] = TIERS[:3]  # on the pod's own node: lost with the pod
