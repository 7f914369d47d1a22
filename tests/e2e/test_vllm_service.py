"""An InferenceService with ``engine.kind: vllm``, end to end on the test control plane: its pod
runs a real vLLM (the CPU build, ``make vllm-env``, which the local pod runtime maps vLLM's
images to) with Strata's connector, beside a real KV-tier sidecar, and real routers in front.

- it goes Ready and answers the official ``openai`` client: completions, chat, streaming with
  usage;
- a repeated prompt after its engine container was killed (HBM gone, the sidecar kept running)
  is served from Strata's DRAM, and after its pod was replaced (DRAM gone) from NVMe: vLLM's own
  counters say so, and the answer equals the cold run's;
- with two replicas behind the router, a conversation goes back to the replica whose own KV
  events (relayed by its sidecar) show its prefix.

vLLM starts in minutes on a loaded two-core machine: every wait is bounded and on an event."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from strata.cluster import Cluster
from strata.demo import dataplane
from strata.demo.walk import WalkPod, crash, replace
from strata.operator import names
from strata.router.config import RouterConfig
from strata.router.intake import Intake
from strata.stack import OperatorProcess, local_pods_env, operator_running
from strata.stack.dataplane import running_router
from strata.stack.serving import loopback_ip, ready_worker_pods, worker_pods
from strata.stack.vllm import ensure_vllm_env, relayed_keys, vllm_service, vllm_tier
from strata.stack.wait import wait_for
from strata.worker.config import WorkerConfig
from strata.worker.models.presets import write_model

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(5400)]
TIER, SERVICE, MODEL = "e2e-vllm", "vchat", "hf-tiny"
READY_S = 1500.0  # a vLLM start imports torch in up to three processes on a loaded two-core machine
COMMITTED_S = 120.0
PROMPT_TOKENS = 1200  # 37 blocks of 32


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    ensure_vllm_env()  # before any pod asks for it
    directory = tmp_path_factory.mktemp("vllm-service")
    with operator_running(
        cluster, directory / "operator.log", env=local_pods_env(directory / "nvme")
    ) as process:
        cluster.apply(vllm_tier(TIER))
        try:
            yield process
        finally:
            cluster.kubectl("delete", "servicetier", TIER, "--ignore-not-found")


def walk_pod(cluster: Cluster, namespace: str, name: str | None = None) -> WalkPod:
    pods = [p for p in worker_pods(cluster, namespace, SERVICE) if name in (None, p["metadata"]["name"])]
    assert pods, f"no running pod {name or ''} of {SERVICE}"
    config_map = cluster.kubectl_json("get", "configmap", names.configmap_name(SERVICE), "-n", namespace)
    config = WorkerConfig.from_yaml(config_map["data"]["worker.yaml"])
    return WalkPod(namespace, pods[0]["metadata"]["name"], loopback_ip(pods[0]), config)


def answered(api: str, prompt: str) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0}
    reply = httpx.post(f"{api}/v1/completions", json=body, timeout=600)
    reply.raise_for_status()
    text: str = reply.json()["choices"][0]["text"]
    return text


def external_hits(api: str) -> dict[str, float]:
    return dataplane.hit_tokens(api)


def test_a_vllm_service_serves_the_openai_client_and_its_prefix_from_dram_then_nvme(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    cluster.apply(
        vllm_service(SERVICE, TIER, MODEL, {"hbm": "64Mi", "dram": "256Mi", "nvme": "1Gi"}), namespace
    )
    ready_worker_pods(cluster, namespace, SERVICE, 1, READY_S)
    pod = walk_pod(cluster, namespace)
    client = openai.OpenAI(base_url=f"{pod.api}/v1", api_key="none", max_retries=0, timeout=600)
    completion = client.completions.create(model=MODEL, prompt="hello", max_tokens=5, temperature=0)
    assert completion.choices[0].text and completion.usage is not None
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0
    )
    assert chat.choices[0].message.content is not None
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5

    prompt = dataplane.long_prompt(PROMPT_TOKENS)
    cold = answered(pod.api, prompt)
    blocks = PROMPT_TOKENS // 32
    wait_for(lambda: dataplane.held_blocks(pod.kv_metrics)["nvme"] >= blocks - 1, COMMITTED_S,
             what="the prompt's blocks written through to NVMe")  # fmt: skip
    crash(cluster, pod, ["engine"])
    before = external_hits(pod.api)
    assert answered(pod.api, prompt) == cold
    assert external_hits(pod.api)["dram"] - before["dram"] >= (blocks - 1) * 32

    replace(cluster, pod)
    pod = walk_pod(cluster, namespace)
    assert answered(pod.api, prompt) == cold
    assert external_hits(pod.api)["nvme"] >= (blocks - 1) * 32


def test_two_vllm_replicas_behind_the_router_keep_a_conversation_where_its_prefix_is(
    cluster: Cluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    cache = {"hbm": "64Mi", "dram": "0", "nvme": "0"}  # the sidecar relays vLLM's events all the same
    spec = vllm_service(SERVICE, TIER, MODEL, cache, max_context=2048)
    spec["spec"].update(replicas=2, minReplicas=2, maxReplicas=2)
    cluster.apply(spec, namespace)
    pods = ready_worker_pods(cluster, namespace, SERVICE, 2, READY_S)
    walks = [walk_pod(cluster, namespace, p["metadata"]["name"]) for p in pods]
    config = routed_to(cluster, namespace, walks)
    history = dataplane.long_prompt(PROMPT_TOKENS)
    with running_router(tmp_path, config) as router:
        wait_for(
            lambda: router.metrics().get(SYNCED, 0) >= 2, SYNC_S, what="the router to follow both relays"
        )
        answered(router.base_url, history)
        keys = set(prompt_keys(config, history))
        holders = [w for w in walks if keys <= relayed_keys(w.kv_metrics)]
        assert len(holders) == 1, "the first turn's blocks are in one replica's HBM, as its own events say"
        before = [requests_served(w.api) for w in walks]
        for turn in range(3):
            history += f" turn {turn}: " + dataplane.long_prompt(64)
            answered(router.base_url, history)
        served = [requests_served(w.api) - b for w, b in zip(walks, before, strict=True)]
    assert served[walks.index(holders[0])] == 3 and sum(served) == 3, served


SYNCED = 'strata_router_event_streams{source="worker",state="synced"}'
SYNC_S = 120.0


def routed_to(cluster: Cluster, namespace: str, walks: list[WalkPod]) -> dict[str, Any]:
    """The router.yaml the operator rendered for the service, sent to these pods' addresses (a
    router process here, where the pods' own routers would need cores the local node lacks)."""
    config_map = cluster.kubectl_json("get", "configmap", names.configmap_name(SERVICE), "-n", namespace)
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["router.yaml"])
    config["host"] = "127.0.0.1"
    config["workers"] = {**config["workers"], "static": [w.api for w in walks], "label_selector": ""}
    config["model"]["path"] = str(model_dir())
    return config


def model_dir() -> Path:
    """The served test model's files, for the router's tokenizer (the pods fetched the same)."""
    directory = Path(tempfile.mkdtemp(prefix="vllm-model-"))
    return write_model(directory / "model", MODEL)


def prompt_keys(config: dict[str, Any], prompt: str) -> list[bytes]:
    body = json.dumps({"model": MODEL, "prompt": prompt}).encode()
    blocks = Intake(RouterConfig.model_validate(config)).admit(body, "completion", {}, "r").prompt.blocks
    return [key for key in blocks if isinstance(key, bytes)]


def requests_served(api: str) -> float:
    text = httpx.get(f"{api}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{")
    )
