"""Cache-aware scale-in, the glue (the decisions are in cachevalue.py): hit scores kept from the
autoscaler's own scrapes, the sidecars' block counts read just before a scale-down, and each
ready pod's ``controller.kubernetes.io/pod-deletion-cost`` patched before the replica count
drops, so the ReplicaSet removes the coldest pod first."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from strata.common.endpoints import SIDECAR_PORT
from strata.operator.api import EngineSpec
from strata.operator.autoscale.cachevalue import (
    DELETION_COST,
    HIT_HALF_LIFE_S,
    HitScore,
    PodCache,
    decayed,
    note,
    ranking,
    update_hits,
)
from strata.operator.autoscale.metrics import MetricsError, parse_tier_blocks
from strata.operator.autoscale.pods import MERGE_PATCH, list_pods, metrics_url, ready
from strata.operator.autoscale.signals import Scrape
from strata.operator.kube import KubeClient, Obj

log = logging.getLogger(__name__)
FORGET_AFTER_S = 4 * HIT_HALF_LIFE_S  # a score this old has decayed to 1/16: the pod is gone
Fetch = Callable[[str], Awaitable[str | None]]  # GET a URL: the body, or None when it failed


@dataclass
class ScaleIn:
    kube: KubeClient
    fetch: Fetch
    scores: dict[str, HitScore] = field(default_factory=dict)  # by pod uid, across services

    def observe(self, previous: Scrape, current: Scrape) -> None:
        """Fold one interval's hits into each pod's decayed score (every autoscaler interval)."""
        for uid, now in current.pods.items():
            before = previous.pods.get(uid)
            if before is not None:
                self.scores[uid] = update_hits(self.scores.get(uid), before, now, current.time)
        for uid in [u for u, s in self.scores.items() if current.time - s.at > FORGET_AFTER_S]:
            del self.scores[uid]

    async def prepare(self, isvc: Mapping[str, Any], latest: Scrape | None, now: float) -> str:
        """Before a scale-down: rank the ready pods and set their deletion costs; the Event note."""
        meta = isvc["metadata"]
        pods = await list_pods(self.kube, meta["namespace"], meta["name"])
        block_size = EngineSpec.model_validate((isvc.get("spec") or {}).get("engine") or {}).block_size
        found = await asyncio.gather(*(self._cache(p, latest, now) for p in pods if ready(p)))
        ranked = ranking([c for c in found if c is not None], block_size)
        victim = _highest_ordinal(pods)
        if victim is None:
            await asyncio.gather(*(self._annotate(meta["namespace"], name, cost) for name, cost in ranked))
        return note(ranked, victim)

    async def _cache(self, pod: Obj, latest: Scrape | None, now: float) -> PodCache | None:
        """What one pod holds; None (left unranked, its annotation untouched) without a scrape."""
        uid = str(pod["metadata"]["uid"])
        sample = latest.pods.get(uid) if latest is not None else None
        if sample is None:
            return None
        held = {"hbm": sample.kv_cached_blocks or 0.0}
        body = await self.fetch(metrics_url(str(pod["status"]["podIP"]), SIDECAR_PORT))
        if body is not None:
            try:
                held.update(parse_tier_blocks(body))
            except MetricsError as exc:
                log.debug("scale-in: sidecar metrics of %s unreadable: %s", pod["metadata"]["name"], exc)
        return PodCache(pod["metadata"]["name"], decayed(self.scores.get(uid), now), held)

    async def _annotate(self, namespace: str, name: str, cost: int) -> None:
        await self.kube.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            body={"metadata": {"annotations": {DELETION_COST: str(cost)}}},
            content_type=MERGE_PATCH,
        )


def _highest_ordinal(pods: list[Obj]) -> str | None:
    """The pod a StatefulSet removes next; None when the pods are not a StatefulSet's."""
    owned = [
        p
        for p in pods
        if any(o.get("kind") == "StatefulSet" for o in p["metadata"].get("ownerReferences", []))
    ]
    if not owned:
        return None
    return max((str(p["metadata"]["name"]) for p in owned), key=lambda n: int(n.rsplit("-", 1)[-1]))
