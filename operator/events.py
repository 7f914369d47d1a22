"""Where Kubernetes Events go: a sink the reconciler calls (``handlers.kopf_sink`` in the operator).

The reconciler decides *which* Events to emit; the sink only delivers them, so tests can
collect them in a list."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

EventType = Literal["Normal", "Warning"]


class EventSink(Protocol):
    def __call__(self, obj: Mapping[str, Any], type_: EventType, reason: str, message: str) -> None: ...


@dataclass
class RecordedEvents:
    """An EventSink that remembers: for unit tests and the benchmark."""

    events: list[tuple[str, EventType, str, str]] = field(default_factory=list)

    def __call__(self, obj: Mapping[str, Any], type_: EventType, reason: str, message: str) -> None:
        self.events.append((obj.get("metadata", {}).get("name", ""), type_, reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, _, reason, _ in self.events]


@dataclass
class CountedSink:
    """An EventSink that counts each Event by type and reason (the operator's metrics) and passes
    it on: kopf posts Events with a client of its own, which the operator's client never sees."""

    sink: EventSink
    count: Callable[[str, str], None]

    def __call__(self, obj: Mapping[str, Any], type_: EventType, reason: str, message: str) -> None:
        self.count(type_, reason)
        self.sink(obj, type_, reason, message)
