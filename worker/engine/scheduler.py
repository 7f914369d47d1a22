"""Which sequences run in the next step, and with how many tokens.

Continuous batching with chunked prefill: running sequences go first (highest priority first),
each taking its remaining prompt chunk or one decode token out of a per-step token budget; the
rest of the budget admits waiting sequences while KV blocks last. When blocks run out the lowest-
priority, most recent sequence is preempted (its blocks freed, to be recomputed from its prefix
on return). A higher-priority arrival may preempt lower-priority running work. Requests waiting
past the timeout are refused, never dropped silently.

Decisions only: blocks held by the lower KV tiers are planned as loads (``batch.loads``) from
lookups the engine made before scheduling, and the engine carries them out in the step. No I/O
happens here, and nothing here needs torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from strata.worker.engine.block_manager import BlockManager
from strata.worker.engine.prefix_cache import PrefixCache, TierLoad
from strata.worker.engine.sequence import SeqStatus, Sequence
from strata.worker.engine.stats import EngineStats


class QueueFull(Exception):
    """The waiting queue is at ``max_queue_len``: the request is refused (429)."""


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_batched_tokens: int
    max_queue_len: int
    queue_timeout_s: float


@dataclass
class ScheduledBatch:
    items: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, new tokens)
    rejected: list[Sequence] = field(default_factory=list)  # finished with reason queue_timeout
    admitted: list[Sequence] = field(default_factory=list)  # waiting before, running now
    loads: list[TierLoad] = field(default_factory=list)  # tier blocks the admitted ones need first


def priority_key(seq: Sequence) -> tuple[int, float, int]:
    """Sort order: higher priority first, then first come first served."""
    return (-seq.priority, seq.arrival_s, seq.seq_id)


def pick_victim(candidates: Iterable[Sequence]) -> Sequence:
    """The sequence to preempt: lowest priority, latest arrival."""
    return max(candidates, key=priority_key)


def blocks_needed(seq: Sequence, new_tokens: int, block_size: int) -> int:
    total = -(-(seq.num_computed_tokens + new_tokens) // block_size)
    return max(0, total - len(seq.block_table))


def timed_out(seq: Sequence, now: float, timeout_s: float) -> bool:
    """Only requests that produced nothing yet can be refused; preempted ones are resumed."""
    return not seq.output_ids and now - seq.arrival_s > timeout_s


class Scheduler:
    def __init__(
        self, limits: SchedulerLimits, blocks: BlockManager, prefix: PrefixCache, stats: EngineStats
    ):
        self.limits = limits
        self.blocks = blocks
        self.prefix = prefix
        self.stats = stats
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        if len(self.waiting) >= self.limits.max_queue_len:
            self.stats.rejected["queue_full"] += 1
            raise QueueFull(f"queue is full ({self.limits.max_queue_len} waiting)")
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def queue(self, limit: int) -> list[Sequence]:
        """The first ``limit`` waiting sequences, in the order they will be admitted."""
        return sorted(self.waiting, key=priority_key)[:limit]

    def next_admissions(self) -> list[Sequence]:
        """Waiting sequences the next ``schedule`` may admit (at most the free batch slots)."""
        return self.queue(max(0, self.limits.max_num_seqs - len(self.running)))

    def schedule(self, now: float) -> ScheduledBatch:
        batch = ScheduledBatch(rejected=self._expire(now))
        self._make_room_for_priority()
        budget = self.limits.max_batched_tokens
        scheduled: set[int] = set()
        for seq in sorted(self.running, key=priority_key):
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if seq.status is not SeqStatus.RUNNING or n <= 0 or not self._grow(seq, n, scheduled):
                continue
            batch.items.append((seq, n))
            scheduled.add(seq.seq_id)
            budget -= n
        for seq in sorted(self.waiting, key=priority_key):
            if budget <= 0 or len(self.running) >= self.limits.max_num_seqs:
                break
            n = self._admit(seq, budget, batch)
            if n == 0:
                break  # strict priority order: later arrivals do not overtake
            batch.items.append((seq, n))
            budget -= n
        return batch

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        self.prefix.detach(seq)
        self.prefix.forget(seq)
        seq.status, seq.finish_reason = SeqStatus.FINISHED, reason

    def _expire(self, now: float) -> list[Sequence]:
        expired = [s for s in self.waiting if timed_out(s, now, self.limits.queue_timeout_s)]
        for seq in expired:
            self.finish(seq, "queue_timeout")
            self.stats.rejected["queue_timeout"] += 1
        return expired

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.prefix.detach(seq)
        seq.reset_for_recompute()
        self.waiting.append(seq)
        self.stats.preemptions += 1

    def _grow(self, seq: Sequence, n: int, scheduled: set[int]) -> bool:
        """Blocks for ``n`` more tokens of a running sequence, preempting others if needed."""
        need = blocks_needed(seq, n, self.blocks.block_size)
        while not self.blocks.can_allocate(need):
            victim = pick_victim(s for s in self.running if s.seq_id not in scheduled)
            self._preempt(victim)
            if victim is seq:
                return False
        seq.block_table += [self.blocks.allocate() for _ in range(need)]
        return True

    def _admit(self, seq: Sequence, budget: int, batch: ScheduledBatch) -> int:
        """Attach cached KV (tier blocks as planned loads), then blocks for the first chunk;
        0 (and nothing held) if no room."""
        load = self.prefix.attach(seq)
        n = min(seq.num_tokens - seq.num_computed_tokens, budget)
        need = blocks_needed(seq, n, self.blocks.block_size)
        if not self.blocks.can_allocate(need):
            self.prefix.detach(seq)
            return 0
        seq.block_table += [self.blocks.allocate() for _ in range(need)]
        if load is not None:
            batch.loads.append(load)
        batch.admitted.append(seq)
        self.waiting.remove(seq)
        self.running.append(seq)
        seq.status = SeqStatus.RUNNING
        return n

    def _make_room_for_priority(self) -> None:
        """Preempt strictly lower-priority running work until the best waiting request fits."""
        if not self.waiting:
            return
        head = min(self.waiting, key=priority_key)
        first_chunk = min(head.num_tokens, self.limits.max_batched_tokens)
        need = -(-first_chunk // self.blocks.block_size)
        while self.running:
            full = len(self.running) >= self.limits.max_num_seqs
            if not full and self.blocks.can_allocate(need):
                return
            victim = pick_victim(self.running)
            if victim.priority >= head.priority:
                return
            self._preempt(victim)
