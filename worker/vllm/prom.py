"""What the connector measures of vLLM's steps, exported through vLLM's own /metrics under the
names Strata's worker uses: the autoscaler's prefill utilization and the bottleneck verdict read
them for both engines alike.

The worker side times every step it sees (``start_load_kv`` before the forward pass to the end
of ``wait_for_save`` after it: the step's wall time, its loads and saves included), and the part
of it spent loading from and saving to the sidecar. vLLM carries these per-step figures from the
worker to its stat loggers (``get_kv_connector_stats``), which hand them to
:class:`StrataPromMetrics`. Imports vLLM: loaded only inside a vLLM process.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

P = "strata_worker_"
SECONDS = ("busy_s", "prefill_busy_s", "load_s", "save_s")
BUSY_DOC = "Wall time of engine steps that had work."
PREFILL_DOC = "The part of it in steps that computed prompt tokens."
WAIT_DOC = "Step time spent waiting on the KV-tier sidecar, by call (part of engine_busy_seconds)."


class StrataStats(KVConnectorStats):  # type: ignore[misc]  # vLLM is untyped here
    """Seconds per kind since the last report: ``busy_s`` (steps with work), ``prefill_busy_s``
    (steps that computed prompt tokens), ``load_s`` and ``save_s`` (waiting on the sidecar)."""

    def reset(self) -> None:
        self.data = dict.fromkeys(SECONDS, 0.0)

    def add(self, key: str, seconds: float) -> None:
        self.data[key] = self.data.get(key, 0.0) + seconds

    def aggregate(self, other: KVConnectorStats) -> StrataStats:
        for key, seconds in other.data.items():
            self.add(key, float(seconds))
        return self

    def reduce(self) -> dict[str, int | float]:
        return {key: round(float(self.data.get(key, 0.0)), 6) for key in SECONDS}

    def is_empty(self) -> bool:
        return not any(self.data.get(key) for key in SECONDS)


class StrataPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """Counters with vLLM's labels (``model_name``, ``engine``), per engine."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        counter = self._counter_cls
        busy = counter(name=P + "engine_busy_seconds", documentation=BUSY_DOC, labelnames=labelnames)
        prefill = counter(name=P + "prefill_busy_seconds", documentation=PREFILL_DOC, labelnames=labelnames)
        wait = counter(name=P + "tier_wait_seconds", documentation=WAIT_DOC, labelnames=[*labelnames, "op"])
        self.counters: dict[tuple[int, str], Any] = {}
        for engine, values in per_engine_labelvalues.items():
            self.counters[engine, "busy_s"] = busy.labels(*values)
            self.counters[engine, "prefill_busy_s"] = prefill.labels(*values)
            self.counters[engine, "load_s"] = wait.labels(*values, "load")
            self.counters[engine, "save_s"] = wait.labels(*values, "save")

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key in SECONDS:
            seconds = float(transfer_stats_data.get(key, 0.0) or 0.0)
            if seconds > 0 and (engine_idx, key) in self.counters:
                self.counters[engine_idx, key].inc(seconds)
