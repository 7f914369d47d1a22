"""The HTTP API end to end over a loopback port: good requests, streaming, each kind of bad
input (a clear 4xx naming the field, and the server keeps serving), refusals and metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from strata.worker.server.app import build_app
from strata.worker.server.engine_loop import EngineLoop
from strata.worker.server.generate import LOOP_KEY
from tests.worker.conftest import EngineFactory

PROMPT = "The quick brown fox"


@asynccontextmanager
async def serve(
    make_engine: EngineFactory, **engine: Any
) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    client = TestClient(TestServer(build_app(EngineLoop(make_engine(**engine)))))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


def completion(**fields: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": 5,
        "temperature": 0,
        "ignore_eos": True,
        **fields,
    }


async def sse_events(resp: Any) -> list[str]:
    body = (await resp.read()).decode()
    return [line.removeprefix("data: ") for line in body.split("\n\n") if line.startswith("data: ")]


async def test_health_ready_and_models(make_engine: EngineFactory) -> None:
    async with serve(make_engine) as client:
        assert (await client.get("/health")).status == 200
        ready = await client.get("/ready")
        assert ready.status == 200 and (await ready.json())["model"] == "tiny"
        models = await (await client.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
        assert models["data"][0]["max_model_len"] == 1024


async def test_completion_and_streaming_agree(make_engine: EngineFactory) -> None:
    async with serve(make_engine) as client:
        resp = await client.post("/v1/completions", json=completion())
        assert resp.status == 200
        body = await resp.json()
        assert body["object"] == "text_completion"
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"] == {
            "prompt_tokens": len(PROMPT),
            "completion_tokens": 5,
            "total_tokens": 24,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        stream = await client.post("/v1/completions", json=completion(stream=True))
        assert stream.status == 200 and stream.headers["Content-Type"].startswith("text/event-stream")
        events = await sse_events(stream)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert "".join(c["choices"][0]["text"] for c in chunks) == body["choices"][0]["text"]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_chat_completion_and_stream(make_engine: EngineFactory) -> None:
    request = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    async with serve(make_engine) as client:
        body = await (await client.post("/v1/chat/completions", json=request)).json()
        assert body["object"] == "chat.completion"
        message = body["choices"][0]["message"]
        assert message["role"] == "assistant" and isinstance(message["content"], str)
        events = await sse_events(await client.post("/v1/chat/completions", json={**request, "stream": True}))
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == message["content"]


async def test_token_id_prompts_are_accepted(make_engine: EngineFactory) -> None:
    async with serve(make_engine) as client:
        resp = await client.post("/v1/completions", json=completion(prompt=[1, 2, 3, 4, 5]))
        assert resp.status == 200
        assert (await resp.json())["usage"]["prompt_tokens"] == 5


async def expect_error(
    client: TestClient[web.Request, web.Application], path: str, status: int, param: str | None, **kwargs: Any
) -> None:
    resp = await client.post(path, **kwargs)
    assert resp.status == status, await resp.text()
    error = (await resp.json())["error"]
    assert error["param"] == param and error["message"]


async def test_bad_input_gets_a_clear_4xx_and_the_server_keeps_serving(make_engine: EngineFactory) -> None:
    path = "/v1/completions"
    async with serve(make_engine) as client:
        await expect_error(client, path, 400, None, data=b"{not json")
        await expect_error(client, path, 400, None, json=["a list"])
        await expect_error(client, path, 400, "prompt", json=completion(prompt=None))
        await expect_error(client, path, 400, "prompt", json=completion(prompt=""))
        await expect_error(client, path, 400, "prompt", json=completion(prompt="x" * 1100))
        await expect_error(client, path, 400, "max_tokens", json=completion(max_tokens=1020))
        await expect_error(client, path, 400, "max_tokens", json=completion(max_tokens=-1))
        await expect_error(client, path, 400, "max_tokens", json=completion(max_tokens="5"))
        await expect_error(client, path, 404, "model", json=completion(model="gpt-4"))
        await expect_error(client, path, 400, "model", json=completion(model=None))
        await expect_error(client, path, 400, "temperature", json=completion(temperature=5))
        await expect_error(client, path, 400, "top_p", json=completion(top_p=0))
        await expect_error(client, path, 400, "stream", json=completion(stream="yes"))
        await expect_error(client, path, 400, "priority", json=completion(priority=1.5))
        await expect_error(client, path, 400, "stop", json=completion(stop=[1]))
        await expect_error(client, path, 400, "n", json=completion(n=2))
        await expect_error(client, path, 400, "prompt", json=completion(prompt=[1, 99999]))
        chat = "/v1/chat/completions"
        await expect_error(client, chat, 400, "messages", json={"model": "tiny", "messages": []})
        bad_message = {"model": "tiny", "messages": [{"role": "user", "content": 3}]}
        await expect_error(client, chat, 400, "messages[0].content", json=bad_message)
        missing = await client.get("/v1/nothing")
        assert missing.status == 404 and "error" in await missing.json()
        assert (await client.post(path, json=completion())).status == 200


async def test_full_queue_is_refused_with_429_and_retry_after(make_engine: EngineFactory) -> None:
    async with serve(make_engine, max_queue_len=0) as client:
        resp = await client.post("/v1/completions", json=completion())
        assert resp.status == 429
        assert int(resp.headers["Retry-After"]) >= 1
        assert (await resp.json())["error"]["type"] == "rate_limit_error"
        metrics = await (await client.get("/metrics")).text()
        assert 'strata_worker_rejected_requests_total{reason="queue_full"} 1.0' in metrics


async def test_request_waiting_past_the_timeout_is_refused(make_engine: EngineFactory) -> None:
    async with serve(make_engine, max_num_seqs=1, queue_timeout_s=0.05) as client:
        long = asyncio.ensure_future(client.post("/v1/completions", json=completion(max_tokens=900)))
        await asyncio.sleep(0.2)  # the long request holds the only running slot
        resp = await client.post("/v1/completions", json=completion())
        assert resp.status == 429 and "Retry-After" in resp.headers
        assert (await long).status == 200


async def test_metrics_count_tokens_latency_and_prefix_hits(make_engine: EngineFactory) -> None:
    async with serve(make_engine) as client:
        for _ in range(2):
            assert (await client.post("/v1/completions", json=completion())).status == 200
        text = await (await client.get("/metrics")).text()
        assert "strata_worker_time_to_first_token_seconds_count 2.0" in text
        assert "strata_worker_e2e_request_latency_seconds_count 2.0" in text
        assert "strata_worker_inter_token_latency_seconds_count 8.0" in text
        assert f"strata_worker_prompt_tokens_total {2.0 * len(PROMPT)}" in text
        assert "strata_worker_generation_tokens_total 10.0" in text
        assert 'strata_worker_prefix_hit_tokens_total{tier="hbm"} 16.0' in text  # 4 of 19 tokens x 4
        assert 'strata_worker_prefix_hit_tokens_total{tier="dram"} 0.0' in text
        busy = next(
            line for line in text.splitlines() if line.startswith("strata_worker_prefill_busy_seconds_total")
        )
        assert float(busy.split()[1]) > 0  # two prompts were computed
        for name in (
            "queue_length",
            "running_requests",
            "kv_cache_usage_ratio",
            "recomputed_tokens_total",
            "preemptions_total",
        ):
            assert f"strata_worker_{name}" in text
        assert "strata_worker_prefix_cache_hit_ratio" not in text  # counters, which rate() works on


async def test_vllm_metric_names_with_the_model_label(make_engine: EngineFactory) -> None:
    async with serve(make_engine) as client:
        for _ in range(2):
            assert (await client.post("/v1/completions", json=completion())).status == 200
        resp = await client.post("/v1/completions", json=completion(max_tokens=900, stream=True))
        await resp.content.readline()
        resp.close()  # a client that leaves counts as abort
        text = ""
        for _ in range(200):
            text = await (await client.get("/metrics")).text()
            if 'finished_reason="abort"' in text:
                break
            await asyncio.sleep(0.05)
        m = '{model_name="tiny"}'
        for line in (
            f"vllm:num_requests_running{m}",
            f"vllm:num_requests_waiting{m}",
            f"vllm:kv_cache_usage_perc{m}",
            f"vllm:prompt_tokens_total{m} {3.0 * len(PROMPT)}",
            f"vllm:prefix_cache_queries_total{m} {3.0 * len(PROMPT)}",
            f"vllm:prefix_cache_hits_total{m} 32.0",  # 4 blocks of 4 tokens on each repeat
            f"vllm:time_to_first_token_seconds_count{m} 3.0",
            f"vllm:e2e_request_latency_seconds_count{m} 2.0",
            'vllm:request_success_total{finished_reason="length",model_name="tiny"} 2.0',
            'vllm:request_success_total{finished_reason="abort",model_name="tiny"} 1.0',
        ):
            assert line in text, line
        assert "vllm:inter_token_latency_seconds_bucket" in text and "vllm:generation_tokens_total" in text


async def test_concurrent_requests_are_batched_and_match_sequential_ones(make_engine: EngineFactory) -> None:
    prompts = [f"request number {i} " * (i + 1) for i in range(4)]
    async with serve(make_engine, max_batched_tokens=32) as client:

        async def text(prompt: str) -> str:
            resp = await client.post("/v1/completions", json=completion(prompt=prompt, max_tokens=8))
            assert resp.status == 200
            body = await resp.json()
            return str(body["choices"][0]["text"])

        sequential = [await text(p) for p in prompts]
        concurrent = await asyncio.gather(*(text(p) for p in prompts))
        assert concurrent == sequential
        assert (await client.get("/health")).status == 200


async def test_a_client_leaving_mid_stream_frees_its_request(make_engine: EngineFactory) -> None:
    async with serve(make_engine) as client:
        loop = client.app[LOOP_KEY] if client.app else None
        assert loop is not None
        resp = await client.post("/v1/completions", json=completion(max_tokens=900, stream=True))
        assert resp.status == 200
        await resp.content.readline()  # the first event arrived: generation is under way
        resp.close()
        for _ in range(200):
            if not loop.engine.has_unfinished():
                break
            await asyncio.sleep(0.05)
        assert not loop.engine.has_unfinished()
        assert loop.engine.stats.generation_tokens < 900  # aborted, not run to max_tokens
        assert (await client.get("/ready")).status == 200


async def test_api_key_is_required_on_the_api_only(make_engine: EngineFactory) -> None:
    import openai

    server = TestServer(build_app(EngineLoop(make_engine()), api_key="s3cret"))
    async with TestClient(server) as client:
        base = str(client.make_url("/v1"))
        good = openai.AsyncOpenAI(base_url=base, api_key="s3cret", max_retries=0)
        assert [m.id async for m in good.models.list()] == ["tiny"]
        for key in ("wrong", "s3cre", "s3cret-and-more"):
            bad = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                await bad.completions.create(model="tiny", prompt="x", max_tokens=1)
        assert (await client.post("/v1/completions", json=completion())).status == 401  # no header at all
        for probe in ("/health", "/ready", "/metrics"):  # kubelet and Prometheus carry no key
            assert (await client.get(probe)).status == 200
