"""The choice function: cost by tier, load, the guards, ties, and the fallback order."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, cast

import pytest

from strata.common.tiers import Tier
from strata.router.choose import Candidate, Lookup, Policy, Prompt, choose
from strata.router.weights import TierWeights

WEIGHTS = TierWeights(hbm=0.0, dram=0.1, nvme=0.3, shared=0.6)
BS = 16


def holding(tiers: Mapping[Any, str]) -> Lookup:
    """A lookup over blocks 0..n: the tiers of the longest leading run present in ``tiers``."""

    def lookup(blocks: Sequence[object]) -> list[Tier]:
        out: list[Tier] = []
        for key in blocks:
            if key not in tiers:
                break
            out.append(cast(Tier, tiers[key]))
        return out

    return lookup


def prompt(blocks: int, extra: int = 5) -> Prompt:
    return Prompt(list(range(blocks)), blocks * BS + extra, BS)


def cand(name: str, tiers: Mapping[Any, str] | None = None, load: float = 0.0, kv: float = 0.0) -> Candidate:
    return Candidate(name, holding(tiers or {}), pending_tokens=load, kv_usage=kv)


def rank(p: Prompt, cands: list[Candidate], policy: Policy | None = None, seed: int = 0):
    return choose(p, cands, policy or Policy(weights=WEIGHTS), random.Random(seed))


def test_the_endpoint_holding_more_of_the_prompt_wins_and_the_rest_is_the_fallback_order():
    choice = rank(prompt(8), [cand("a", {0: "hbm"}), cand("b", dict.fromkeys(range(6), "hbm")), cand("c")])
    assert choice.order == ("b", "a", "c")
    assert choice.reason == "cache"
    assert choice.ranked[0].cached_tokens == {"hbm": 6 * BS}
    assert choice.ranked[0].prefill_tokens == 2 * BS + 5


def test_cost_weighs_each_cached_block_by_its_tier():
    p = prompt(4)
    nvme = cand("nvme", dict.fromkeys(range(4), "nvme"))
    dram = cand("dram", {0: "hbm", 1: "dram", 2: "dram", 3: "dram"})
    choice = rank(p, [nvme, dram])
    assert choice.order == ("dram", "nvme")
    by_name = {r.name: r for r in choice.ranked}
    assert by_name["dram"].cost == pytest.approx(3 * BS * 0.1 + 5)
    assert by_name["nvme"].cost == pytest.approx(4 * BS * 0.3 + 5)


def test_only_the_leading_run_counts_and_never_the_block_of_the_last_token():
    # a gap at block 1: blocks 2.. are useless without it
    gap = rank(prompt(4), [cand("gap", {0: "hbm", 2: "hbm", 3: "hbm"})]).ranked[0]
    assert gap.cached_tokens == {"hbm": BS}
    # a prompt of exactly 4 full blocks: the 4th holds the last token, so at most 3 can hit
    exact = Prompt([0, 1, 2, 3], 4 * BS, BS)
    full = rank(exact, [cand("all", dict.fromkeys(range(4), "hbm"))]).ranked[0]
    assert full.cached_tokens == {"hbm": 3 * BS} and full.prefill_tokens == BS


def test_load_outweighs_a_small_cache_advantage():
    p = prompt(10)
    choice = rank(p, [cand("warm", {0: "hbm"}, load=1000), cand("idle", load=0)])
    assert choice.order == ("idle", "warm")
    assert choice.reason == "load"


def test_bounded_load_keeps_a_hot_shared_prefix_from_piling_onto_one_replica():
    """Everyone's system prompt is cached on ``hot`` only, which already carries most of the
    load: a cost without the guard would still send it there (the prompt's savings exceed the
    load difference); the guard sends it elsewhere."""
    p = prompt(40)
    system_prompt = dict.fromkeys(range(40), "hbm")
    cands = [cand("hot", system_prompt, load=550), cand("b"), cand("c")]
    unguarded = rank(p, cands, Policy(weights=WEIGHTS, load_bound=None))
    assert unguarded.order[0] == "hot"
    guarded = rank(p, cands, Policy(weights=WEIGHTS, load_bound=1.25))
    assert guarded.order[0] in ("b", "c")
    assert guarded.order[-1] == "hot"  # still in the fallback list, last
    assert guarded.reason == "guard"


def test_a_full_kv_cache_ranks_last():
    choice = rank(prompt(6), [cand("full", dict.fromkeys(range(6), "hbm"), kv=0.99), cand("empty")])
    assert choice.order == ("empty", "full")
    assert not choice.ranked[1].eligible
    assert choice.reason == "guard"


def test_exact_ties_are_broken_at_random():
    winners = {rank(prompt(3), [cand("a"), cand("b"), cand("c")], seed=s).order[0] for s in range(40)}
    assert winners == {"a", "b", "c"}
    assert rank(prompt(3), [cand("a"), cand("b")]).reason == "random"


def test_least_load_ignores_caches_and_prefix_only_ignores_load():
    p = prompt(8)
    cands = [cand("cached", dict.fromkeys(range(8), "hbm"), load=5000), cand("idle")]
    least_load = Policy(weights=WEIGHTS, use_cache=False, load_bound=None)
    prefix_only = Policy(weights=WEIGHTS, pending_weight=0.0, balance_weight=0.0, load_bound=None)
    assert rank(p, cands, least_load).order == ("idle", "cached")
    assert rank(p, cands, least_load).ranked[0].cached_tokens == {}
    assert rank(p, cands, prefix_only).order == ("cached", "idle")


def test_no_candidates_and_one_candidate():
    assert rank(prompt(2), []).order == ()
    one = rank(prompt(2), [cand("a")])
    assert one.order == ("a",) and one.reason == "only"


def test_a_prompt_shorter_than_a_block_costs_its_tokens():
    choice = rank(Prompt([], 7, BS), [cand("a", {0: "hbm"})])
    assert choice.ranked[0].cost == 7 and choice.ranked[0].cached_tokens == {}


def test_pending_tokens_count_in_full_and_recent_tokens_at_the_balance_weight():
    a = Candidate("a", holding({}), pending_tokens=100)
    b = Candidate("b", holding({}), recent_tokens=100)
    policy = Policy(weights=WEIGHTS, balance_weight=0.1, load_bound=None)
    by_name = {r.name: r.cost for r in rank(prompt(2), [a, b], policy).ranked}
    assert by_name == {"a": pytest.approx(2 * BS + 5 + 100), "b": pytest.approx(2 * BS + 5 + 10)}
