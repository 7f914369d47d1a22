"""The routers' look-ahead: requests queued at a router, announced over HTTP, are kept and
moved up like the engine's own queued requests; each router's set replaces its last one, is
forgotten when the router falls silent, and all routers' sets together stay within the
look-ahead's bounds."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from strata.common.endpoints import EXPECT_PATH
from strata.common.kvbudget import MAX_EXPECTED
from strata.worker.kvtier import announced
from strata.worker.kvtier.announced import ANNOUNCED_TTL_S, MAX_ANNOUNCERS, Announcers, parse, within
from strata.worker.kvtier.metrics import TierMetrics, serve_http
from strata.worker.kvtier.protocol import ExpectConflict
from strata.worker.kvtier.service import KVTierService, Owner

from .conftest import kvtier_config

BLOCK = 4096


def key(n: int) -> bytes:
    return n.to_bytes(16, "big")


def hexes(*ns: int) -> list[str]:
    return [key(n).hex() for n in ns]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def service(root: Path) -> Iterator[KVTierService]:
    kv = KVTierService(kvtier_config(root), staging_slots=4)
    kv.configure(BLOCK)
    yield kv
    kv.close()


def expected(service: KVTierService, *ns: int) -> list[bool]:
    assert service.nvme is not None
    return [service.nvme.index.is_expected(key(n)) for n in ns]


def test_a_routers_set_replaces_its_last_one_and_others_sets_stay(service):
    routers = Announcers(service)
    assert routers.replace("router-a", {"r1": [key(1), key(2)], "r2": [key(3)]}) == 2
    routers.replace("router-b", {"r9": [key(9)]})
    assert expected(service, 1, 2, 3, 9) == [True, True, True, True]
    routers.replace("router-a", {"r2": [key(3)], "r4": [key(4)]})  # r1 was dispatched, r4 came
    assert expected(service, 1, 2, 3, 4, 9) == [False, False, True, True, True]
    routers.replace("router-a", {})
    assert expected(service, 3, 4, 9) == [False, False, True]
    assert lookahead(service)[("requests", "routers")] == 1


def test_a_silent_routers_set_is_forgotten(service):
    clock = Clock()
    routers = Announcers(service, clock)
    routers.replace("router-a", {"r1": [key(1)]})
    clock.now += ANNOUNCED_TTL_S / 2
    routers.replace("router-b", {"r2": [key(2)]})
    clock.now += ANNOUNCED_TTL_S / 2 + 1
    routers.expire()
    assert expected(service, 1, 2) == [False, True]


def test_all_routers_together_stay_within_the_lookahead(service, monkeypatch):
    monkeypatch.setattr(announced, "MAX_EXPECTED_BLOCKS", 5)
    routers = Announcers(service)
    assert routers.replace("router-a", {"r1": [key(1), key(2)], "r2": [key(3), key(4)]}) == 2
    # 1 block of room left: router-b's nearest request (2 blocks) does not fit, nor those after it
    assert routers.replace("router-b", {"r5": [key(5), key(6)], "r7": [key(7)]}) == 0
    assert routers.refused == 2 and expected(service, 5, 7) == [False, False]
    routers.replace("router-b", {"r5": [key(5), key(6)], "r7": [key(7)], "r8": [key(8), key(9)]})
    assert routers.refused == 3  # r5 and r7 again, not counted again; r8 is new
    for n in range(MAX_ANNOUNCERS + 1):  # the least recently heard router goes first
        routers.replace(f"router-{n}", {})
    assert expected(service, 1, 3) == [False, False]


def test_a_change_applies_to_the_set_it_names_and_no_other(service):
    routers = Announcers(service)
    routers.update(parse({"from": "router-a", "seq": 1, "requests": {"r1": hexes(1), "r2": hexes(2)}}))
    change = {"from": "router-a", "seq": 2, "base": 1, "add": {"r3": hexes(3)}, "order": ["r2", "r3"]}
    assert routers.update(parse(change)) == 2
    assert expected(service, 1, 2, 3) == [False, True, True]
    stale = {"from": "router-a", "seq": 3, "base": 1, "add": {"r4": hexes(4)}, "order": ["r4"]}
    with pytest.raises(ExpectConflict, match=r"^base: set 1 of router-a is not held here"):
        routers.update(parse(stale))
    lost = {"from": "router-a", "seq": 3, "base": 2, "add": {}, "order": ["r2", "r9"]}
    with pytest.raises(ExpectConflict, match=r"^order: r9"):
        routers.update(parse(lost))
    unknown = {"from": "router-b", "seq": 5, "base": 4, "add": {}, "order": []}
    with pytest.raises(ExpectConflict, match="none is"):
        routers.update(parse(unknown))
    assert expected(service, 2, 3, 4) == [True, True, False]  # a refused change changes nothing


def test_a_set_past_the_lookahead_is_not_kept_for_changes_to_name(service, monkeypatch):
    monkeypatch.setattr(announced, "MAX_EXPECTED_BLOCKS", 3)
    routers = Announcers(service)
    whole = {"from": "router-a", "seq": 1, "requests": {"r1": hexes(1, 2), "r2": hexes(3, 4)}}
    assert routers.update(parse(whole)) == 1  # r2 does not fit: nor is it remembered
    change = {"from": "router-a", "seq": 2, "base": 1, "add": {}, "order": ["r1", "r2"]}
    with pytest.raises(ExpectConflict, match=r"^order: r2"):  # the router sends its whole set
        routers.update(parse(change))


def test_the_metrics_count_each_sources_lookahead(service, monkeypatch):
    monkeypatch.setattr(announced, "MAX_EXPECTED_BLOCKS", 5)
    routers, engine = Announcers(service), Owner()
    service.expect(engine, "e1", [key(1), key(2)])
    routers.replace("router-a", {"r1": [key(3)], "r2": [key(4), key(5), key(6), key(7), key(8)]})
    assert lookahead(service) == {
        ("requests", "engine"): 1,
        ("blocks", "engine"): 2,
        ("refused", "engine"): 0,
        ("requests", "routers"): 1,
        ("blocks", "routers"): 1,
        ("refused", "routers"): 1,
    }
    routers.replace("router-a", {})
    service.unexpect(engine, ["e1"])
    assert lookahead(service)[("requests", "engine")] == 0 == lookahead(service)[("blocks", "routers")]


def lookahead(service: KVTierService) -> dict[tuple[str, str], float]:
    """The look-ahead's series in the sidecar's /metrics, as Prometheus reads them."""
    found = {}
    for family in text_string_to_metric_families(service.metrics.render().decode()):
        for sample in family.samples:
            if sample.name.startswith("strata_kvtier_lookahead_") and not sample.name.endswith("_created"):
                what = sample.name.removeprefix("strata_kvtier_lookahead_").removesuffix("_total")
                found[(what, sample.labels["source"])] = sample.value
    return found


def test_the_nearest_requests_are_kept():
    requests = {f"r{n}": [key(n)] for n in range(MAX_EXPECTED + 10)}
    kept = within(requests, room=10**6)
    assert list(kept) == [f"r{n}" for n in range(MAX_EXPECTED)]
    assert list(within({"a": [key(1)], "b": [key(2), key(3)], "c": [key(4)]}, room=2)) == ["a"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({"requests": {}}, "from"),
        ({"from": "", "requests": {}}, "from"),
        ({"from": "r"}, "requests"),
        ({"from": "r", "requests": {"q1": "00"}}, "requests.q1"),
        ({"from": "r", "requests": {"q1": ["zz"]}}, "requests.q1"),
        ({"from": "r", "requests": {"q1": [7]}}, "requests.q1"),
        ({"from": "r", "seq": -1, "requests": {}}, "seq"),
        ({"from": "r", "base": 1, "add": {}, "order": []}, "seq"),
        ({"from": "r", "seq": 2, "base": "1", "add": {}, "order": []}, "base"),
        ({"from": "r", "seq": 2, "base": 1, "order": []}, "add"),
        ({"from": "r", "seq": 2, "base": 1, "add": {"q1": ["zz"]}, "order": ["q1"]}, "add.q1"),
        ({"from": "r", "seq": 2, "base": 1, "add": {}, "order": "q1"}, "order"),
    ],
)
def test_a_bad_announcement_is_refused_naming_the_field(body, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        parse(body)


def post(port: int, body: Any, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{EXPECT_PATH}", data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_routers_announce_over_http_on_the_metrics_port(root, service):
    unconfigured = KVTierService(kvtier_config(root / "new"), staging_slots=4)
    for kv, port_of in ((service, "configured"), (unconfigured, "before hello")):
        routers = Announcers(kv)
        server = serve_http(0, TierMetrics(), lambda: True, "127.0.0.1", announce=routers.handle)
        port = server.server_address[1]
        try:
            body = {"from": "chat-router-a", "requests": {"q1": hexes(1, 2)}}
            if port_of == "before hello":
                status, answer = post(port, body)
                assert status == 503 and "hello" in answer["error"]
                continue
            assert post(port, body) == (200, {"announced": 1})
            assert expected(service, 1, 2) == [True, True]
            status, answer = post(port, None, raw=b"{not json")
            assert status == 400 and answer["error"]
            status, answer = post(port, {"from": "chat-router-a", "requests": {"q1": ["zz"]}})
            assert status == 400 and answer["error"].startswith("requests.q1:")
            assert expected(service, 1) == [True]  # a refused body changes nothing
            status, answer = post(
                port, {"from": "chat-router-a", "seq": 9, "base": 8, "add": {}, "order": []}
            )
            assert status == 409 and answer["error"].startswith("base:")
        finally:
            server.shutdown()
    unconfigured.close()
