"""Watches for benchmarks that cannot hang or lie.

``kubectl get --raw`` streams one resource's watch events; when the stream ends (the server's
timeout, a dropped connection, a killed kubectl) it is resumed from the last resourceVersion seen
(bookmarks keep that current), and when the server no longer has that version (410 Gone) or the
stream cannot be resumed, the resource is listed again. A consumer therefore sees every object's
latest state even across drops. :class:`FirstSeen` records when each object first met a
condition; its ``wait`` is bounded, and a timeout says how many objects met the condition by a
fresh list at that moment, next to how many the watch had seen."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

from strata.cluster import Cluster

Obj = dict[str, Any]
Key = tuple[str, str]
WATCH_TIMEOUT_S = 300  # the server ends each stream after this; the watch resumes it
LIST_CHUNK = 500
RETRY_S = 1.0
LIST_ATTEMPTS = 3


class WatchTimeout(TimeoutError):
    """A bounded wait ran out; the message counts what was done by then."""


class ResumableWatch:
    """A thread that lists then watches ``path``, resuming from the last resourceVersion."""

    def __init__(
        self, cluster: Cluster, path: str, on_object: Callable[[Obj], None], selector: str = ""
    ) -> None:
        self.cluster, self.path, self.on_object, self.selector = cluster, path, on_object, selector
        self.proc: subprocess.Popen[str] | None = None
        self.resumed = 0  # streams resumed from a resourceVersion
        self.relisted = 0  # lists after the first (410 Gone, or a stream that could not resume)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch {path}")

    def start(self) -> ResumableWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
        self._thread.join(30)

    def _run(self) -> None:
        version: str | None = None
        while not self._stopped.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._watch(version)
            except (subprocess.SubprocessError, OSError, ValueError) as exc:
                print(f"bench watch {self.path}: {exc}; retrying", flush=True)
                version = None
                self._stopped.wait(RETRY_S)
            if version is None:
                self.relisted += 1
            else:
                self.resumed += 1

    def _query(self, **params: str) -> str:
        given = {"labelSelector": self.selector, **params} if self.selector else params
        return f"{self.path}?{urlencode(given)}"

    def _list(self) -> str:
        """Every object, in chunks; returns the list's resourceVersion."""
        token = ""
        while True:
            params = {"limit": str(LIST_CHUNK), **({"continue": token} if token else {})}
            listed = json.loads(self.cluster.kubectl("get", "--raw", self._query(**params)).stdout)
            for item in listed.get("items", []):
                self.on_object(item)
            token = listed["metadata"].get("continue", "")
            if not token:
                return str(listed["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str | None:
        """Stream events from ``version``; the version to resume from, or None to list again."""
        query = self._query(
            watch="true",
            resourceVersion=version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(WATCH_TIMEOUT_S),
        )
        argv = [
            str(self.cluster.bin_dir / "kubectl"),
            f"--kubeconfig={self.cluster.kubeconfig}",
            "get",
            "--raw",
            query,
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            for event in _events(self.proc):
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    return None if obj.get("code") == 410 else version
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if event.get("type") in ("ADDED", "MODIFIED"):
                    self.on_object(obj)
            return version
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()


def _events(proc: subprocess.Popen[str]) -> Iterator[Obj]:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip():
            yield json.loads(line)


class FirstSeen:
    """When each object (namespace, name) was first seen meeting ``condition``, by any watch
    event or list; ``wait`` blocks until a set of keys all have, within a bound."""

    def __init__(
        self, condition: Callable[[Obj], bool], key: Callable[[Obj], Key | None] | None = None
    ) -> None:
        self.condition = condition
        self.key = key or _name_key
        self.seen: dict[Key, float] = {}
        self.changed = threading.Condition()

    def __call__(self, obj: Obj) -> None:
        key = self.key(obj)
        if key is not None and self.condition(obj):
            with self.changed:
                if key not in self.seen:
                    self.seen[key] = time.monotonic()
                    self.changed.notify_all()

    def wait(
        self, keys: set[Key], timeout_s: float, recount: Callable[[set[Key]], int], what: str
    ) -> dict[Key, float]:
        """The first-seen times of ``keys`` once all are seen; WatchTimeout after ``timeout_s``,
        saying how many ``recount`` (a fresh list) finds done at that moment."""
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while not keys <= self.seen.keys():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.changed.wait(min(left, 5))
            else:
                return {k: self.seen[k] for k in keys}
            watched = len(keys & self.seen.keys())
        raise WatchTimeout(
            f"timed out after {timeout_s:.0f}s: {_recounted(recount, keys, what)} "
            f"({watched} seen by the watch)"
        )


def _recounted(recount: Callable[[set[Key]], int], keys: set[Key], what: str) -> str:
    """How many ``recount`` finds done, or why it could not say: the API server that made the
    wait run out may not answer a list either, and the benchmark must still report."""
    for attempt in range(LIST_ATTEMPTS):
        try:
            return f"{recount(keys)}/{len(keys)} {what} by a list now"
        except (subprocess.SubprocessError, OSError, ValueError) as exc:
            error = exc
            time.sleep(RETRY_S * 2**attempt)
    return f"unknown how many of {len(keys)} {what}: {LIST_ATTEMPTS} lists failed, the last with {error}"


def _name_key(obj: Obj) -> Key:
    meta = obj.get("metadata", {})
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def ready(obj: Obj) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
