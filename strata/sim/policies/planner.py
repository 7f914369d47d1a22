"""A Dynamo-style SLA planner (ai-dynamo/dynamo, docs/architecture/sla_planner.md), adapted to
aggregated replicas (each does both prefill and decode).

Every adjustment interval (180 s) it takes the last interval's request count, mean input and
output lengths, mean TTFT and mean inter-token latency; predicts the next interval with the
constant predictor (next = last); corrects its profile with ``actual / expected`` TTFT and ITL;
and sizes

    prefill = requests * isl / interval * min(1, ttft correction) / prefill tokens/s per replica
    decode  = requests * osl / interval / decode tokens/s per replica at the corrected ITL target

where the throughputs come from the profile (what Dynamo's pre-deployment profiling measures: a
lone prefill at that input length; the largest decode batch whose step meets the ITL target at a
context of isl + osl / 2). Dynamo scales prefill and decode pools separately; one aggregated
replica serves both shares, so the replicas are ``ceil(prefill + decode)``.
"""

from __future__ import annotations

import math

from strata.sim.policies.base import Verdict, View
from strata.sim.profile import Profile
from strata.sim.service import PodState, Service


class Planner:
    name = "planner"
    interval_s = 180.0

    def __init__(self, service: Service) -> None:
        self.profile = service.profile
        self.itl_target_s = service.spec.slo.inter_token_latency_p95_ms / 1000.0

    def decide(self, view: View) -> Verdict | None:
        load = view.load(self.interval_s)
        if load.requests == 0:
            return Verdict(view.bounded(0), "no requests in the last interval")
        isl, osl = max(1.0, load.input_tokens), max(1.0, load.output_tokens)
        done = [o for o in view.outcomes(self.interval_s) if o.ttft_s is not None]
        expected_ttft = self.profile.lone_prefill_s(round(isl))
        p_corr = _mean([o.ttft_s for o in done if o.ttft_s is not None]) / expected_ttft if done else 1.0
        per_s = load.requests / self.interval_s
        prefill = per_s * isl * min(1.0, p_corr) / (isl / expected_ttft)
        d_corr = self._decode_correction(view, done, isl + osl / 2)
        decode = per_s * osl / decode_tokens_per_s(self.profile, self.itl_target_s / d_corr, isl + osl / 2)
        want = math.ceil(prefill + decode)
        why = f"{per_s:.2f} req/s, isl {isl:.0f}, osl {osl:.0f}: prefill {prefill:.2f} + decode {decode:.2f}"
        return Verdict(view.bounded(want), why)

    def _decode_correction(self, view: View, done: list, context: float) -> float:  # type: ignore[type-arg]
        tpots = [o.tpot_s for o in done if o.tpot_s is not None]
        ready = max(1, view.count(PodState.READY))
        batch = max(1, round(sum(view.in_flight()) / ready))
        expected = decode_step_s(self.profile, batch, context)
        return _mean(tpots) / expected if tpots else 1.0


def decode_step_s(profile: Profile, batch: int, context: float) -> float:
    return profile.step_s(0.0, batch, round(batch * context))


def decode_tokens_per_s(profile: Profile, itl_s: float, context: float) -> float:
    """Decode tokens per second of one replica at the largest batch whose step fits ``itl_s``
    (at least one sequence)."""
    best = 1
    for batch in range(1, profile.max_num_seqs + 1):
        if decode_step_s(profile, batch, context) > itl_s:
            break
        best = batch
    return best / decode_step_s(profile, best, context)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
