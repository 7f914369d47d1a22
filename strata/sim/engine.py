"""One replica's engine: the worker's scheduling rules (``worker/engine/scheduler.py``) over the
simulated cache, with each step's duration taken from the profile.

Each step, running sequences go first (oldest first), each taking its next prompt chunk or one
decode token out of the ``max_batched_tokens`` budget, growing its blocks and preempting the
latest arrival when HBM runs out; then waiting requests are admitted in arrival order while the
budget, ``max_num_seqs`` and HBM allow (an admission attaches cached blocks first). Requests
waiting longer than ``queue_timeout_s`` and arrivals beyond ``max_queue_len`` are refused, never
dropped. Arrivals join at the next step, as in the worker's engine loop.

Stretches where every running sequence only decodes and nobody can be admitted are advanced in
one go (``_decode_run``): the step durations form an arithmetic series, so it is exact.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from strata.sim.cache import Attached, ReplicaCache
from strata.sim.profile import Profile
from strata.sim.requests import Seq, Tally


@dataclass
class Planned:
    seq: Seq
    tokens: int


@dataclass
class Step:
    items: list[Planned] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_seqs: int = 0
    decode_context: int = 0
    load_s: float = 0.0


class Engine:
    def __init__(
        self,
        cache: ReplicaCache,
        profile: Profile,
        tally: Tally,
        now: float,
        queue_timeout_s: float | None = None,  # the tier's queue TTL; None: the profile's
    ) -> None:
        self.cache = cache
        self.profile = profile
        self.tally = tally
        self.block = cache.block_tokens
        self.waiting: list[Seq] = []
        self.running: list[Seq] = []
        self.clock = now  # when the step in progress ends (or, idle, the last time advanced to)
        self.capacity_tokens = cache.hbm.num_blocks * self.block
        self.queue_timeout_s = profile.queue_timeout_s if queue_timeout_s is None else queue_timeout_s

    # ---- what the router and the autoscalers read ----

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def in_flight(self) -> int:
        return len(self.waiting) + len(self.running)

    def pending_tokens(self) -> int:
        """Prompt tokens queued or still to prefill here: the router's load figure."""
        queued = sum(s.length - s.computed for s in self.waiting)
        return queued + sum(s.length - s.computed for s in self.running if s.length - s.computed > 1)

    # ---- arrivals and time ----

    def submit(self, seq: Seq, now: float) -> None:
        """A request routed here at ``now`` (after ``advance(now)``)."""
        if seq.req.input_tokens + seq.req.output_tokens > self.capacity_tokens:
            self.tally.refuse(seq, "too_long", now)
        elif len(self.waiting) >= self.profile.max_queue_len:
            self.tally.refuse(seq, "queue_full", now)
        else:
            seq.replica_arrival_s = now
            self.waiting.append(seq)
        self.clock = max(self.clock, now)

    def advance(self, until: float) -> None:
        """Run every step that starts before ``until``."""
        while self.clock < until and self.busy:
            self._expire()
            if not self.busy:
                break
            if self._decode_only():
                self._decode_run(until)
            else:
                self._step()
        self.clock = max(self.clock, until) if not self.busy else self.clock

    def drain(self) -> list[Seq]:
        """Everything queued or running, handed back (the pod is going away at once)."""
        seqs = self.running + self.waiting
        for seq in self.running:
            self.cache.release(seq.block_ids)
            seq.reset()
        self.running, self.waiting = [], []
        return seqs

    # ---- one step ----

    def _expire(self) -> None:
        limit = self.clock - self.queue_timeout_s
        i = 0
        while i < len(self.waiting) and self.waiting[i].replica_arrival_s < limit:
            if self.waiting[i].generated:  # preempted after its first token: resumed, never refused
                i += 1
            else:
                self.tally.refuse(self.waiting.pop(i), "queue_timeout", self.clock)

    def _decode_only(self) -> bool:
        if self.waiting and len(self.running) < self.profile.max_num_seqs:
            return False
        return bool(self.running) and all(s.length - s.computed == 1 and s.generated for s in self.running)

    def _step(self) -> None:
        step = Step()
        budget = self.profile.max_batched_tokens
        scheduled: set[int] = set()
        for seq in list(self.running):
            if seq not in self.running:
                continue  # preempted by an earlier sequence's growth in this step
            n = min(seq.length - seq.computed, budget)
            if n > 0 and self._grow(seq, n, scheduled):
                self._plan(step, seq, n)
                scheduled.add(id(seq))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.profile.max_num_seqs:
            n = self._admit(self.waiting[0], budget, step)
            if n == 0:
                break
            budget -= n
        if not step.items:
            self._stuck()
            return
        duration = self.profile.step_s(step.prefill_s, step.decode_seqs, step.decode_context) + step.load_s
        self.clock += duration
        if step.prefill_s > 0:
            self.tally.prefill_busy_s += duration
        self._finish_step(step)

    def _plan(self, step: Step, seq: Seq, n: int) -> None:
        step.items.append(Planned(seq, n))
        if seq.generated and n == 1:
            step.decode_seqs += 1
            step.decode_context += seq.computed + 1
        else:
            step.prefill_s += self.profile.prefill_s(n, seq.computed)

    def _grow(self, seq: Seq, n: int, scheduled: set[int]) -> bool:
        need = -(-(seq.computed + n) // self.block) - len(seq.block_ids)
        while True:
            ids = self.cache.allocate(need) if need > 0 else []
            if ids is not None:
                seq.block_ids += ids
                return True
            victim = max(
                (s for s in self.running if id(s) not in scheduled), key=lambda s: s.replica_arrival_s
            )
            self._preempt(victim)
            if victim is seq:
                return False

    def _preempt(self, seq: Seq) -> None:
        self.running.remove(seq)
        self.cache.release(seq.block_ids)
        seq.reset()
        seq.preemptions += 1
        self.tally.preemptions += 1
        bisect.insort(self.waiting, seq, key=lambda s: s.replica_arrival_s)

    def _admit(self, seq: Seq, budget: int, step: Step) -> int:
        found = self.cache.attach(seq.keys, seq.req.input_tokens, self.profile)
        cached = len(found.block_ids)
        seq.block_ids = list(found.block_ids)
        seq.computed = cached * self.block
        n = min(seq.length - seq.computed, budget)
        ids = self.cache.allocate(-(-(seq.computed + n) // self.block) - len(seq.block_ids))
        if ids is None:
            self.cache.release(seq.block_ids)
            seq.reset()
            return 0
        seq.block_ids += ids
        seq.published = cached
        self.waiting.pop(0)
        self.running.append(seq)
        self._admitted(seq, found)
        step.load_s += found.load_s
        self._plan(step, seq, n)
        return n

    def _admitted(self, seq: Seq, found: Attached) -> None:
        if seq.admitted_s is not None:
            return
        seq.admitted_s = self.clock
        hits = {"hbm": found.hbm_blocks * self.block}
        hits.update({tier: count * self.block for tier, count in found.tier_blocks.items()})
        seq.hit_tokens = hits
        lone = self.profile.lone_prefill_s(seq.req.input_tokens, seq.computed)
        seq.lone_ttft_s = found.load_s + lone + self.profile.request_overhead_s
        self.tally.admitted(seq)

    def _stuck(self) -> None:
        """Nothing could run: the head of the queue needs more free HBM than exists while
        nothing else runs. It can never be served here."""
        self.tally.refuse(self.waiting.pop(0), "too_long", self.clock)

    def _finish_step(self, step: Step) -> None:
        for item in step.items:
            seq = item.seq
            seq.computed += item.tokens
            self._publish(seq)
            if seq.computed == seq.length:
                self._sample(seq)

    def _publish(self, seq: Seq) -> None:
        full = min(min(seq.computed, seq.req.input_tokens) // self.block, len(seq.keys))
        if full > seq.published:
            self.cache.publish(seq.block_ids, seq.keys, seq.published, full)
            seq.published = full

    def _sample(self, seq: Seq) -> None:
        seq.generated += 1
        if seq.first_token_s is None:
            seq.first_token_s = self.clock + self.profile.request_overhead_s  # as the client sees it
            self.tally.first_token(seq)
        if seq.generated >= seq.req.output_tokens:
            self.running.remove(seq)
            self.cache.release(seq.block_ids)
            seq.block_ids = []
            self.tally.finish(seq, self.clock + self.profile.request_overhead_s)

    # ---- a stretch of decode-only steps ----

    def _decode_run(self, until: float) -> None:
        batch = len(self.running)
        to_block = min(len(s.block_ids) * self.block - s.computed for s in self.running)
        if to_block == 0:
            self._step()  # someone needs a block now: the full rules (growth, preemption)
            return
        context = sum(s.computed + 1 for s in self.running)
        p = self.profile
        first = p.overhead_s + max(p.floor_s, p.decode_seq_s * batch) + p.decode_context_token_s * context
        growth = p.decode_context_token_s * batch
        limit = until
        if self.waiting:  # running is full: stop where the queue's head would time out
            limit = min(limit, self.waiting[0].replica_arrival_s + self.queue_timeout_s)
        k = min(to_block, min(s.req.output_tokens - s.generated for s in self.running))
        k = max(1, min(k, _steps_before(first, growth, limit - self.clock)))
        self.clock += k * first + growth * k * (k - 1) / 2
        for seq in list(self.running):
            seq.computed += k - 1
            seq.generated += k - 1
            seq.computed += 1
            if seq.computed == seq.length:
                self._sample(seq)


def _steps_before(first: float, growth: float, span: float) -> int:
    """How many steps of a series (durations first, first + growth, ...) start within ``span``
    (step j starts at j * first + growth * j * (j - 1) / 2)."""
    if span <= 0:
        return 1
    if growth <= 0:
        return math.floor(span / first) + 1 if first > 0 else 1 << 30
    a, b = growth / 2, first - growth / 2
    j = math.floor((-b + math.sqrt(b * b + 4 * a * span)) / (2 * a))
    while j > 0 and j * first + growth * j * (j - 1) / 2 >= span:
        j -= 1
    return j + 1
