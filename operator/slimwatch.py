"""Slim the watched children's and pods' events before kopf queues them (strata.operator.slim).

kopf has no public hook between its API stream and its per-object queues, so this wraps the
one function its watchers call for the stream, ``kopf._cogs.clients.watching.infinite_watch``
(looked up on that module at each watcher's start). The kopf version is bounded in
pyproject.toml and tests/operator/test_slimwatch.py checks that the hook is where the watchers
look, so a kopf release that moves it fails a test instead of silently keeping whole bodies."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

from kopf._cogs.clients import watching

from strata.operator.slim import slim_event

Selector = Callable[[Any], bool]  # kopf.Resource -> slim its events?
_KOPF_INFINITE_WATCH = watching.infinite_watch


def install(selected: Selector) -> None:
    """Slim the events of every resource ``selected`` picks, from the next watcher started on."""
    watching.infinite_watch = _slimming(selected)


def installed() -> bool:
    return watching.infinite_watch is not _KOPF_INFINITE_WATCH


def _slimming(selected: Selector) -> Callable[..., AsyncGenerator[Any, None]]:
    async def infinite_watch(*, resource: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        kopf_stream = cast(AsyncGenerator[Any, None], _KOPF_INFINITE_WATCH(resource=resource, **kwargs))
        async with contextlib.aclosing(kopf_stream) as stream:
            if not selected(resource):
                async for event in stream:
                    yield event
                return
            async for event in stream:
                yield slim_event(resource.plural, event)

    return infinite_watch
