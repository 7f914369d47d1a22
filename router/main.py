"""Start-up: the parts wired together, discovery and the block-event followers run as tasks of
the server's event loop, and everything stops with the server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time

import aiohttp
from aiohttp import web

from strata.common.routermemory import followed_limit
from strata.router import discovery, follow
from strata.router.announce import Announcer
from strata.router.app import Parts, build_app
from strata.router.config import RouterConfig
from strata.router.fleet import Endpoint, Fleet
from strata.router.gate import Gate
from strata.router.intake import Intake
from strata.router.kube import Credentials, PodReader
from strata.router.metrics import RouterMetrics
from strata.router.proxy import Forwarder, Timeouts
from strata.worker.cgroup import memory_limit

log = logging.getLogger(__name__)
TICK_S = 0.5  # endpoints marked down come back on their own: look at waiters this often


class Runtime:
    """The long-lived state: the fleet and its followers, the gate, the sessions."""

    def __init__(self, config: RouterConfig, creds: Credentials | None) -> None:
        self.config, self.creds = config, creds
        routing = config.routing
        followed = routing.max_followed_blocks
        if followed is None:
            followed = followed_limit(memory_limit())
        self.fleet = Fleet(config.queue.max_inflight_per_endpoint, routing.record_blocks, followed)
        self.gate = Gate(config, self.fleet, random.Random())
        self.metrics = RouterMetrics(self.fleet, self.gate)
        self.followers: dict[str, list[asyncio.Task[None]]] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.session: aiohttp.ClientSession | None = None
        self.reader: PodReader | None = None

    def parts(self, session: aiohttp.ClientSession) -> Parts:
        t = self.config.timeouts
        forwarder = Forwarder(
            session, self.fleet, self.gate, self.metrics, Timeouts(t.connect_s, t.response_s)
        )
        return Parts(Intake(self.config), self.gate, forwarder, self.metrics)

    def apply(self, states: dict[str, discovery.PodState]) -> None:
        """Bring the fleet in line with what discovery sees now."""
        for name in set(self.fleet.endpoints) - set(states):
            self._drop(name)
        for name, state in states.items():
            endpoint = self.fleet.endpoints.get(name)
            if endpoint is None or endpoint.address != state.address:
                self._drop(name)
                endpoint = self._add(name, state)
            endpoint.ready, endpoint.terminating = state.ready, state.terminating
        self.gate.dispatch()

    def _add(self, name: str, state: discovery.PodState) -> Endpoint:
        endpoint = self.fleet.add(name, state.address)
        assert self.session is not None
        how = follow.Following(
            self.config.timeouts.events_silence_s, self.config.workers.step_tokens, self._hung
        )
        self.followers[name] = [
            asyncio.ensure_future(follow.follow(self.session, endpoint, source, how))
            for source in state.address.events
        ]
        log.info("endpoint %s at %s", name, state.address.url)
        return endpoint

    def _drop(self, name: str) -> None:
        for task in self.followers.pop(name, []):
            task.cancel()
        if self.fleet.remove(name) is not None:
            log.info("endpoint %s gone", name)

    def _hung(self, endpoint: Endpoint, why: str) -> None:
        log.warning("endpoint %s marked down: %s", endpoint.name, why)
        self.fleet.mark_down(endpoint, why, time.monotonic())
        self.metrics.endpoint_failures.labels("silent").inc()

    async def start(self, app: web.Application) -> None:
        assert self.session is not None
        if self.config.workers.static:
            self.apply({s.name: s for s in discovery.static_states(self.config.workers)})
        else:
            assert self.creds is not None, "discovery needs credentials"
            namespace = self.config.workers.namespace or self.creds.namespace
            self.reader = PodReader(self.creds, namespace, self.config.workers.label_selector)
            self.tasks.append(
                asyncio.ensure_future(discovery.watch_pods(self.reader, self.config.workers, self.apply))
            )
        self.tasks.append(asyncio.ensure_future(self._tick()))
        if self.config.routing.announce_queue and self.config.workers.kv_events_port is not None:
            announcer = Announcer(self.session, self.fleet, self.gate)
            self.metrics.live.lookahead = lambda: announcer.announced
            self.tasks.append(asyncio.ensure_future(announcer.run()))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self.gate.dispatch()

    async def stop(self, app: web.Application) -> None:
        for task in self.tasks + [t for ts in self.followers.values() for t in ts]:
            task.cancel()
        for task in self.tasks + [t for ts in self.followers.values() for t in ts]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.reader is not None:
            await self.reader.close()
        if self.session is not None:
            await self.session.close()


def make_app(config: RouterConfig, creds: Credentials | None, api_key: str | None = None) -> web.Application:
    """The app; starting it starts discovery and the followers, cleaning it up stops them.
    ``api_key``: checked at the door as the workers check it (``strata.worker.server.auth``)."""
    runtime = Runtime(config, creds)
    # One session to the workers: no connection limit (the gate bounds requests in flight).
    runtime.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
    app = build_app(runtime.parts(runtime.session), api_key)
    app.on_startup.append(runtime.start)
    app.on_cleanup.append(runtime.stop)
    return app


def serve(config: RouterConfig, creds: Credentials | None, api_key: str | None = None) -> None:
    async def build() -> web.Application:
        return make_app(config, creds, api_key)

    # handler_cancellation: a caller that hangs up cancels its request, and the worker sees it.
    web.run_app(
        build(), host=config.host, port=config.port, print=None, access_log=None, handler_cancellation=True
    )
