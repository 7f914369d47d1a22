"""What the sidecar's block service keeps, shared by its parts (``service``): the tiers, the
lock that serialises index changes, the background workers, and the few helpers every part
uses. Set up by ``assembly`` at the first hello; the parts read and change it under ``lock``."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from strata.common.kvbudget import STAGING_SLOTS, Fit
from strata.worker.block_events import BlockEvents
from strata.worker.config import KVTierConfig
from strata.worker.kvtier.demoter import Demoter
from strata.worker.kvtier.index import TierIndex
from strata.worker.kvtier.janitor import Janitor
from strata.worker.kvtier.metrics import TierMetrics
from strata.worker.kvtier.movement import Mover
from strata.worker.kvtier.recovery import Found, Recovery
from strata.worker.kvtier.sealer import Sealer
from strata.worker.kvtier.sightings import Keeper
from strata.worker.kvtier.tiers import DramTier, NvmeTier, SharedTier


@dataclass
class ServiceState:
    config: KVTierConfig
    metrics: TierMetrics
    background_demotion: bool = True  # off: demotion only when room is needed
    staging_asked: int | None = None  # None: as many as KVTIER_STAGING_BYTES holds
    events: BlockEvents = field(default_factory=BlockEvents)  # what each tier holds, for routers
    staging_slots: int = STAGING_SLOTS
    tenant: str = ""  # the cache namespace: its directory on the shared volume (``walls``)
    block_bytes: int = 0
    slot_bytes: int = 0
    dram: DramTier | None = None
    nvme: NvmeTier | None = None
    shared: SharedTier | None = None
    memory: Fit | None = None  # what each tier may index within the sidecar's memory
    expect_refused: int = 0  # announced requests past MAX_EXPECTED_BLOCKS
    lock: threading.RLock = field(default_factory=threading.RLock)
    mover: Mover | None = None
    demoter: Demoter | None = None  # write-back with a lower tier: keeps DRAM slots free
    sealer: Sealer | None = None  # checksums of saved DRAM blocks, off the engine's path
    recovery: Recovery | None = None  # DRAM blocks a restart found, being verified
    keeper: Keeper | None = None  # saves what the admission policies learnt
    janitor: Janitor | None = None  # keeps the shared volume within its size, if ours
    admission_state: dict[str, str] = field(default_factory=dict)  # per tier: restored, or why not
    found: Found = field(default_factory=Found)  # what the DRAM slot table held at start
    pinned: set[bytes] = field(default_factory=set)  # shared with the mover; may precede a block
    # Blocks a prefetch promoted to DRAM, by the tier they came from: a lookup reports that
    # tier, so per-tier hit metrics credit NVMe/shared even when the prefetch won the race.
    prefetched_from: OrderedDict[bytes, str] = field(default_factory=OrderedDict)
    background: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="kvtier-prefetch")
    )
    # Staging puts' commits, in order (one thread: the index log's records stay in put order).
    committer: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="kvtier-commit")
    )
    writing: int = 0  # staging puts queued and not committed yet (their slots still held)
    reading: int = 0  # promotions reading with the lock released (``loads.Loads.promote``)
    closed: bool = False
    room: threading.Condition = field(init=False)  # notified when a put's staging slots are back
    promoted: threading.Condition = field(init=False)  # notified as each promotion commits

    def __post_init__(self) -> None:
        self.room = threading.Condition(self.lock)
        self.promoted = threading.Condition(self.lock)

    def require(self) -> Mover:
        if self.mover is None:
            raise RuntimeError("sidecar not configured: send hello with block_bytes first")
        return self.mover

    def claim(self, keys: Sequence[bytes]) -> None:
        """Blocks a restart found and has not verified yet: verified and admitted now, when a
        request names them (``recovery``)."""
        if self.recovery is not None and self.recovery.pending:
            self.recovery.claim(list(keys))

    def poke_demoter(self) -> None:
        if self.demoter is not None:
            self.demoter.poke()

    def indexes(self) -> list[TierIndex]:
        return [tier.index for tier in (self.dram, self.nvme) if tier is not None]

    @property
    def answer_blocks(self) -> int:
        """The most blocks one read from the lower tiers brings up at a time: half the staging
        slots for a load's answer (the other half for the answer read ahead), and as many for a
        prefetch's run."""
        return max(1, self.staging_slots // 2)
