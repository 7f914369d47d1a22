"""The lower tiers move blocks as the sidecar does: write-back demotion with NVMe admission,
write-through at once, promotion on a hit, and the service's shared tier."""

from __future__ import annotations

from strata.sim.cache import key_of
from strata.sim.tiers import LowerTiers, SharedTier, TierSizes
from tests.sim.helpers import TIERS

K = [key_of(i) for i in range(10)]


def tiers(tier: str, dram: int, nvme: int, shared: int = 0) -> LowerTiers:
    return LowerTiers(TIERS[tier].spec, TierSizes(dram, nvme, shared), SharedTier(shared, "lru"))


def test_sizes_come_from_the_tier_defaults_in_blocks():
    sizes = TierSizes.of(TIERS["premium"].spec, 64 * 2**20)  # 64 MiB blocks
    assert (sizes.dram, sizes.nvme, sizes.shared) == (512, 3200, 8000)  # 32Gi, 200Gi, 500Gi
    assert TierSizes.of(TIERS["standard"].spec, 64 * 2**20).shared == 0  # shared is off for standard


def test_write_back_demotes_dram_victims_to_nvme_only_once_admitted():
    t = tiers("standard", dram=2, nvme=10)  # standard: write-back, admitAfterHits 2
    t.save([(K[0], None), (K[1], None)])
    t.save([(K[2], None)])  # evicts K0 (least recent) from DRAM: seen once, not admitted: gone
    assert t.lookup([K[0]]) == []
    for _ in range(3):
        t.save([(K[3], None)])  # seen three times (> 2)
    t.save([(K[4], None), (K[5], None)])  # K3 leaves DRAM: admitted, so it goes to NVMe
    assert t.lookup([K[3]]) == ["nvme"]


def test_write_through_stores_down_at_once_and_a_hit_is_promoted():
    t = tiers("premium", dram=1, nvme=10, shared=10)  # premium: write-through, admitAfterHits 1
    t.save([(K[0], None)])
    assert t.lookup([K[0]]) == ["dram"]
    t.save([(K[1], None)])  # K0 leaves DRAM; its shared copy was written at once
    assert t.lookup([K[0]]) == ["shared"]
    t.read([K[0]], [None])  # a hit: promoted into DRAM, and now seen twice (admitted to NVMe)
    assert t.lookup([K[0]]) == ["dram"]
    for _ in range(2):  # K2 enters DRAM (adaptive may follow the doorkeeper: a second sighting)
        t.save([(K[2], None)])
    assert t.lookup([K[0]]) == ["nvme"]


def test_lookup_stops_at_the_first_missing_block():
    t = tiers("standard", dram=10, nvme=0)
    t.save([(K[0], None), (K[2], K[1])])
    assert t.lookup([K[0], K[1], K[2]]) == ["dram"]


def test_the_shared_tier_is_one_for_all_replicas_of_a_service():
    shared = SharedTier(10, "lru")
    spec = TIERS["batch"].spec  # batch: write-back, shared on
    a = LowerTiers(spec, TierSizes(1, 0, 10), shared)
    b = LowerTiers(spec, TierSizes(1, 0, 10), shared)
    a.save([(K[0], None), (K[1], None)])  # K0 demoted from a's DRAM to the shared tier
    assert b.lookup([K[0]]) == ["shared"]
