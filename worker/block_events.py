"""Block events: which KV blocks a process holds in which tier, as a stream routers follow.

The engine (HBM) and the KV-tier sidecar (DRAM, NVMe, shared) each own one :class:`BlockEvents`;
their block bookkeeping calls ``stored``/``removed`` (from any thread, cheap: a lock and a list
append per subscriber). Each subscriber first receives a full snapshot, then every change since,
so a router that (re)connects has an exact view at once.

The wire format is NDJSON over HTTP (``GET /kv/events``), one object per line:

- ``{"event": "snapshot", "instance": ID, "tier": T, "blocks": [HEX, ...]}``: part of the
  snapshot (one or more lines per tier);
- ``{"event": "synced", "instance": ID}``: the snapshot is complete;
- ``{"event": "stored" | "removed", "tier": T, "blocks": [HEX, ...]}``: changes, in order;
- ``{"event": "ping", "status": {...}}``: at least every ``HEARTBEAT_S`` seconds, so a silent
  stream means a dead or hung process; ``status`` carries the producer's load, when it has one
  (the worker: ``pending_tokens``, ``kv_usage``).

A subscriber that falls more than ``MAX_BACKLOG`` changes behind is cut off (its stream ends);
it reconnects and starts again from a snapshot. Torch-free: the router parses these lines.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from strata.common.tiers import TIERS

HEARTBEAT_S = 1.0
MAX_BACKLOG = 1 << 18
LINE_BLOCKS = 1024  # most hashes per line (~36 KB), so a follower's line buffer stays small
# Snapshot lines a writer takes per wake-up (64k keys, ~2.3 MB): a sidecar's tiers of millions
# of blocks are sent in pieces, not first turned into one list of lines (hundreds of MB).
SNAPSHOT_LINES = 64

Change = tuple[str, str, bytes]  # (stored | removed, tier, block hash)


@dataclass
class Snapshot:
    """What a follower is owed first: each tier's keys as they were when it subscribed (taken
    as a list of references, 8 bytes a key), turned into lines a few at a time as they are
    written, so that following a tier of millions of blocks does not build all its lines at
    once; then the ``synced`` line."""

    instance: str
    tiers: list[tuple[str, list[bytes]]]
    _at: int = 0  # keys of the first tier already written

    def lines(self, most: int) -> list[str]:
        """Up to ``most`` lines, the ``synced`` line last once every key went out."""
        lines: list[str] = []
        while self.tiers and len(lines) < most:
            tier, keys = self.tiers[0]
            chunk = [k.hex() for k in keys[self._at : self._at + LINE_BLOCKS]]
            self._at += LINE_BLOCKS
            if chunk:
                lines.append(
                    json.dumps(
                        {"event": "snapshot", "instance": self.instance, "tier": tier, "blocks": chunk}
                    )
                )
            if self._at >= len(keys):
                self.tiers.pop(0)
                self._at = 0
        if not self.tiers and len(lines) < most:
            lines.append(json.dumps({"event": "synced", "instance": self.instance}))
            self.instance = ""  # sent
        return lines

    @property
    def done(self) -> bool:
        return not self.tiers and not self.instance


@dataclass(eq=False)
class Subscription:
    """One follower's queue of changes; ``wake`` is called (from the producer's thread) when
    changes arrive, to wake the thread or event loop that writes the stream."""

    wake: Callable[[], None]
    limit: int = MAX_BACKLOG
    snapshot: Snapshot | None = None
    overflowed: bool = False
    _changes: list[Change] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def push(self, change: Change) -> None:
        with self._lock:
            if len(self._changes) >= self.limit:
                self.overflowed = True
            else:
                self._changes.append(change)
        self.nudge()

    def nudge(self) -> None:
        with contextlib.suppress(RuntimeError):  # the writer's event loop closed: nothing to wake
            self.wake()

    def drain(self) -> list[str]:
        """The lines to write now: the snapshot first (``SNAPSHOT_LINES`` a call: the writer is
        woken again for the rest), then the changes, runs batched per line."""
        with self._lock:
            lines = self.snapshot.lines(SNAPSHOT_LINES) if self.snapshot is not None else []
            if self.snapshot is not None and not self.snapshot.done:
                changes: list[Change] = []
            else:
                self.snapshot = None
                changes, self._changes = self._changes, []
        if self.snapshot is not None:
            self.nudge()
        return lines + list(_batched(changes))


class BlockEvents:
    """The holdings of one process by tier, and its subscribers."""

    def __init__(self, status: Callable[[], dict[str, Any]] | None = None) -> None:
        self.instance = uuid.uuid4().hex
        self.status = status
        self._held: dict[str, set[bytes]] = {}
        # Tiers whose producer keeps the record of what they hold itself (``track``).
        self._tracked: dict[str, Callable[[], list[bytes]]] = {}
        self._subscribers: list[Subscription] = []
        self._lock = threading.Lock()

    def track(self, tier: str, holdings: Callable[[], list[bytes]]) -> None:
        """The producer keeps what ``tier`` holds itself (a sidecar's tier index, millions of
        blocks): no copy of it is kept here (about 50 bytes a block). ``holdings`` returns the
        keys held now, read in one step under the GIL (``list`` of a dict); snapshots call it.
        Every ``stored``/``removed`` the producer reports for the tier must then be a real
        change, and come after the change itself: a follower subscribing in between sees a
        block in the snapshot and again as stored (or absent and then removed), which followers
        take as they take any event, as a set add or discard."""
        with self._lock:
            self._tracked[tier] = holdings
            self._held.pop(tier, None)

    def stored(self, tier: str, keys: Iterable[bytes]) -> None:
        self._change("stored", tier, keys)

    def removed(self, tier: str, keys: Iterable[bytes]) -> None:
        self._change("removed", tier, keys)

    def _change(self, op: str, tier: str, keys: Iterable[bytes]) -> None:
        with self._lock:
            if tier in self._tracked:
                for key in keys:
                    for sub in self._subscribers:
                        sub.push((op, tier, key))
                return
            held = self._held.setdefault(tier, set())
            for key in keys:
                if (key in held) == (op == "removed"):  # only real changes go out
                    (held.discard if op == "removed" else held.add)(key)
                    for sub in self._subscribers:
                        sub.push((op, tier, key))

    def held(self, tier: str) -> set[bytes]:
        with self._lock:
            tracked = self._tracked.get(tier)
            return set(tracked()) if tracked is not None else set(self._held.get(tier, ()))

    def subscribe(self, wake: Callable[[], None]) -> Subscription:
        """A new follower: its first ``drain`` returns the snapshot, atomically with what follows."""
        sub = Subscription(wake)
        with self._lock:
            tiers = [(tier, list(held)) for tier, held in self._held.items()]
            tiers += [(tier, keys()) for tier, keys in self._tracked.items()]
            sub.snapshot = Snapshot(self.instance, tiers)
            self._subscribers.append(sub)
        sub.nudge()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.remove(sub)

    def ping_line(self) -> str:
        status = self.status() if self.status is not None else {}
        return json.dumps({"event": "ping", "status": status})


class Pacer:
    """When a stream writer should add a ping: whenever ``HEARTBEAT_S`` passed since the last."""

    def __init__(self, now: float) -> None:
        self.last = now

    def due(self, now: float) -> bool:
        if now - self.last < HEARTBEAT_S:
            return False
        self.last = now
        return True


def follow(events: BlockEvents, write: Callable[[bytes], None], stop: threading.Event) -> None:
    """Write the stream from a thread until ``stop``, a failed ``write`` (the follower left, an
    OSError) or an overflow (the follower reconnects for a fresh snapshot)."""
    wake = threading.Event()
    sub = events.subscribe(wake.set)
    pacer = Pacer(time.monotonic())
    try:
        while not stop.is_set():
            wake.wait(HEARTBEAT_S)
            wake.clear()
            lines = sub.drain()
            if sub.overflowed:
                return
            if pacer.due(time.monotonic()):
                lines.append(events.ping_line())
            if lines:
                write("".join(line + "\n" for line in lines).encode())
    finally:
        events.unsubscribe(sub)


def _batched(changes: list[Change]) -> Iterator[str]:
    """Consecutive changes with the same op and tier become one line (of at most LINE_BLOCKS)."""
    i = 0
    while i < len(changes):
        op, tier, _ = changes[i]
        j = i
        while j < len(changes) and j - i < LINE_BLOCKS and changes[j][:2] == (op, tier):
            j += 1
        yield json.dumps({"event": op, "tier": tier, "blocks": [c[2].hex() for c in changes[i:j]]})
        i = j


# ---- the follower's side ----


@dataclass(frozen=True)
class Event:
    kind: str  # snapshot, synced, stored, removed, ping
    tier: str = ""
    blocks: tuple[bytes, ...] = ()
    instance: str = ""
    status: dict[str, Any] = field(default_factory=dict)


class BadEvent(ValueError):
    """A line that is not a block event; the stream it came from is not to be trusted."""


def parse_line(line: str | bytes) -> Event:
    try:
        obj = json.loads(line)
        kind = obj["event"]
        if kind not in ("snapshot", "synced", "stored", "removed", "ping"):
            raise BadEvent(f"event: unknown kind {kind!r}")
        tier = obj.get("tier", "")
        if kind in ("snapshot", "stored", "removed") and tier not in TIERS:
            raise BadEvent(f"tier: expected one of {TIERS}, got {tier!r}")
        blocks = tuple(bytes.fromhex(h) for h in obj.get("blocks", ()))
        status = obj.get("status") or {}
        if not isinstance(status, dict):
            raise BadEvent("status: expected an object")
        return Event(kind, tier, blocks, str(obj.get("instance", "")), status)
    except BadEvent:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadEvent(f"not a block event: {exc}") from exc
