"""The real sidecar runs the simulation's policies: a slice of the Mooncake conversation trace
replayed through its socket protocol (lookup, get, release, reserve, put, and expect/unexpect
for the look-ahead), as the engine would send it, gives the very hit counts the simulation
computes with the same eviction and admission policies."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import pytest

from strata.worker.kvtier import protocol, simulate

from .conftest import TRACES, kvtier_config

TRACE = TRACES / "mooncake_conversation.jsonl"
REQUESTS = 400
CAPACITY = 300  # blocks: small enough that admission and eviction decide the hits
BLOCK_BYTES = 64  # one 4 KiB slot per block
ROOT = b"\xff" * 16  # the chain root the engine sends as the first block's parent


def chains() -> list[list[bytes]]:
    trace = simulate.load_trace(TRACE)[:REQUESTS]
    return [[k.to_bytes(16, "big") for k in chain] for chain in trace]


class Engine:
    """What the engine's connector sends for one request, without the bytes."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(path)
        self.call({"op": "hello", "block_bytes": BLOCK_BYTES})

    def call(self, message: dict[str, Any]) -> dict[str, Any]:
        protocol.send(self.sock, message)
        reply = protocol.receive(self.sock)
        assert reply is not None and reply["ok"], reply
        return reply

    def request(self, chain: Sequence[bytes]) -> int:
        keys = [k.hex() for k in chain]
        hits = len(self.call({"op": "lookup", "keys": keys})["tiers"])
        if hits:
            slots = self.call({"op": "get", "keys": keys[:hits]})["slots"]
            self.call({"op": "release", "slots": slots})
        parents = [ROOT.hex(), *keys[:-1]]
        slots = self.call({"op": "reserve", "keys": keys, "parents": parents})["slots"]
        taken = [i for i, slot in enumerate(slots) if slot is not None]
        put = {
            "op": "put",
            "keys": [keys[i] for i in taken],
            "parents": [parents[i] for i in taken],
            "slots": [slots[i] for i in taken],
        }
        self.call(put)
        return hits

    def expect(self, number: int, chain: Sequence[bytes]) -> None:
        self.call({"op": "expect", "request": str(number), "keys": [k.hex() for k in chain]})

    def unexpect(self, number: int) -> None:
        self.call({"op": "unexpect", "requests": [str(number)]})


def replay_through_sidecar(engine: Engine, trace: list[list[bytes]], lookahead: int) -> int:
    """The order of :func:`simulate.replay`: the next ``lookahead`` requests are queued."""
    for number in range(1, min(lookahead, len(trace) - 1) + 1):
        engine.expect(number, trace[number])
    hits = 0
    for i, chain in enumerate(trace):
        hits += engine.request(chain)
        if lookahead and i + 1 < len(trace):
            engine.unexpect(i + 1)
            if i + 1 + lookahead < len(trace):
                engine.expect(i + 1 + lookahead, trace[i + 1 + lookahead])
    return hits


def simulated(trace: list[list[bytes]], eviction: str, admission: str, lookahead: int) -> tuple[int, int]:
    """Hits, and the blocks held at the end."""
    total = sum(len(chain) for chain in trace)
    cache = simulate.Cache(CAPACITY, eviction, admission)
    ratio = simulate.replay(trace, cache, lookahead)
    return round(ratio * total), len(cache.index)


@pytest.mark.skipif(not TRACE.exists(), reason="traces not present")
@pytest.mark.parametrize(
    ("eviction", "admission", "lookahead"),
    [
        ("lru", "always", 0),
        ("prefix-aware", "doorkeeper", 0),
        ("prefix-aware", "adaptive", 0),
        ("lru", "adaptive", 8),
    ],
)
def test_sidecar_hits_equal_the_simulation(root, start_sidecar, eviction, admission, lookahead):
    trace = chains()
    config = kvtier_config(
        root,
        dram={"capacity_bytes": CAPACITY * 4096, "eviction": eviction, "admission": admission},
        nvme={"capacity_bytes": 0},
    )
    sidecar = start_sidecar(config, BLOCK_BYTES)
    engine = Engine(config.socket_path)
    hits = replay_through_sidecar(engine, trace, lookahead)
    engine.sock.close()
    held = sidecar.service.stats()["tiers"]["dram"]["blocks"]
    assert (hits, held) == simulated(trace, eviction, admission, lookahead)


@pytest.mark.skipif(not TRACE.exists(), reason="traces not present")
def test_the_admission_policies_differ_on_the_slice():
    """So that the equality above means something: the policies do not all agree."""
    trace = chains()
    always = simulate.Cache(CAPACITY, "prefix-aware", "always")
    doorkeeper = simulate.Cache(CAPACITY, "prefix-aware", "doorkeeper")
    assert simulate.replay(trace, doorkeeper) != simulate.replay(trace, always)
    assert always.index.refused == 0 < doorkeeper.index.refused  # first sightings in a full tier
