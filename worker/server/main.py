"""Start-up: load the model, connect the KV tiers when configured, serve until stopped."""

from __future__ import annotations

import logging

from aiohttp import web

from strata.worker.config import WorkerConfig
from strata.worker.engine.llm_engine import LLMEngine, apply_cpu_threads, pick_device
from strata.worker.engine.model_runner import block_shape
from strata.worker.kv_connector import KVConnector
from strata.worker.models.loader import DTYPES, load_model
from strata.worker.server.app import build_app
from strata.worker.server.engine_loop import EngineLoop
from strata.worker.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


def build_engine(config: WorkerConfig) -> LLMEngine:
    apply_cpu_threads(config.engine)
    device = pick_device(config.engine.device)
    dtype = DTYPES[config.model.dtype]
    model = load_model(config.model.path, dtype, device)
    connector: KVConnector | None = None
    if config.kvtier.enabled:
        from strata.worker.kvtier.client import connect  # only workers with the sidecar need it

        connector = connect(config, block_shape(model, config.engine.block_size), dtype)
    engine = LLMEngine(config, model, load_tokenizer(config.model.path, model.config.eos_token_id), connector)
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
        web.run_app(app, host=config.server.host, port=config.server.port, print=None, access_log=None)
    finally:
        engine.close()
