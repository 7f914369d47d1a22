"""Start-up: load the model, connect the KV tiers when configured, serve until stopped."""

from __future__ import annotations

import logging

from aiohttp import web

from strata.worker.config import WorkerConfig
from strata.worker.engine.llm_engine import LLMEngine
from strata.worker.server.app import build_app
from strata.worker.server.engine_loop import EngineLoop

log = logging.getLogger(__name__)


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
    app = build_app(EngineLoop(engine))
    try:
        # handler_cancellation: a client that hangs up aborts its request instead of running on
        web.run_app(
            app,
            host=config.server.host,
            port=config.server.port,
            print=None,
            access_log=None,
            handler_cancellation=True,
        )
    finally:
        engine.close()
