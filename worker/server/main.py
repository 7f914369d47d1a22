"""Start-up and shutdown: load the model, connect the KV tiers when configured, serve until
SIGTERM or SIGINT, then drain (drain.py) and exit 0.

aiohttp's own run_app stops listening at the signal and gives handlers a fixed timeout; here the
listener stays up during the drain so that readiness probes see 503 and late requests get a
clear 503 rather than a refused connection, and the drain is bounded by the configured
``server.drain_timeout_s``, which the operator ties to the pod's grace period."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from aiohttp import web

from strata.common.openai.auth import api_key_from
from strata.worker.config import DRAIN_CUTOFF_S, WorkerConfig
from strata.worker.engine.llm_engine import LLMEngine
from strata.worker.server.app import build_app
from strata.worker.server.drain import Drain
from strata.worker.server.engine_loop import EngineLoop

log = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def build_engine(config: WorkerConfig) -> LLMEngine:
    engine = LLMEngine.from_config(config, connect_tiers=True)
    log.info(
        "engine ready: model=%s device=%s kv_blocks=%d block_size=%d max_context=%d kvtier=%s",
        config.model.name,
        engine.device,
        engine.blocks.num_blocks,
        engine.block_size,
        engine.max_context,
        config.kvtier.enabled,
    )
    return engine


def serve(config: WorkerConfig) -> None:
    engine = build_engine(config)
    try:
        asyncio.run(_serve(config, EngineLoop(engine)))
    finally:
        engine.close()
    log.info("stopped", extra={"event": "stopped"})
    # Everything is closed and logged. The interpreter's own teardown (torch's modules and the
    # engine's objects) takes 10-60 s of CPU on a loaded machine, a pod Terminating for nothing
    # (and, past its probes, looking dead): skip it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


async def _serve(config: WorkerConfig, engine_loop: EngineLoop) -> None:
    drain = Drain()
    # handler_cancellation: a client that hangs up aborts its request instead of running on.
    runner = web.AppRunner(
        build_app(engine_loop, drain, api_key=api_key_from(os.environ)),
        handle_signals=False,
        access_log=None,
        handler_cancellation=True,
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, config.server.host, config.server.port).start()
        log.info("serving on %s:%d", config.server.host, config.server.port)
        await _drain_on_signal(drain, engine_loop, config.server.drain_timeout_s)
    finally:
        await runner.cleanup()


async def _drain_on_signal(drain: Drain, engine_loop: EngineLoop, timeout_s: float) -> None:
    """Wait for the first stop signal, then drain; a second signal cuts the drain short."""
    signals: asyncio.Queue[signal.Signals] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    try:
        first = await signals.get()
        drain.begin()
        log.info(
            "%s: draining %d requests in flight (%d streams), up to %.0f s",
            first.name,
            drain.in_flight,
            drain.in_flight_streams,
            timeout_s,
            extra=_shutdown_fields(first, drain, timeout_s),
        )
        second = asyncio.ensure_future(signals.get())
        idle = asyncio.ensure_future(drain.wait_idle(timeout_s))
        await asyncio.wait({second, idle}, return_when=asyncio.FIRST_COMPLETED)
        second.cancel()
        aborted = 0 if idle.done() and idle.result() else await _cut_off(drain, engine_loop)
        idle.cancel()
        _log_drained(drain, aborted)
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


async def _cut_off(drain: Drain, engine_loop: EngineLoop) -> int:
    """The drain ran out (or a second signal came): end what is left, as a 503 or a cut stream."""
    left = drain.in_flight
    log.warning("drain cut off: ending %d requests still in flight", left)
    engine_loop.abort_all("shutdown")
    await drain.wait_idle(DRAIN_CUTOFF_S)
    return left


def _shutdown_fields(sig: signal.Signals, drain: Drain, timeout_s: float) -> dict[str, object]:
    return {
        "event": "shutdown",
        "signal": sig.name,
        "in_flight": drain.in_flight,
        "streams": drain.in_flight_streams,
        "drain_timeout_s": timeout_s,
    }


def _log_drained(drain: Drain, aborted: int) -> None:
    summary = drain.summary(aborted)
    log.info(
        "drained: finished %d requests (%d streams, %d answered with an error) in %.1f s; %d cut off",
        summary.finished,
        summary.streams,
        summary.errors,
        summary.seconds,
        summary.aborted,
        extra={"event": "drained", **summary.fields()},
    )
