"""What the scaling act keeps while it watches (pure): the highest replica count seen, and the
last scrape of every worker pod that ever served, so that the hit ratio per tier covers the whole
run although scaled-in pods take their counters with them (at most one poll of theirs is lost)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from strata.operator.autoscale.metrics import PodSample


@dataclass
class Tally:
    peak_replicas: int = 0
    samples: dict[str, PodSample] = field(default_factory=dict)  # pod name -> its latest scrape

    def replicas(self, desired: int | None) -> None:
        if desired is not None:
            self.peak_replicas = max(self.peak_replicas, desired)

    def scraped(self, pod: str, sample: PodSample) -> None:
        self.samples[pod] = sample

    def hit_ratio(self) -> dict[str, float]:
        """Prompt tokens served from each tier's cache / prompt tokens, over every pod seen."""
        return hit_ratio(self.samples.values())

    def served(self) -> dict[str, float]:
        """Requests each pod has answered (its TTFT count): who took the load."""
        return {pod: sample.ttft_count for pod, sample in sorted(self.samples.items())}


def hit_ratio(samples: Iterable[PodSample]) -> dict[str, float]:
    prompt, hits = 0.0, dict[str, float]()
    for sample in samples:
        prompt += sample.prompt_tokens
        for tier, tokens in sample.prefix_hit_tokens.items():
            hits[tier] = hits.get(tier, 0.0) + tokens
    return {tier: tokens / prompt for tier, tokens in hits.items()} if prompt else {}
