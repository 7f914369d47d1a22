"""One simulated InferenceService: its tier, its pods, the requests waiting at its router, and
everything counted for the report."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from strata.operator.api import ServiceTier, ServiceTierSpec
from strata.sim.cache import ReplicaCache, key_of
from strata.sim.engine import Engine
from strata.sim.gate import Gate, Limits
from strata.sim.profile import Profile
from strata.sim.requests import Outcomes, Seq, Tally
from strata.sim.tiers import LowerTiers, SharedTier, TierSizes
from strata.sim.trace import Request, Trace


class PodState(enum.Enum):
    PENDING = "pending"  # wants GPUs
    STARTING = "starting"  # holds GPUs, loading the model
    READY = "ready"  # serving
    DRAINING = "draining"  # scaled in: finishes what it has, takes nothing new


HOLDING = (PodState.STARTING, PodState.READY, PodState.DRAINING)


@dataclass(frozen=True)
class ServiceConfig:
    """What an InferenceService of the scenario asks for."""

    name: str
    tier: str
    trace: Trace
    min_replicas: int = 1
    max_replicas: int = 16
    replicas: int = 1  # at the start
    gpus_per_replica: int = 1
    shared_cache: bool = True  # spec.cache.shared, where the tier allows it


@dataclass(eq=False)
class Pod:
    name: str
    created_s: float
    ordinal: int  # the StatefulSet ordinal: a newer pod has a higher one
    state: PodState = PodState.PENDING
    started_s: float = 0.0
    ready_s: float = 0.0
    engine: Engine | None = None


@dataclass
class Scaling:
    time_s: float
    before: int
    after: int
    reason: str


@dataclass
class Sample:
    time_s: float
    desired: int
    ready: int
    holding: int


@dataclass(eq=False)
class Service:
    config: ServiceConfig
    tier: ServiceTier
    profile: Profile
    desired: int = 0
    pods: list[Pod] = field(default_factory=list)
    gate: Gate = field(init=False)  # the router's hold and queue
    wakes_on_arrival: bool = True  # the policy's activator wakes it at the first request held
    outcomes: Outcomes = field(default_factory=Outcomes)
    scalings: list[Scaling] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    arrivals: list[tuple[float, int, int]] = field(default_factory=list)  # (time, input, output)
    replica_seconds: float = 0.0
    pod_preemptions: int = 0
    retried: int = 0
    _serial: int = 0

    def __post_init__(self) -> None:
        spec = self.spec
        self.block_tokens = self.config.trace.block_tokens
        self.block_bytes = self.block_tokens * self.profile.kv_bytes_per_token
        self.hbm_blocks = self.profile.hbm_bytes(spec.cache.hbm.kv_fraction) // self.block_bytes
        self.sizes = TierSizes.of(spec, self.block_bytes)
        shared = self.sizes.shared if self.config.shared_cache else 0
        self.shared = SharedTier(shared, "lru")  # the sidecar's shared tier is LRU-ordered
        auto = spec.autoscaling
        self.min_replicas = max(self.config.min_replicas, auto.min_replicas)
        self.max_replicas = min(self.config.max_replicas, auto.max_replicas)
        self.desired = min(max(self.config.replicas, self.min_replicas), self.max_replicas)
        self.gate = Gate(Limits.of(spec, self.profile.max_num_seqs))

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def spec(self) -> ServiceTierSpec:
        return self.tier.spec

    @property
    def priority(self) -> int:
        return self.spec.priority

    @property
    def ttft_target_s(self) -> float:
        return self.spec.slo.ttft_p95_ms / 1000.0

    def in_state(self, *states: PodState) -> list[Pod]:
        return [p for p in self.pods if p.state in states]

    def new_pod(self, now: float) -> Pod:
        self._serial += 1
        pod = Pod(f"{self.name}-{self._serial}", now, self._serial)
        self.pods.append(pod)
        return pod

    def new_engine(self, now: float) -> Engine:
        tiers = LowerTiers(self.spec, self.sizes, self.shared)
        cache = ReplicaCache(self.hbm_blocks, self.block_tokens, self.block_bytes, tiers)
        # the operator sets the worker's queue timeout to the tier's queue TTL, as the router's
        return Engine(cache, self.profile, Tally(self.outcomes), now, self.gate.limits.queue_s)

    def seq(self, request: Request, now: float) -> Seq:
        self.arrivals.append((now, request.input_tokens, request.output_tokens))
        return Seq(request, tuple(key_of(b) for b in request.blocks), now)
