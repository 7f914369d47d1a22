"""What a watch event of a child asks of its service: nothing, a refresh of its status, or a
full reconcile. A pure decision; ``handlers.child_event`` is its glue."""

from __future__ import annotations

from typing import Literal

ChildAction = Literal["ignore", "refresh", "reconcile"]
WORKLOAD_PLURALS = frozenset({"deployments", "statefulsets"})


def child_action(event: str | None, plural: str, own: bool, known: bool, status_only: bool) -> ChildAction:
    """``event``: the watch event's type, None for a listing; ``own``: the child is spec-wise as
    this process last applied it; ``known``: this process has applied it; ``status_only``: a
    workload whose controller has caught up with its spec (only its status moved)."""
    if event is None:
        if not known:
            return "ignore"  # start-up: the service's own event reconciles it
        if own:
            # A relist after a watch outage (410 Gone): the spec is ours, but the rollout may have
            # moved while the watch was down. A refresh writes the status only if it changed.
            return "refresh" if plural in WORKLOAD_PLURALS else "ignore"
        return "reconcile"  # changed by someone else while the watch was down
    if event == "MODIFIED" and plural in WORKLOAD_PLURALS and status_only:
        return "refresh"  # the controller moved the rollout along; a spec edit bumps the generation
    if event != "DELETED" and own:
        return "ignore"  # the echo of our own apply, or a status move nothing reports (a PDB's count)
    return "reconcile"
