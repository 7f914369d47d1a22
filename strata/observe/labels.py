"""Target labels every Strata series carries once scraped (the chart's PodMonitor relabelings).

The ServiceTier label is ``service_tier``: ``tier`` already means the cache tier (hbm, dram,
nvme, shared) on the worker's and the sidecar's own series."""

from __future__ import annotations

NAMESPACE = "namespace"
SERVICE = "service"
SERVICE_TIER = "service_tier"
CACHE_TIER = "tier"
POD = "pod"

# Aggregation keys: one series per service, and one per service tier.
BY_SERVICE = (NAMESPACE, SERVICE, SERVICE_TIER)
BY_TIER = (SERVICE_TIER,)


def by(*labels: str) -> str:
    return "by (" + ", ".join(labels) + ")"
