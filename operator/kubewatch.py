"""List-then-watch over :class:`~strata.operator.kube.KubeClient`: every object now (as ADDED),
then the changes, from the list's resourceVersion with bookmarks; when the watch expires or
breaks it lists again, reporting the objects deleted meanwhile (as DELETED). The test cluster's
pod runtime follows its nodes, pods and services this way."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from strata.operator.kube import KubeClient, KubeError

log = logging.getLogger(__name__)
WATCH_TIMEOUT_S = 300
RETRY_S = 1.0


@dataclass(frozen=True)
class Event:
    type: str  # ADDED, MODIFIED, DELETED (a relist replays every object as ADDED)
    object: dict[str, Any]


async def watch(client: KubeClient, path: str, params: Mapping[str, str]) -> AsyncIterator[Event]:
    """Every object now (as ADDED), then changes; relists when the watch expires or breaks.
    A relist also reports objects deleted meanwhile (as DELETED)."""
    known: dict[str, dict[str, Any]] = {}
    while True:
        try:
            listed = await client.request("GET", path, params=params)
            version = listed["metadata"]["resourceVersion"]
            current = {_uid(o): o for o in listed.get("items", [])}
            for uid in set(known) - set(current):
                yield Event("DELETED", known.pop(uid))
            for uid, obj in current.items():
                known[uid] = obj
                yield Event("ADDED", obj)
            async for event in _stream(client, path, params, version):
                if event.type == "DELETED":
                    known.pop(_uid(event.object), None)
                else:
                    known[_uid(event.object)] = event.object
                yield event
        except (TimeoutError, aiohttp.ClientError, KubeError) as error:
            log.warning("watch %s broke, relisting: %s", path, error)
            await asyncio.sleep(RETRY_S)


async def _stream(
    client: KubeClient, path: str, params: Mapping[str, str], version: str
) -> AsyncIterator[Event]:
    query = {
        **params,
        "watch": "1",
        "resourceVersion": version,
        "allowWatchBookmarks": "true",
        "timeoutSeconds": str(WATCH_TIMEOUT_S),
    }
    async with client.stream(path, query, WATCH_TIMEOUT_S + 30) as lines:
        async for line in lines:
            event = json.loads(line)
            if event["type"] == "ERROR":
                return  # 410 Gone and friends: relist
            if event["type"] == "BOOKMARK":
                continue
            yield Event(event["type"], event["object"])


def _uid(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["uid"])
