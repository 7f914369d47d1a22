"""The look-ahead's cost benchmark, shrunk: both modes leave the sidecar holding the same set,
and a change carries fewer bytes than the whole set."""

from __future__ import annotations

import json

import pytest

from bench import routing_lookahead as bench
from strata.router.announce import Sent, plan


@pytest.fixture(autouse=True)
def small(monkeypatch):
    monkeypatch.setattr(bench, "QUEUE", 48)
    monkeypatch.setattr(bench, "TICKS", 3)
    monkeypatch.setattr(bench, "BLOCKS", (4,))


def test_a_change_brings_the_sidecar_to_the_same_set_as_the_whole_set():
    held = {}
    for mode in bench.MODES:
        sent: dict[str, Sent] = {}
        with bench.sidecar() as announcers:
            for tick, queue in enumerate(bench.queues(4)):
                sets = plan(queue, [f"e{k}" for k in range(bench.ENDPOINTS)])
                body = bench.encoded(sets, sent, tick, mode)["e0"]
                assert ("base" in json.loads(body)) == (mode == "change" and tick > 0)
                announcers.handle(json.loads(body))
            owner = announcers._routers["router"].owner
            held[mode] = dict(owner.expected)
    assert held["whole"] == held["change"] and len(held["whole"]) == 48 // bench.ENDPOINTS


def test_the_figures_side_by_side():
    result = bench.run()
    figures = result["4_blocks"]
    assert figures["change"]["bytes_per_tick"] < figures["whole"]["bytes_per_tick"]
    assert set(figures["whole_over_change"]) == {"router_cpu", "bytes", "sidecar_cpu"}
