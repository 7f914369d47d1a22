"""Tier weights: what a cached block costs, relative to recomputing it, by the tier holding it.

Loading a token's KV from a tier moves ``kv_bytes_per_token`` bytes at that tier's read
bandwidth; recomputing it costs one token of prefill. So, in prefill-token units,

    weight(tier) = kv_bytes_per_token * prefill_tokens_per_s / read_bytes_per_s(tier)

HBM moves nothing (the block is already where attention reads it): weight 0. A tier slower than
recomputation gets a weight above 1 and is honestly costed as such. The defaults below are
derived from this project's own measurements (see ``MEASURED`` and docs/router.md); every
deployment can derive its own with :func:`derive` and set them in the router's config.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class TierWeights(BaseModel):
    """Cost of one cached token served from each tier, in units of one recomputed token."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hbm: float = Field(0.0, ge=0, description="A block already in the engine's HBM cache.")
    dram: float = Field(ge=0, description="A block in the sidecar's shared-memory DRAM tier.")
    nvme: float = Field(ge=0, description="A block on the local NVMe tier.")
    shared: float = Field(ge=0, description="A block on the shared (ReadWriteMany) tier.")

    def of(self, tier: str) -> float:
        weight: float = getattr(self, tier)
        return weight


@dataclass(frozen=True)
class Measurements:
    """The figures a derivation needs, with where each came from."""

    kv_bytes_per_token: int
    prefill_tokens_per_s: float
    read_gbps: dict[str, float]  # dram, nvme, shared: GB/s (1e9 bytes) read into the engine
    source: str


def derive(m: Measurements) -> TierWeights:
    per_token = m.kv_bytes_per_token * m.prefill_tokens_per_s / 1e9
    return TierWeights(**{tier: round(per_token / gbps, 5) for tier, gbps in m.read_gbps.items()})


# The `small` test model (4 layers x K,V x 2 KV heads x 64 dims x fp32 = 4,096 bytes per token),
# prefilled at 2,578 tok/s (4k prompts, `python -m bench worker`); DRAM get 4.1 GB/s and NVMe read
# 1.19 GB/s through the real sidecar (`python -m bench kvtier`); the shared tier's reads of one
# file per block through FilesystemBlockStore, pages dropped (`python -m bench routing`, weights).
MEASURED = Measurements(
    kv_bytes_per_token=4 * 2 * 2 * 64 * 4,
    prefill_tokens_per_s=2578.0,
    read_gbps={"dram": 4.1, "nvme": 1.19, "shared": 0.095},
    source="README benchmark table (2-core development machine, small test model)",
)
DEFAULT_WEIGHTS = derive(MEASURED)
