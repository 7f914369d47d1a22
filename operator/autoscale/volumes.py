"""A KV tier whose volume is full, told to the service's owner as an Event.

The sidecar stops admitting blocks to a tier whose writes found the volume full (ENOSPC) and
says so in ``strata_kvtier_volume_full{tier}``; it keeps serving from that tier and the others,
and tries again after a while. Nobody reads a sidecar's metrics by chance, so the autoscaler,
which scrapes every Ready worker each interval anyway, reads that gauge from each pod's sidecar
too and posts a Warning Event when a pod's tier becomes full, and a Normal one when it has room
again (``changes``: pure)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from strata.common.endpoints import SIDECAR_PORT
from strata.operator.autoscale.modelsize import Advice
from strata.operator.autoscale.pods import metrics_url
from strata.operator.events import EventSink
from strata.operator.views import PodRef

FULL_GAUGE = "strata_kvtier_volume_full"

Full = frozenset[str]


def full_tiers(text: str) -> Full:
    """The tiers whose ``volume_full`` gauge is 1 in a sidecar's exposition."""
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError):
        return frozenset()
    samples = [s for f in families if f.name == FULL_GAUGE for s in f.samples]
    return frozenset(s.labels.get("tier", "") for s in samples if s.value >= 1)


def changes(pod: str, before: Full, now: Full) -> list[Advice]:
    """The Events a pod's tiers going full, or having room again, call for."""
    filled = [
        Advice(
            "Warning",
            "KVTierVolumeFull",
            f"pod {pod}: the {tier} tier's volume is full (ENOSPC): the tier admits no new blocks and "
            "serves what it holds, the other tiers go on; free room on the volume or give it more",
        )
        for tier in sorted(now - before)
    ]
    freed = [
        Advice("Normal", "KVTierVolumeRoom", f"pod {pod}: the {tier} tier's volume has room again")
        for tier in sorted(before - now)
    ]
    return filled + freed


GetText = Callable[[str], Awaitable[str | None]]


@dataclass
class VolumeWatch:
    """What each pod's sidecar said last, by pod uid (a few bytes a pod: not worth forgetting)."""

    get_text: GetText  # Scraper.get_text: GET under the scrape limit, None on any failure
    full: dict[str, Full] = field(default_factory=dict)

    async def report(self, isvc: Mapping[str, Any], pods: Sequence[PodRef], events: EventSink) -> None:
        # All pods at once, as the worker scrape does: one slow sidecar must not hold the others
        # (get_text bounds how many run together).
        texts = await asyncio.gather(*(self.get_text(metrics_url(p.ip, SIDECAR_PORT)) for p in pods))
        for pod, text in zip(pods, texts, strict=True):
            if text is None:  # no sidecar, or not answering this time: no news
                continue
            now = full_tiers(text)
            for advice in changes(pod.name, self.full.get(pod.uid, frozenset()), now):
                events(isvc, advice.type, advice.reason, advice.message)
            self.full[pod.uid] = now
