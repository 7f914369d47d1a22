"""The real router in front of real workers (the tiny test model, one thread each): streaming
passthrough, the worker's errors, bad input answered at the door, failover, broken endpoints,
and a router restarted under load."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from strata.stack.dataplane import RouterProcess, router_config, running_router, running_workers
from strata.worker.models.presets import write_model
from tests.worker.worker_proc import WorkerProcess, free_port, running_worker

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("tiny"), "tiny")


@pytest.fixture(scope="module")
def workers(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    with running_workers([tmp_path_factory.mktemp("w1"), tmp_path_factory.mktemp("w2")], tiny) as both:
        yield both


@pytest.fixture(scope="module")
def router(workers: list[WorkerProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    # no vocabulary here: token ids are the workers' to check (the error passthrough test)
    config = router_config([w.base_url for w in workers], model={"vocab_size": None})
    with running_router(tmp_path_factory.mktemp("router"), config) as r:
        wait_for(lambda: r.metrics().get('strata_router_event_streams{source="worker",state="synced"}') == 2)
        yield r


def wait_for(condition, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within_s} s")
        time.sleep(0.1)


def post(
    base_url: str, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, Any, dict[str, str]]:
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}"), dict(resp.getheaders())
    finally:
        conn.close()


def cached(usage: Any) -> int:
    """The prompt tokens a worker reported served from cache."""
    return int(usage.prompt_tokens_details.cached_tokens)


def client(base_url: str, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=retries, timeout=120)


def test_responses_stream_through_and_repeated_prefixes_land_where_they_are_cached(router: RouterProcess):
    api = client(router.base_url)
    prompt = "a conversation that goes on and on " * 6
    first = api.completions.create(model="tiny", prompt=prompt, max_tokens=4)
    assert cached(first.usage) == 0
    stream = api.completions.create(
        model="tiny",
        prompt=prompt + "and on",
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert cached(usage) >= 192  # the first prompt's blocks
    chat = api.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.choices[0].message.role == "assistant"
    metrics = router.metrics()
    assert (
        metrics["strata_router_cached_tokens_total"] == metrics["strata_router_predicted_cached_tokens_total"]
    )
    # workers without sidecars report HBM only: no lower-tier key followed, none refused
    assert metrics["strata_router_followed_blocks"] == 0
    assert metrics["strata_router_unfollowed_blocks_total"] == 0


def test_a_worker_error_comes_back_unchanged(router: RouterProcess, workers: list[WorkerProcess]):
    # this router does not know the vocabulary: only the worker can refuse these ids
    body = json.dumps({"model": "tiny", "prompt": list(range(400, 410)), "max_tokens": 2}).encode()
    direct = post(workers[0].base_url, "/v1/completions", body)
    routed = post(router.base_url, "/v1/completions", body)
    assert routed[0] == direct[0] == 400
    assert routed[1] == direct[1]


BAD_INPUT: list[tuple[bytes, dict[str, str]]] = [
    (b"not json", {}),
    (json.dumps({"model": "other", "prompt": "hi"}).encode(), {}),
    (json.dumps({"model": "tiny", "prompt": "hi " * 300}).encode(), {}),  # beyond the 512-token context
    (json.dumps({"model": "tiny", "prompt": list(range(400, 410))}).encode(), {}),  # ids past the vocabulary
    (json.dumps({"model": "tiny", "messages": [{"role": "robot", "content": "hi"}]}).encode(), {}),
    (json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 0}).encode(), {}),
]


@pytest.mark.parametrize(("body", "headers"), BAD_INPUT)
def test_bad_input_gets_the_workers_error_from_the_router_alone(
    body: bytes, headers: dict[str, str], workers: list[WorkerProcess], tmp_path: Path
):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: forwarding anything would fail
    with running_router(tmp_path, router_config([dead])) as alone:
        path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
        routed = post(alone.base_url, path, body, headers)
        direct = post(workers[0].base_url, path, body, headers)
        assert routed[0] == direct[0] and routed[0] in (400, 404)
        assert routed[1] == direct[1]
        assert not any(k.startswith("strata_router_retries_total") for k in alone.metrics())


def test_headers_the_router_refuses_are_named_in_openais_shape(router: RouterProcess):
    body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2}).encode()
    status, error, _ = post(router.base_url, "/v1/completions", body, {"X-Strata-Priority": "urgent"})
    assert status == 400 and error["error"]["param"] == "X-Strata-Priority"
    status, error, _ = post(router.base_url, "/v1/completions", body, {"X-Strata-Priority": "7"})
    assert status == 400 and "between 0 and 0" in error["error"]["message"]
    status, error, _ = post(router.base_url, "/v1/completions", body, {"X-Big": "x" * 9000})
    assert (
        status == 431
        and error["error"]["param"] == "X-Big"
        and error["error"]["type"] == "invalid_request_error"
    )


def test_a_killed_worker_s_waiting_requests_fail_over(
    tiny: Path, workers: list[WorkerProcess], tmp_path_factory: pytest.TempPathFactory
):
    with running_worker(tiny, tmp_path_factory.mktemp("doomed")) as doomed:
        config = router_config(
            [doomed.base_url, workers[0].base_url], queue={"max_inflight_per_endpoint": 64}
        )
        with running_router(tmp_path_factory.mktemp("failover"), config) as r:
            api = client(r.base_url)
            body = {"model": "tiny", "max_tokens": 120, "extra_body": {"ignore_eos": True}}

            def ask(i: int) -> int:
                done = api.completions.create(prompt=f"request {i} " * 8, **body)  # type: ignore[call-overload]
                return int(done.usage.completion_tokens)

            with ThreadPoolExecutor(8) as pool:
                futures = [pool.submit(ask, i) for i in range(8)]
                wait_for(lambda: doomed_busy(doomed), within_s=60)
                doomed.proc.kill()
                assert [f.result(timeout=300) for f in futures] == [120] * 8
            assert (
                r.metrics().get('strata_router_retries_total{cause="reset"}', 0)
                + r.metrics().get('strata_router_retries_total{cause="refused"}', 0)
                >= 1
            )


def doomed_busy(worker: WorkerProcess) -> bool:
    import urllib.request

    with urllib.request.urlopen(worker.base_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    running = [line for line in text.splitlines() if line.startswith("strata_worker_running_requests")]
    return bool(running) and float(running[0].split()[-1]) > 0


@contextmanager
def broken_endpoint(kind: str) -> Iterator[str]:
    """A port that accepts connections and then answers garbage, or never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            if kind == "garbage":
                conn.sendall(b"SPAM SPAM SPAM\r\n\r\n")
                conn.close()
            else:
                held.append(conn)  # read nothing, answer nothing

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(10)
        for conn in held:
            conn.close()
        listener.close()


def test_endpoints_that_answer_garbage_or_hang_are_timed_out_and_marked_down(
    workers: list[WorkerProcess], tmp_path: Path
):
    with broken_endpoint("garbage") as garbage, broken_endpoint("hang") as hang:
        config = router_config(
            [garbage, hang, workers[0].base_url],
            timeouts={"connect_s": 2, "response_s": 3, "events_silence_s": 3},
        )
        with running_router(tmp_path, config) as r:
            api = client(r.base_url)
            for i in range(6):
                done = api.completions.create(model="tiny", prompt=f"hello {i}", max_tokens=2)
                assert done.choices[0].finish_reason in ("stop", "length")
            metrics = r.metrics()
            failures = {
                k: v for k, v in metrics.items() if k.startswith("strata_router_endpoint_failures_total")
            }
            assert failures.get('strata_router_endpoint_failures_total{cause="garbage"}', 0) >= 1, failures
            assert failures.get('strata_router_endpoint_failures_total{cause="timeout"}', 0) >= 1, failures


def test_a_router_killed_under_load_loses_no_request_that_had_not_started_and_rebuilds_its_view(
    workers: list[WorkerProcess], tmp_path: Path
):
    config = router_config([w.base_url for w in workers])
    with running_router(tmp_path, config) as r:
        api = client(r.base_url, retries=8)  # as a caller behind a Service would, across a restart
        prefix = "the shared history of one long conversation " * 5
        api.completions.create(model="tiny", prompt=prefix, max_tokens=2)

        def ask(i: int) -> str:
            done = api.completions.create(model="tiny", prompt=f"{prefix} turn {i}", max_tokens=40)
            return str(done.choices[0].finish_reason)

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(ask, i) for i in range(12)]
            time.sleep(0.5)
            r.kill()
            r.start()
            assert all(f.result(timeout=300) in ("stop", "length") for f in futures)
        wait_for(lambda: r.metrics().get('strata_router_event_streams{source="worker",state="synced"}') == 2)
        after = api.completions.create(model="tiny", prompt=f"{prefix} once more", max_tokens=2)
        assert cached(after.usage) >= 16 * 12
        metrics = r.metrics()
        assert metrics['strata_router_requests_total{code="200",reason="cache"}'] >= 1
        assert (
            metrics["strata_router_predicted_cached_tokens_total"]
            == metrics["strata_router_cached_tokens_total"]
        )


def test_a_draining_workers_refusals_go_to_another_replica(
    tiny: Path, workers: list[WorkerProcess], tmp_path_factory: pytest.TempPathFactory
):
    """SIGTERM: the worker finishes what it holds but answers new requests with a draining 503;
    the router sends those to the other replica instead of passing the 503 back."""
    with running_worker(tiny, tmp_path_factory.mktemp("leaving")) as leaving:
        # round-robin: some new requests are sure to be sent to the draining worker first
        config = router_config([leaving.base_url, workers[0].base_url], policy="round-robin")
        with running_router(tmp_path_factory.mktemp("drain"), config) as r:
            api = client(r.base_url)
            direct = client(leaving.base_url)

            def long_answer() -> Any:
                return direct.completions.create(
                    model="tiny", prompt="x", max_tokens=400, extra_body={"ignore_eos": True}
                )

            with ThreadPoolExecutor(2) as pool:
                held = pool.submit(long_answer)
                wait_for(lambda: doomed_busy(leaving), within_s=60)
                leaving.proc.terminate()  # draining from now until the long request is done
                wait_for(lambda: not ready(leaving), within_s=60)
                answers = [
                    api.completions.create(model="tiny", prompt=f"new {i}", max_tokens=2) for i in range(4)
                ]
                assert all(a.choices for a in answers)
                assert held.result(timeout=300).choices[0].finish_reason == "length"
            assert r.metrics().get('strata_router_retries_total{cause="draining"}', 0) >= 1


def ready(worker: WorkerProcess) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(worker.base_url + "/ready", timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.HTTPError, OSError):
        return False


@pytest.fixture(scope="module")
def keyed(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A worker that requires an API key (``STRATA_API_KEY``, as a Secret would set it)."""
    env = {**os.environ, "STRATA_API_KEY": API_KEY}
    with running_worker(tiny, tmp_path_factory.mktemp("keyed"), env=env) as worker:
        yield worker


API_KEY = "sk-strata-test"


def test_the_callers_api_key_reaches_the_worker_and_its_401_comes_back_unchanged(
    keyed: WorkerProcess, tmp_path: Path
):
    with running_router(tmp_path, router_config([keyed.base_url])) as r:
        body = json.dumps({"model": "tiny", "prompt": "hello there", "max_tokens": 2}).encode()
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            routed = post(r.base_url, "/v1/completions", body, headers)
            direct = post(keyed.base_url, "/v1/completions", body, headers)
            assert routed[0] == direct[0] == 401
            assert routed[1] == direct[1] and routed[1]["error"]["type"] == "authentication_error"
        with pytest.raises(openai.AuthenticationError):
            client(r.base_url).completions.create(model="tiny", prompt="hello", max_tokens=2)
        api = openai.OpenAI(base_url=r.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
        done = api.completions.create(
            model="tiny", prompt="hello", max_tokens=2, extra_body={"ignore_eos": True}
        )
        assert done.usage is not None and done.usage.completion_tokens == 2


def test_one_request_id_joins_caller_router_and_worker(keyed: WorkerProcess, tmp_path: Path):
    """The caller's X-Request-Id, or one the router makes: forwarded, returned, on both logs."""
    auth = {"Authorization": f"Bearer {API_KEY}"}
    body = json.dumps({"model": "tiny", "prompt": "hello there", "max_tokens": 2}).encode()
    with running_router(tmp_path, router_config([keyed.base_url])) as r:
        given = post(r.base_url, "/v1/completions", body, {**auth, "X-Request-Id": "trace-42"})
        made = post(r.base_url, "/v1/completions", body, auth)
        refused = post(r.base_url, "/v1/completions", b"not json", {"X-Request-Id": "trace-43"})
        router_log = r.log_path.read_text()
    assert given[0] == made[0] == 200 and refused[0] == 400
    assert given[2]["X-Request-Id"] == "trace-42" and given[1]["id"] == "cmpl-trace-42"
    rid = made[2]["X-Request-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid) and made[1]["id"] == f"cmpl-{rid}"  # the worker had it
    assert refused[2]["X-Request-Id"] == "trace-43"
    worker_log = keyed.log_path.read_text()
    for request_id in ("trace-42", rid):
        assert logged(router_log, request_id, "request routed") and logged(worker_log, request_id)
    assert logged(router_log, "trace-43")


def logged(log: str, request_id: str, msg: str | None = None) -> bool:
    """A JSON log line carries this request id (and this message)."""
    for line in log.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("request_id") == request_id and msg in (None, entry.get("msg")):
            return True
    return False


def test_a_router_with_the_key_refuses_callers_without_it_at_the_door(keyed: WorkerProcess, tmp_path: Path):
    """With the workers' key (as the operator passes it on), the router answers 401 itself, the
    same 401 as the worker's, before validating or queueing anything; with the key, requests go
    through and bad input gets the usual 400."""
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: forwarding anything would fail
    env = {**os.environ, "STRATA_API_KEY": API_KEY}
    auth = {"Authorization": f"Bearer {API_KEY}"}
    with running_router(tmp_path, router_config([dead]), env=env) as alone:
        direct = post(keyed.base_url, "/v1/completions", b"not json", {"X-Request-Id": "door-1"})
        routed = post(alone.base_url, "/v1/completions", b"not json", {"X-Request-Id": "door-1"})
        assert routed[0] == direct[0] == 401 and routed[1] == direct[1]
        assert routed[2]["X-Request-Id"] == "door-1"
        assert post(alone.base_url, "/v1/completions", b"not json", auth)[0] == 400
        with pytest.raises(openai.AuthenticationError):
            client(alone.base_url).models.list()
        models = openai.OpenAI(base_url=alone.base_url + "/v1", api_key=API_KEY, max_retries=0).models.list()
        assert [m.id for m in models] == ["tiny"]
        metrics = alone.metrics()  # probes and Prometheus need no key
    assert not any(k.startswith("strata_router_retries_total") for k in metrics)
