"""Which pending pods get GPUs, and which running pods are preempted for them: the scheduler's
priority preemption, as the tiers' PriorityClasses make Kubernetes do it, over one pool of GPUs.

Pending pods are placed highest priority first, then oldest first. A pod that does not fit may
preempt running pods of strictly lower priority (lowest priority first, then the most recently
started), but only if evicting them makes it fit; otherwise it stays pending and nothing is
evicted. Pure: it reads plain data and returns the decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Want:
    """A pending pod."""

    name: str
    priority: int
    gpus: int
    created_s: float


@dataclass(frozen=True)
class Holds:
    """A pod holding GPUs (starting, ready or draining)."""

    name: str
    priority: int
    gpus: int
    started_s: float
    ordinal: int = 0  # among pods started at the same time, the higher goes first (a newer pod)


@dataclass(frozen=True)
class Placement:
    start: tuple[str, ...]
    evict: tuple[str, ...]


def place(pending: Sequence[Want], running: Sequence[Holds], budget: int) -> Placement:
    free = budget - sum(h.gpus for h in running)
    victims = sorted(running, key=lambda h: (h.priority, -h.started_s, -h.ordinal))
    start: list[str] = []
    evict: list[str] = []
    for pod in sorted(pending, key=lambda p: (-p.priority, p.created_s)):
        if pod.gpus <= free:
            start.append(pod.name)
            free -= pod.gpus
            continue
        chosen = _victims_for(pod, victims, free, set(evict))
        if chosen is not None:
            evict += [v.name for v in chosen]
            free += sum(v.gpus for v in chosen) - pod.gpus
            start.append(pod.name)
    return Placement(tuple(start), tuple(evict))


def _victims_for(pod: Want, victims: Sequence[Holds], free: int, taken: set[str]) -> list[Holds] | None:
    chosen: list[Holds] = []
    for victim in victims:
        if free >= pod.gpus:
            break
        if victim.priority >= pod.priority:
            break
        if victim.name in taken:
            continue
        chosen.append(victim)
        free += victim.gpus
    return chosen if free >= pod.gpus else None
