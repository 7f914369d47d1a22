"""The engine's KV-tier hooks, against a dict-backed connector: evictions are saved, misses in
HBM are loaded from the tier, and decoding after a load equals recomputation."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from strata.worker.engine.sequence import SamplingParams
from strata.worker.kv_connector import BlockRef, Tier
from tests.worker.conftest import EngineFactory, prompt_of, reference_decode

GREEDY = SamplingParams(max_tokens=5, ignore_eos=True, keep_logits=True)


class DictConnector:
    """A lower tier in a dict; reports everything it holds as ``tier``."""

    def __init__(self, tier: Tier = "dram") -> None:
        self.tier = tier
        self.blocks: dict[bytes, torch.Tensor] = {}
        self.refs: dict[bytes, BlockRef] = {}
        self.prefetched: list[bytes] = []
        self.looked_up: list[list[bytes]] = []
        self.expected: dict[str, list[bytes]] = {}  # the queued requests announced
        self.ever_expected: list[str] = []
        self.loads = 0

    def lookup(self, hashes: Sequence[bytes]) -> list[Tier]:
        self.looked_up.append(list(hashes))
        found: list[Tier] = []
        for h in hashes:
            if h not in self.blocks:
                break
            found.append(self.tier)
        return found

    def load(self, hashes: Sequence[bytes], out: Sequence[torch.Tensor]) -> int:
        self.loads += 1
        for h, dst in zip(hashes, out, strict=True):
            dst.copy_(self.blocks[h])
        return len(hashes)

    def save(self, blocks: Sequence[BlockRef], data: Sequence[torch.Tensor]) -> None:
        for ref, tensor in zip(blocks, data, strict=True):
            self.blocks[ref.hash] = tensor.clone()
            self.refs[ref.hash] = ref

    def prefetch(self, hashes: Sequence[bytes]) -> None:
        self.prefetched += hashes

    def expect(self, request: str, hashes: Sequence[bytes]) -> None:
        self.expected[request] = list(hashes)
        self.ever_expected.append(request)

    def unexpect(self, requests: Sequence[str]) -> None:
        for request in requests:
            del self.expected[request]

    def close(self) -> None:
        pass


class BrokenConnector(DictConnector):
    def lookup(self, hashes: Sequence[bytes]) -> list[Tier]:
        raise ConnectionError("sidecar down")

    def save(self, blocks: Sequence[BlockRef], data: Sequence[torch.Tensor]) -> None:
        raise ConnectionError("sidecar down")


def test_evicted_blocks_are_saved_in_the_contract_layout(make_engine: EngineFactory) -> None:
    tier = DictConnector()
    engine = make_engine(connector=tier)
    prompt = prompt_of(26, seed=1)
    engine.generate(prompt, GREEDY)
    assert engine.evict_cached_blocks() > 0
    hashes = engine.block_hashes(prompt)
    assert set(hashes) <= set(tier.blocks)  # all six full prompt blocks went down
    first = tier.refs[hashes[0]]
    assert (first.parent, first.position) == (engine.root_hash, 0)
    assert tier.refs[hashes[3]] == BlockRef(hashes[3], hashes[2], 3)
    assert tier.blocks[hashes[0]].shape == engine.block_shape == (2, 2, 4, 2, 16)


def test_decode_after_loading_from_the_tier_equals_recomputation(make_engine: EngineFactory) -> None:
    tier = DictConnector()
    prompt = prompt_of(30, seed=2)
    engine = make_engine(connector=tier)
    engine.generate(prompt, GREEDY)
    engine.evict_cached_blocks()
    # A fresh engine (an empty HBM) sharing the tier: everything but the tail comes from "dram".
    fresh = make_engine(connector=tier)
    seq = fresh.generate(prompt, GREEDY)
    assert seq.hit_tokens == {"hbm": 0, "dram": 28}
    assert fresh.stats.hit_tokens["dram"] == 28
    tokens, logits = reference_decode(fresh, prompt, 5)
    assert seq.output_ids == tokens
    for got, want in zip(seq.logits, logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # Loaded blocks are registered in HBM: the next identical request hits there.
    assert fresh.generate(prompt, GREEDY).hit_tokens["hbm"] == 28


def test_lookup_starts_past_the_hbm_hit(make_engine: EngineFactory) -> None:
    tier = DictConnector("nvme")
    engine = make_engine(connector=tier)
    shared = prompt_of(16, seed=3)
    engine.generate(shared + prompt_of(16, seed=4), GREEDY)
    engine.evict_cached_blocks()
    engine.generate(shared, GREEDY)  # reloads the first three blocks into HBM
    tail = prompt_of(16, seed=4)
    tier.looked_up.clear()
    seq = engine.generate(shared + tail, GREEDY)
    hashes = engine.block_hashes(shared + tail)
    assert tier.looked_up == [hashes[4:7]]  # past the 4-block HBM hit, up to the last full block
    assert seq.hit_tokens == {"hbm": 16, "nvme": 12}


def test_queued_requests_are_announced_until_scheduled(make_engine: EngineFactory) -> None:
    tier = DictConnector()
    engine = make_engine(connector=tier)
    first = engine.add_request(prompt_of(20, seed=12), GREEDY)
    second = engine.add_request(prompt_of(24, seed=13), GREEDY)
    assert (
        tier.expected
        == {
            str(first.seq_id): engine.block_hashes(first.token_ids)[:4],  # the usable full blocks
            str(second.seq_id): engine.block_hashes(second.token_ids)[:5],
        }
    )
    engine.step()  # both admitted: no longer waiting
    assert tier.expected == {} and tier.ever_expected == [str(first.seq_id), str(second.seq_id)]
    while engine.has_unfinished():
        engine.step()


def test_eviction_under_memory_pressure_saves_before_reuse(make_engine: EngineFactory) -> None:
    tier = DictConnector()
    engine = make_engine(connector=tier, num_gpu_blocks=12)
    first = prompt_of(24, seed=5)
    engine.generate(first, GREEDY)
    engine.generate(prompt_of(32, seed=6), GREEDY)  # 9 blocks: 5 free, 4 evicted
    # The first request's chain lost its tail: block 6 (output tokens) and prompt blocks 5, 4, 3.
    assert len(set(engine.block_hashes(first)) & set(tier.blocks)) == 3
    seq = engine.generate(first, GREEDY)
    # Chain tails were evicted first, so the head still hits in HBM and the rest in the tier.
    assert seq.hit_tokens == {"hbm": 12, "dram": 8}
    assert seq.output_ids == reference_decode(engine, first, 5)[0]


def test_write_through_saves_blocks_as_they_are_computed(tiny_dir) -> None:
    from strata.worker.config import KVTierConfig
    from strata.worker.engine.llm_engine import LLMEngine
    from tests.worker.conftest import make_config

    config = make_config(tiny_dir).model_copy(update={"kvtier": KVTierConfig(write_mode="write-through")})
    tier = DictConnector()
    engine = LLMEngine.from_config(config, tier)
    prompt = prompt_of(20, seed=7)
    engine.generate(prompt, GREEDY)
    assert set(engine.block_hashes(prompt)) <= set(tier.blocks)


def test_a_failing_connector_degrades_to_recomputation(make_engine: EngineFactory) -> None:
    engine = make_engine(connector=BrokenConnector(), num_gpu_blocks=12)
    prompts = [prompt_of(24, seed=8), prompt_of(24, seed=9)]
    seqs = [engine.generate(p, GREEDY) for p in prompts + prompts[:1]]
    assert seqs[2].output_ids == reference_decode(engine, prompts[0], 5)[0]


def test_server_start_up_connects_the_sidecar_when_enabled(tiny_dir, monkeypatch) -> None:
    from strata.worker.config import KVTierConfig
    from strata.worker.kvtier import client
    from strata.worker.server.main import build_engine
    from tests.worker.conftest import make_config

    calls = []

    def fake_connect(config, block_shape, dtype, device):
        calls.append((block_shape, dtype, device.type))
        return DictConnector()

    monkeypatch.setattr(client, "connect", fake_connect)
    base = make_config(tiny_dir)
    assert build_engine(base).tiers.connector is None and not calls
    enabled = base.model_copy(update={"kvtier": KVTierConfig(enabled=True, metrics_port=9001)})
    engine = build_engine(enabled)
    assert calls == [((2, 2, 4, 2, 16), torch.float32, "cpu")]  # the engine's device: its client's threads
    assert isinstance(engine.tiers.connector, DictConnector)


class TornConnector(DictConnector):
    """Finds every block but delivers only the first two intact (a corrupt third block)."""

    def load(self, hashes: Sequence[bytes], out: Sequence[torch.Tensor]) -> int:
        super().load(hashes, out)
        for dst in out[2:]:
            dst.fill_(float("nan"))  # garbage the engine must not use
        return min(2, len(hashes))


def test_a_partial_load_uses_only_the_intact_blocks(make_engine: EngineFactory) -> None:
    tier = TornConnector()
    prompt = prompt_of(30, seed=11)
    engine = make_engine(connector=tier)
    engine.generate(prompt, GREEDY)
    engine.evict_cached_blocks()
    seq = engine.generate(prompt, GREEDY)
    assert seq.hit_tokens == {"hbm": 0, "dram": 8}
    assert seq.output_ids == reference_decode(engine, prompt, 5)[0]
    assert all(torch.isfinite(t).all() for t in seq.logits)


class SlowConnector(DictConnector):
    """A tier whose loads take 50 ms: the time the engine waits is counted, inside its busy time."""

    def load(self, hashes: Sequence[bytes], out: Sequence[torch.Tensor]) -> int:
        time.sleep(0.05)
        return super().load(hashes, out)


def test_busy_time_tier_waits_and_hbm_evictions_are_counted(make_engine: EngineFactory) -> None:
    tier = SlowConnector()
    prompt = prompt_of(30, seed=7)
    engine = make_engine(connector=tier, num_gpu_blocks=12)
    engine.generate(prompt, GREEDY)
    engine.generate(prompt_of(40, seed=8), GREEDY)  # needs more blocks than are free: evicts
    assert engine.stats.hbm_evictions > 0
    engine.evict_cached_blocks()
    fresh = make_engine(connector=tier)
    fresh.generate(prompt, GREEDY)
    waits = fresh.stats.tier_wait_seconds
    assert waits["load"] >= 0.05 and waits["lookup"] > 0
    assert fresh.stats.busy_seconds >= sum(waits.values())
