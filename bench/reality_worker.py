"""The worker the reality check (``bench.sim_reality``) measures, and the engine settings it is
given, whichever way it runs: a lone ``strata worker serve`` process on a loopback port
(``worker``), or a pod of an InferenceService on the local pod runtime (``bench.reality_pods``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from strata.stack.dataplane import running_worker

ENGINE_BLOCK = 16
NUM_GPU_BLOCKS = 2048  # 32k tokens of KV: a few dozen prompts, so the cache evicts
MAX_BATCHED_TOKENS = 2048
MAX_CONTEXT_TOKENS = 8192


@dataclass(frozen=True)
class Worker:
    base: str  # URL
    pid: int  # the process whose engine thread's CPU time the check meters


@contextmanager
def worker(model_dir: Path) -> Iterator[Worker]:
    """A real worker process serving the ``small`` model in ``model_dir`` (its config and log
    written there too), one torch thread, on a free loopback port."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    engine = {
        "block_size": ENGINE_BLOCK,
        "num_gpu_blocks": NUM_GPU_BLOCKS,
        "max_batched_tokens": MAX_BATCHED_TOKENS,
    }
    with running_worker(model_dir, model_dir, "small", env, MAX_CONTEXT_TOKENS, **engine) as process:
        yield Worker(process.base_url, process.proc.pid)
