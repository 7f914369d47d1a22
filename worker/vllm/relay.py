"""The KV-tier sidecar's relay of its vLLM engine's KV events: the engine's HBM blocks as Strata
keys, served to routers like every other block-event stream (``strata.common.endpoints.ENGINE_EVENTS_PATH``).

vLLM publishes its events on a ZMQ PUB socket it binds on an ``ipc://`` path in the pod's
socket directory (nothing listens on the network, and pods sharing a node never collide); the
relay subscribes there. ZMQ keeps no state for a late subscriber, so the relay keeps it: when
it connects (at start, or when a restarted engine binds again) it asks vLLM's replay socket for
every batch it still buffers, then applies the live batches past those. When the engine goes
away its HBM goes with it: the relay drops every block (a restarted engine starts empty). A
router that (re)connects gets a snapshot and then the changes (``block_events``), which vLLM's
own stream cannot give it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from strata.worker.block_events import BlockEvents
from strata.worker.vllm.events import Changes, EngineBlocks

log = logging.getLogger(__name__)
TIER = "hbm"
POLL_MS = 200
REPLAY_TIMEOUT_MS = 5000
END_SEQ = -1


@dataclass(frozen=True)
class Endpoints:
    events: str  # vLLM's PUB socket (it binds, the relay connects)
    replay: str  # vLLM's ROUTER socket answering replay requests


class EventRelay:
    def __init__(self, endpoints: Endpoints, blocks: EngineBlocks, events: BlockEvents) -> None:
        self.endpoints, self.blocks, self.events = endpoints, blocks, events
        self.last_seq = -1
        self.batches = 0  # applied, for the tests and the log

    def apply(self, seq: int, payload: bytes) -> None:
        """One published batch: ``[ts, events, data_parallel_rank]`` in msgpack."""
        if seq <= self.last_seq:
            return  # replayed already
        self.last_seq = seq
        batch = msgspec.msgpack.decode(payload)
        events: list[dict[str, Any]] = batch[1] if isinstance(batch, list) and len(batch) > 1 else []
        self._publish(self.blocks.apply(e for e in events if isinstance(e, dict)))
        self.batches += 1

    def reset(self, why: str) -> None:
        """The engine (re)started or went away: it holds nothing now."""
        removed = self.blocks.clear()
        self.last_seq = -1
        if removed:
            self.events.removed(TIER, removed)
        log.info("kv events relay: %s; the engine's %d blocks forgotten", why, len(removed))

    def _publish(self, changes: Changes) -> None:
        if changes.removed:
            self.events.removed(TIER, changes.removed)
        if changes.stored:
            self.events.stored(TIER, changes.stored)

    def run(self, stop: threading.Event) -> None:
        """Follow the engine until ``stop``; a daemon thread's body."""
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sub.connect(self.endpoints.events)
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while not stop.is_set():
                ready = dict(poller.poll(POLL_MS))
                if monitor in ready:
                    self._on_monitor(recv_monitor_message(monitor), ctx)
                if sub in ready:
                    _topic, seq, payload = sub.recv_multipart()
                    self._on_batch(int.from_bytes(seq, "big", signed=True), payload, ctx)
        finally:
            sub.disable_monitor()
            monitor.close(0)
            sub.close(0)
            ctx.term()

    def _on_monitor(self, message: Mapping[str, object], ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        if message["event"] == zmq.EVENT_CONNECTED:
            self.reset("engine connected")
            self._replay(ctx, 0)
        elif message["event"] == zmq.EVENT_DISCONNECTED:
            self.reset("engine gone")

    def _on_batch(self, seq: int, payload: bytes, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        if self.last_seq >= 0 and seq > self.last_seq + 1:
            self._replay(ctx, self.last_seq + 1)  # batches dropped on the way: fetch them
        self.apply(seq, payload)

    def _replay(self, ctx: zmq.Context[zmq.Socket[bytes]], start: int) -> None:
        """Apply every batch from ``start`` that the engine still buffers (bounded wait)."""
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(self.endpoints.replay)
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while dealer.poll(REPLAY_TIMEOUT_MS):
                frames = dealer.recv_multipart()
                seq = int.from_bytes(frames[2], "big", signed=True)
                if seq == END_SEQ:
                    return
                self.apply(seq, frames[3])
            log.warning(
                "kv events relay: no replay from %s; following live events only", self.endpoints.replay
            )
        finally:
            dealer.close(0)


def start_relay(
    endpoints: Endpoints, blocks: EngineBlocks, events: BlockEvents, stop: threading.Event
) -> EventRelay:
    relay = EventRelay(endpoints, blocks, events)
    threading.Thread(target=_logged(relay.run), args=(stop,), name="kv-events-relay", daemon=True).start()
    return relay


def _logged(run: Callable[[threading.Event], None]) -> Callable[[threading.Event], None]:
    def body(stop: threading.Event) -> None:
        try:
            run(stop)
        except Exception:  # the tiers keep serving without it; routers fall back to their records
            log.exception("kv events relay stopped")

    return body
