"""How many replicas to run: the seam where the autoscaler plugs in.

Whoever decides (``kubectl scale``, an HPA or KEDA through the scale subresource, or the
built-in autoscaler writing ``spec.replicas``), the operator runs ``spec.replicas`` clamped to
``[minReplicas, maxReplicas]``."""

from __future__ import annotations


def desired_replicas(spec_replicas: int, min_replicas: int, max_replicas: int) -> int:
    if min_replicas > max_replicas:
        raise ValueError(f"minReplicas ({min_replicas}) exceeds maxReplicas ({max_replicas})")
    return max(min_replicas, min(spec_replicas, max_replicas))
