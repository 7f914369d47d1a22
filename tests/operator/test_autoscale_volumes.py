"""A full KV-tier volume told as an Event (pure parts, and the watch over fake scrapes)."""

from __future__ import annotations

import asyncio

from strata.operator.autoscale.volumes import VolumeWatch, changes, full_tiers
from strata.operator.events import RecordedEvents
from strata.operator.views import PodRef

EXPOSITION = """# HELP strata_kvtier_volume_full 1 while the tier admits no blocks
# TYPE strata_kvtier_volume_full gauge
strata_kvtier_volume_full{tier="nvme"} %s
"""


def test_full_tiers_are_those_whose_gauge_is_one() -> None:
    assert full_tiers(EXPOSITION % "1.0") == {"nvme"}
    assert full_tiers(EXPOSITION % "0.0") == frozenset()
    assert full_tiers("not an exposition {") == frozenset()


def test_a_tier_going_full_is_a_warning_and_having_room_again_a_normal_event() -> None:
    (full,) = changes("chat-0", frozenset(), frozenset({"nvme"}))
    assert (full.type, full.reason) == ("Warning", "KVTierVolumeFull") and "chat-0" in full.message
    (room,) = changes("chat-0", frozenset({"nvme"}), frozenset())
    assert (room.type, room.reason) == ("Normal", "KVTierVolumeRoom")
    assert changes("chat-0", frozenset({"nvme"}), frozenset({"nvme"})) == []


def test_the_watch_posts_once_per_change_and_nothing_for_a_pod_without_a_sidecar() -> None:
    answers = {"127.64.1.2": EXPOSITION % "1.0", "127.64.1.3": None}

    async def get_text(url: str) -> str | None:
        return answers[url.split("//")[1].split(":")[0]]

    watch, events = VolumeWatch(get_text), RecordedEvents()
    pods = [PodRef("u2", "chat-0", "127.64.1.2"), PodRef("u3", "chat-1", "127.64.1.3")]
    service = {"metadata": {"name": "chat"}}
    for _ in range(2):
        asyncio.run(watch.report(service, pods, events))
    answers["127.64.1.2"] = EXPOSITION % "0.0"
    asyncio.run(watch.report(service, pods, events))
    assert [(e[2]) for e in events.events] == ["KVTierVolumeFull", "KVTierVolumeRoom"]
