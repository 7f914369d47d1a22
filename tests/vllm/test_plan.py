"""The connector's scheduler side: loads planned from the tiers' hit, every completed block saved once."""

from __future__ import annotations

from collections.abc import Sequence

from strata.worker.kv_connector import Tier, chain_hashes
from strata.worker.vllm.plan import Scheduled, SchedulerBlocks

BS = 4
ROOT = b"r" * 16


def tiers_holding(count: int) -> SchedulerBlocks:
    def lookup(keys: Sequence[bytes]) -> list[Tier]:
        return ["dram"] * min(count, len(keys))

    return SchedulerBlocks(BS, lookup)


def test_the_hit_leaves_the_last_token_to_compute() -> None:
    blocks = tiers_holding(100)
    assert blocks.matched("r", ROOT, list(range(16)), 0) == 12  # 16 tokens: 3 whole blocks usable
    assert blocks.matched("q", ROOT, list(range(17)), 0) == 16


def test_the_tiers_are_asked_only_past_the_engines_own_hit() -> None:
    asked: list[int] = []

    def lookup(keys: Sequence[bytes]) -> list[Tier]:
        asked.append(len(keys))
        return ["nvme"] * len(keys)

    blocks = SchedulerBlocks(BS, lookup)
    assert blocks.matched("r", ROOT, list(range(21)), 8) == 12
    assert asked == [3]


def test_a_load_targets_the_blocks_after_the_engines_hit() -> None:
    blocks = tiers_holding(2)
    tokens = list(range(21))
    assert blocks.matched("r", ROOT, tokens, 4) == 8
    blocks.allocated("r", [10, 11, 12, 13, 14, 15], 8)
    plan = blocks.step([], lambda rid: tokens)
    (load,) = plan.loads
    assert load.block_ids == (11, 12)
    assert list(load.keys) == chain_hashes(ROOT, tokens, BS)[1:3]
    assert blocks.step([], lambda rid: tokens).loads == []  # planned once


def test_each_completed_block_is_saved_once_with_its_parent() -> None:
    blocks = tiers_holding(0)
    tokens = list(range(10))
    blocks.matched("r", ROOT, tokens, 0)
    blocks.allocated("r", [5, 6, 7], 0)
    first = blocks.step([Scheduled("r", [5, 6, 7], True, 0, 10)], lambda rid: tokens)
    keys = chain_hashes(ROOT, tokens, BS)
    (save,) = first.saves
    assert save.block_ids == (5, 6)
    assert [(r.hash, r.parent, r.position) for r in save.refs] == [(keys[0], ROOT, 0), (keys[1], keys[0], 1)]
    tokens += [10, 11]  # two decode steps fill the third block
    assert blocks.step([Scheduled("r", None, False, 10, 1)], lambda rid: tokens).saves == []
    (third,) = blocks.step([Scheduled("r", None, False, 11, 1)], lambda rid: tokens).saves
    assert third.block_ids == (7,) and third.refs[0].parent == chain_hashes(ROOT, tokens, BS)[1]


def test_blocks_that_were_cached_when_scheduled_are_not_saved_again() -> None:
    blocks = tiers_holding(2)
    tokens = list(range(13))
    assert blocks.matched("r", ROOT, tokens, 0) == 8
    blocks.allocated("r", [1, 2, 3, 4], 8)
    plan = blocks.step([Scheduled("r", [1, 2, 3, 4], True, 8, 5)], lambda rid: tokens)
    assert [s.block_ids for s in plan.saves] == [(3,)]


def test_a_finished_request_is_forgotten() -> None:
    blocks = tiers_holding(0)
    blocks.matched("r", ROOT, list(range(9)), 0)
    blocks.finished("r")
    assert blocks.step([Scheduled("r", [1, 2], True, 0, 9)], lambda rid: list(range(9))).saves == []
