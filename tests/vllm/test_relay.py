"""The sidecar's relay of vLLM's KV events, against a publisher speaking vLLM's ZMQ wire format:
late subscribers catch up by replay, a gone engine empties HBM, routers get a snapshot."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from strata.worker.block_events import BlockEvents
from strata.worker.kv_connector import chain_hashes
from strata.worker.vllm.events import EngineBlocks
from strata.worker.vllm.keys import vllm_root
from strata.worker.vllm.relay import Endpoints, EventRelay, start_relay

BS = 4
WAIT_S = 30.0


def root_of(salt: str | None, lora: str | None) -> bytes:
    return vllm_root("ns", "m", BS, "cpu", salt=salt, lora=lora)


class Publisher:
    """vLLM's ZmqEventPublisher, as far as the wire goes: PUB (topic, seq, msgpack batch) and a
    ROUTER answering a start sequence with every buffered batch from it, then seq -1."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(endpoints.events)
        self.replay = self.ctx.socket(zmq.ROUTER)
        self.replay.bind(endpoints.replay)
        self.buffer: list[tuple[int, bytes]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve_replay, daemon=True)
        self.thread.start()

    def publish(self, events: list[dict[str, Any]]) -> None:
        seq = len(self.buffer)
        payload = msgspec.msgpack.encode([time.time(), events, 0])
        self.buffer.append((seq, payload))
        self.pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])

    def _serve_replay(self) -> None:
        while not self.stop.is_set():
            if not self.replay.poll(50):
                continue
            client, _, start = self.replay.recv_multipart()
            for seq, payload in list(self.buffer):
                if seq >= int.from_bytes(start, "big"):
                    self.replay.send_multipart([client, b"", b"kv", seq.to_bytes(8, "big"), payload])
            self.replay.send_multipart([client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.pub.close(0)
        self.replay.close(0)
        self.ctx.term()


def stored(hashes: list[bytes], parent: bytes | None, tokens: list[int]) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": BS, "medium": "GPU"}  # fmt: skip


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S:g}s: {what}")
        time.sleep(0.02)


@pytest.fixture
def endpoints(tmp_path: Path) -> Endpoints:
    return Endpoints(f"ipc://{tmp_path}/events.sock", f"ipc://{tmp_path}/replay.sock")


@pytest.fixture
def relay(endpoints: Endpoints) -> Iterator[tuple[EventRelay, BlockEvents]]:
    events, stop = BlockEvents(), threading.Event()
    relay = start_relay(endpoints, EngineBlocks(root_of, BS), events, stop)
    yield relay, events
    stop.set()


def test_batches_published_before_the_relay_connected_arrive_by_replay(endpoints: Endpoints) -> None:
    publisher = Publisher(endpoints)
    try:
        publisher.publish([stored([b"a", b"b"], None, list(range(8)))])
        events, stop = BlockEvents(), threading.Event()
        start_relay(endpoints, EngineBlocks(root_of, BS), events, stop)
        keys = chain_hashes(root_of(None, None), list(range(8)), BS)
        eventually(lambda: events.held("hbm") == set(keys), "the replayed blocks held")
        publisher.publish([{"type": "BlockRemoved", "block_hashes": [b"b"], "medium": "GPU"}])
        eventually(lambda: events.held("hbm") == {keys[0]}, "the live removal applied")
        stop.set()
    finally:
        publisher.close()


def test_an_engine_that_goes_away_takes_its_blocks_and_a_new_one_starts_empty(
    relay: tuple[EventRelay, BlockEvents], endpoints: Endpoints
) -> None:
    _, events = relay
    first = Publisher(endpoints)
    eventually(lambda: _published_and_seen(first, events), "the first engine's block held")
    first.close()
    eventually(lambda: not events.held("hbm"), "HBM emptied when the engine went away")
    second = Publisher(endpoints)
    try:
        eventually(lambda: _published_and_seen(second, events, tokens=[9, 9, 9, 9]), "the new engine's block")
        assert len(events.held("hbm")) == 1
    finally:
        second.close()


def _published_and_seen(publisher: Publisher, events: BlockEvents, tokens: list[int] | None = None) -> bool:
    """Publish until the relay has subscribed and applied one block (PUB drops what it sends
    before a subscriber joins; the relay's replay picks those up once it is connected)."""
    tokens = tokens or [1, 2, 3, 4]
    if not publisher.buffer:
        publisher.publish([stored([bytes(tokens)], None, tokens)])
    return chain_hashes(root_of(None, None), tokens, BS)[0] in events.held("hbm")


def test_a_batch_seen_twice_replayed_and_live_is_applied_once(endpoints: Endpoints) -> None:
    relay = EventRelay(endpoints, EngineBlocks(root_of, BS), BlockEvents())
    relay.apply(0, msgspec.msgpack.encode([0.0, [stored([b"a"], None, [1, 2, 3, 4])], 0]))
    relay.apply(0, msgspec.msgpack.encode([0.0, [stored([b"z"], None, [5, 5, 5, 5])], 0]))  # seq 0 again
    assert relay.batches == 1 and len(relay.events.held("hbm")) == 1
