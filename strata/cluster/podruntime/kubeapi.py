"""A small asyncio client for the few Kubernetes API calls the pod runtime makes, over aiohttp.

get, list-then-watch (with resourceVersion, bookmarks and a relist on 410 Gone), create, patch
and delete; client-certificate authentication from the runtime's own kubeconfig.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 30.0
RETRY_S = 1.0
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status


@dataclass(frozen=True)
class Event:
    type: str  # ADDED, MODIFIED, DELETED (a relist replays every object as ADDED)
    object: dict[str, Any]


def ssl_from_kubeconfig(path: Path) -> tuple[str, ssl.SSLContext]:
    config = yaml.safe_load(path.read_text())
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    context = ssl.create_default_context(cafile=cluster["certificate-authority"])
    context.load_cert_chain(user["client-certificate"], user["client-key"])
    return cluster["server"], context


class KubeApi:
    def __init__(self, server: str, context: ssl.SSLContext) -> None:
        self.server = server
        self._ssl = context
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeApi:
        return cls(*ssl_from_kubeconfig(path))

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl, limit=32)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with self._http().request(
            method, self.server + path, data=data, params=params, headers=headers, timeout=timeout
        ) as response:
            text = await response.text()
            if response.status >= 400:
                raise ApiError(response.status, method, path, text)
            return json.loads(text) if text else {}

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return await self.request("GET", path, params=params)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body)

    async def patch(self, path: str, body: dict[str, Any], content_type: str = MERGE) -> dict[str, Any]:
        return await self.request("PATCH", path, body, content_type=content_type)

    async def delete(self, path: str, body: dict[str, Any] | None = None) -> None:
        try:
            await self.request("DELETE", path, body)
        except ApiError as error:
            if error.status not in (404, 409):  # gone already, or a different object (uid) now
                raise

    async def watch(self, path: str, params: Mapping[str, str]) -> AsyncIterator[Event]:
        """Every object now (as ADDED), then changes; relists when the watch expires or breaks.
        A relist also reports objects deleted meanwhile (as DELETED)."""
        known: dict[str, dict[str, Any]] = {}
        while True:
            try:
                listed = await self.request("GET", path, params=params)
                version = listed["metadata"]["resourceVersion"]
                current = {_uid(o): o for o in listed.get("items", [])}
                for uid in set(known) - set(current):
                    yield Event("DELETED", known.pop(uid))
                for uid, obj in current.items():
                    known[uid] = obj
                    yield Event("ADDED", obj)
                async for event in self._stream(path, params, version):
                    if event.type == "DELETED":
                        known.pop(_uid(event.object), None)
                    else:
                        known[_uid(event.object)] = event.object
                    yield event
            except (TimeoutError, aiohttp.ClientError, ApiError) as error:
                log.warning("watch %s broke, relisting: %s", path, error)
                await asyncio.sleep(RETRY_S)

    async def _stream(self, path: str, params: Mapping[str, str], version: str) -> AsyncIterator[Event]:
        query = {
            **params,
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_TIMEOUT_S),
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_read=WATCH_TIMEOUT_S + 30)
        async with self._http().get(self.server + path, params=query, timeout=timeout) as response:
            if response.status >= 400:
                raise ApiError(response.status, "WATCH", path, await response.text())
            async for line in response.content:
                event = json.loads(line)
                if event["type"] == "ERROR":
                    return  # 410 Gone and friends: relist
                if event["type"] == "BOOKMARK":
                    continue
                yield Event(event["type"], event["object"])


def _uid(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["uid"])
