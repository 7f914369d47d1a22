"""What the workers report of their model's KV size, against what the service says.

``spec.model.kvBytesPerToken`` sizes the KV-tier sidecar's memory and the routers' (resolve.py);
only the engine knows the real figure, once it has loaded the model. The autoscaler reads it from
every scrape (``strata_worker_kv_bytes_per_token``) and the operator writes it to
``status.model.kvBytesPerToken``, with an Event when the spec leaves it unset or says otherwise.
The operator does not apply it: a new figure changes the pods' resources, so the pods roll, and
that is the service owner's call."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from strata.operator.autoscale.metrics import PodSample


@dataclass(frozen=True)
class Advice:
    """An Event's type, reason and message."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def reported(samples: Iterable[PodSample]) -> int | None:
    """The figure most pods report (the larger on a tie: pods rolling from one model to another
    report both, and the larger sizes memory safely); None when none reports one."""
    counts = Counter(s.kv_bytes_per_token for s in samples if s.kv_bytes_per_token is not None)
    if not counts:
        return None
    return max(counts, key=lambda figure: (counts[figure], figure))


def advice(told: int | None, seen: int) -> Advice | None:
    """What to tell the service owner when the spec's figure is not the workers'."""
    fix = f"set spec.model.kvBytesPerToken: {seen} so the KV-tier sidecar and the routers are sized for it"
    if told is None:
        return Advice(
            "Normal", "KVBytesPerTokenUnset", f"the workers' model takes {seen} bytes of KV a token; {fix}"
        )
    if told != seen:
        return Advice(
            "Warning",
            "KVBytesPerTokenDiffers",
            f"spec.model.kvBytesPerToken is {told}, but the workers' model takes {seen} bytes of KV "
            f"a token; {fix}",
        )
    return None


def model_status(before: Mapping[str, Any] | None, seen: int, now: str) -> dict[str, Any] | None:
    """status.model on the wire when the figure is new or changed, else None (nothing to write)."""
    if before is not None and before.get("kvBytesPerToken") == seen:
        return None
    return {"kvBytesPerToken": seen, "observedAt": now}
