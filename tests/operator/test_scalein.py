"""Cache-aware scale-in: the cache value of a pod (pure), and the glue that annotates the pods
with their deletion cost before the autoscaler lowers the replica count."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest

from strata.operator.autoscale.cachevalue import (
    DELETION_COST,
    MAX_COST,
    HitScore,
    PodCache,
    cache_value,
    decayed,
    deletion_cost,
    local_hits,
    note,
    ranking,
    update_hits,
)
from strata.operator.autoscale.metrics import MetricsError, PodSample, parse_exposition, parse_tier_blocks
from strata.operator.autoscale.scalein import ScaleIn
from strata.operator.autoscale.signals import Scrape
from strata.operator.kube import KubeClient, Obj


def sample(prompt: float, cached: float = 0, **hits: float) -> PodSample:
    return PodSample(prompt_tokens=prompt, prefix_hit_tokens=hits, kv_cached_blocks=cached)


def test_local_hits_leave_out_the_shared_tier_and_count_a_restart_whole() -> None:
    before = sample(100, hbm=10, dram=5, shared=50)
    assert local_hits(before, sample(300, hbm=40, dram=25, nvme=7, shared=500)) == 30 + 20 + 7
    restarted = sample(20, hbm=4)  # counters went down: everything since the restart is new
    assert local_hits(before, restarted) == 4


def test_hit_scores_decay_with_the_half_life() -> None:
    first = update_hits(None, sample(0), sample(1000, hbm=800), at=0.0, half_life_s=100.0)
    assert first == HitScore(800, 0.0)
    later = update_hits(first, sample(1000, hbm=800), sample(1100, hbm=900), at=100.0, half_life_s=100.0)
    assert later.tokens == pytest.approx(400 + 100)
    assert decayed(later, 300.0, half_life_s=100.0) == pytest.approx(125)
    assert decayed(None, 5.0) == 0.0


def test_cache_value_is_recent_hits_plus_tokens_held_in_local_tiers() -> None:
    pod = PodCache("a", hit_tokens=1000, held_blocks={"hbm": 10, "dram": 20, "nvme": 30, "shared": 999})
    assert cache_value(pod, block_size=16) == 1000 + 60 * 16


def test_deletion_cost_is_an_int32_never_negative() -> None:
    assert deletion_cost(1234.4) == 1234
    assert deletion_cost(-5) == deletion_cost(math.nan) == 0
    assert deletion_cost(1e12) == MAX_COST == 2**31 - 1


def test_ranking_puts_the_coldest_first_and_a_hot_pod_above_a_full_idle_one() -> None:
    hot = PodCache("hot", hit_tokens=50_000, held_blocks={"hbm": 100})  # served a lot lately
    full = PodCache("full", hit_tokens=0, held_blocks={"dram": 2_000})  # holds much, served nothing
    new = PodCache("new", hit_tokens=0, held_blocks={})
    twin = PodCache("a-twin", hit_tokens=0, held_blocks={})
    assert ranking([hot, full, new, twin], block_size=16) == [
        ("a-twin", 0),
        ("new", 0),
        ("full", 32_000),
        ("hot", 51_600),
    ]


def test_notes_name_the_first_to_go() -> None:
    ranked = [("chat-b", 10), ("chat-a", 900)]
    assert note(ranked, None).startswith("coldest first: chat-b goes first")
    assert "chat-a 900" in note(ranked, None)
    assert note(ranked, "chat-2").startswith("StatefulSet removes the highest ordinal, chat-2")
    assert note([], None) == "no pod with metrics to rank"


def test_metrics_carry_hbm_and_sidecar_blocks() -> None:
    assert parse_exposition(
        "strata_worker_kv_cache_usage_ratio 0.1\nstrata_worker_kv_cached_blocks 42\n"
    ) == (PodSample(kv_usage=0.1, kv_cached_blocks=42))
    text = 'strata_kvtier_blocks{tier="dram"} 7\nstrata_kvtier_blocks{tier="nvme"} 9\n'
    assert parse_tier_blocks(text) == {"dram": 7, "nvme": 9}
    with pytest.raises(MetricsError, match="strata_kvtier_blocks"):
        parse_tier_blocks("something_else 1\n")


class PodsKube(KubeClient):
    """Lists the given pods and records patches; nothing else."""

    def __init__(self, pods: list[Obj]) -> None:
        self.pods = pods
        self.patches: list[tuple[str, Any]] = []

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        if method == "GET":
            assert params == {
                "labelSelector": "app.kubernetes.io/instance=chat,app.kubernetes.io/name=strata-worker"
            }
            return {"items": self.pods}
        self.patches.append((path, body))
        return {}


def pod(name: str, ip: str, owner: str = "ReplicaSet", ready: bool = True) -> Obj:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "ownerReferences": [{"kind": owner, "name": "x"}]},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": str(ready)}]},
    }


ISVC: Obj = {
    "metadata": {"name": "chat", "namespace": "ns", "uid": "u"},
    "spec": {"engine": {"blockSize": 4}},
}
SIDECARS = {
    "http://127.0.0.1:8001/metrics": 'strata_kvtier_blocks{tier="dram"} 100\n',  # a: big DRAM, no hits
    "http://127.0.0.2:8001/metrics": 'strata_kvtier_blocks{tier="dram"} 1\n',
}


async def fetch(url: str) -> str | None:
    return SIDECARS.get(url)  # c's sidecar does not answer: its HBM blocks still count


async def test_scale_in_annotates_every_ranked_pod_with_its_cost() -> None:
    pods = [
        pod("a", "127.0.0.1"),
        pod("b", "127.0.0.2"),
        pod("c", "127.0.0.3"),
        pod("d", "127.0.0.4", ready=False),
    ]
    kube = PodsKube(pods)
    scale_in = ScaleIn(kube, fetch)
    first = Scrape(0.0, {"uid-a": sample(0), "uid-b": sample(0), "uid-c": sample(0)})
    second = Scrape(
        15.0,
        {
            "uid-a": sample(100, cached=2),
            "uid-b": sample(900, cached=3, hbm=600),
            "uid-c": sample(50, cached=1),
        },
    )
    scale_in.observe(first, second)
    message = await scale_in.prepare(ISVC, second, now=15.0)
    costs = {
        path.rsplit("/", 1)[1]: body["metadata"]["annotations"][DELETION_COST] for path, body in kube.patches
    }
    # a: 102 blocks x 4; b: 600 hit tokens + 4 blocks x 4; c: 1 block x 4. d is unready: not ranked.
    assert costs == {"a": "408", "b": "616", "c": "4"}
    assert all(path.startswith("/api/v1/namespaces/ns/pods/") for path, _ in kube.patches)
    assert message.startswith("coldest first: c goes first")


async def test_a_statefulset_is_not_annotated_and_the_note_names_its_highest_ordinal() -> None:
    pods = [pod(f"chat-{i}", f"127.0.0.{i + 1}", owner="StatefulSet") for i in (0, 1, 10, 2)]
    kube = PodsKube(pods)
    latest = Scrape(1.0, {f"uid-chat-{i}": sample(1) for i in (0, 1, 10, 2)})
    message = await ScaleIn(kube, fetch).prepare(ISVC, latest, now=1.0)
    assert kube.patches == []
    assert message.startswith("StatefulSet removes the highest ordinal, chat-10;")


async def test_old_scores_are_forgotten() -> None:
    scale_in = ScaleIn(PodsKube([]), fetch)
    scale_in.observe(Scrape(0.0, {"gone": sample(0)}), Scrape(1.0, {"gone": sample(10, hbm=5)}))
    assert "gone" in scale_in.scores
    scale_in.observe(Scrape(5000.0, {}), Scrape(5001.0, {}))
    assert scale_in.scores == {}
