"""``GET /kv/events``: the worker's HBM block events as an NDJSON stream (``block_events``).

The engine thread reports changes; this handler wakes on them through the event loop and writes
them out, with a ping carrying the worker's load at least every second. Streams end when the
server shuts down, so a follower never holds up a worker's exit.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from strata.common.endpoints import EVENTS_PATH
from strata.worker.block_events import HEARTBEAT_S, BlockEvents, Pacer

EVENTS_KEY = web.AppKey("block_events", BlockEvents)
CLOSING_KEY = web.AppKey("block_streams_closing", asyncio.Event)


async def kv_events(request: web.Request) -> web.StreamResponse:
    events, closing = request.app[EVENTS_KEY], request.app[CLOSING_KEY]
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()

    def wake_up() -> None:  # called from the engine thread
        loop.call_soon_threadsafe(wake.set)

    sub = events.subscribe(wake_up)
    headers = {"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache"}
    response = web.StreamResponse(headers=headers)
    try:
        await response.prepare(request)
        pacer = Pacer(loop.time())
        while not closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), HEARTBEAT_S)
            wake.clear()
            lines = sub.drain()
            if sub.overflowed:
                break
            if pacer.due(loop.time()):
                lines.append(events.ping_line())
            if lines:
                await response.write("".join(line + "\n" for line in lines).encode())
    except ConnectionResetError:  # the follower left
        pass
    finally:
        events.unsubscribe(sub)
    return response


def install(app: web.Application, events: BlockEvents) -> None:
    app[EVENTS_KEY] = events
    app[CLOSING_KEY] = asyncio.Event()

    async def close_streams(app: web.Application) -> None:
        app[CLOSING_KEY].set()

    app.on_shutdown.append(close_streams)
    app.router.add_get(EVENTS_PATH, kv_events)
