"""The runtime's kubelet endpoint served in-process, over real mTLS, on log files laid out as the
runtime writes them: no cluster needed."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from strata.cluster import certs
from strata.cluster.podruntime import kubeletapi

# The endpoint fixture serves on the session loop (asyncio_default_fixture_loop_scope): so do the tests.
pytestmark = pytest.mark.asyncio(loop_scope="session")


@dataclass(frozen=True)
class Endpoint:
    url: str
    pki: Path
    logs: Path  # <logs>/ns_pod_uid/<container>/<n>.log
    state: Path

    def client(self, cert: Path | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        if cert is not None:
            context.load_cert_chain(str(cert), str(cert.with_suffix(".key")))
        return context

    async def get(self, path: str, cert: Path | None = None) -> tuple[int, str]:
        cert = cert or self.pki / f"{certs.KUBELET_CLIENT}.crt"
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.url + path, ssl=self.client(cert)) as reply,
        ):
            return reply.status, await reply.text()


@pytest.fixture
async def endpoint(tmp_path: Path) -> AsyncIterator[Endpoint]:
    pki = tmp_path / "pki"
    certs.create_pki(pki, "127.96.0.1")
    logs, state = tmp_path / "logs", tmp_path / "pods"
    runs = logs / "ns_talker_u1" / "main"
    runs.mkdir(parents=True)
    (runs / "0.log").write_text("first run\n")
    (runs / "1.log").write_text("a\nb\nc\n")
    context = kubeletapi.server_context(pki / "kubelet.crt", pki / "kubelet.key", pki / "ca.crt")
    runner, port = await kubeletapi.serve(kubeletapi.LogFiles(logs, state), context)
    try:
        yield Endpoint(f"https://127.0.0.1:{port}", pki, logs, state)
    finally:
        await runner.cleanup()


async def test_logs_tail_and_previous(endpoint: Endpoint) -> None:
    assert await endpoint.get("/containerLogs/ns/talker/main") == (200, "a\nb\nc\n")
    assert await endpoint.get("/containerLogs/ns/talker/main?tailLines=1") == (200, "c\n")
    assert await endpoint.get("/containerLogs/ns/talker/main?previous=true") == (200, "first run\n")
    assert await endpoint.get("/containerLogs/ns/talker/main?limitBytes=3") == (200, "a\nb")


async def test_unknown_containers_and_bad_options_are_answered(endpoint: Endpoint) -> None:
    assert (await endpoint.get("/containerLogs/ns/talker/other"))[0] == 404
    assert (await endpoint.get("/containerLogs/ns/nobody/main?previous=true"))[0] == 400
    assert (await endpoint.get("/containerLogs/ns/talker/main?tailLines=x"))[0] == 400


async def test_a_client_without_the_apiservers_cert_is_refused(endpoint: Endpoint) -> None:
    context = ssl.create_default_context(cafile=str(endpoint.pki / "ca.crt"))
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        async with aiohttp.ClientSession() as session:
            await session.get(endpoint.url + "/containerLogs/ns/talker/main", ssl=context)
    other = certs.issue_client_cert(
        certs.CertPair(endpoint.pki / "ca.crt", endpoint.pki / "ca.key"), endpoint.pki, "alice"
    )
    assert (await endpoint.get("/containerLogs/ns/talker/main", other.cert))[0] == 403


async def test_follow_streams_until_the_run_ends(endpoint: Endpoint) -> None:
    """A run whose process is alive (its shim's record names this test's process as the shim,
    the child as the container) is followed; once the record goes, the stream ends."""
    child = await asyncio.create_subprocess_exec("sleep", "60")
    record = endpoint.state / "ns_talker_u1" / "containers" / "main.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"shim": os.getpid()}))
    log = endpoint.logs / "ns_talker_u1" / "main" / "1.log"
    try:
        reading = asyncio.create_task(endpoint.get("/containerLogs/ns/talker/main?follow=true"))
        await asyncio.sleep(3 * kubeletapi.FOLLOW_POLL_S)
        with log.open("a") as out:
            out.write("d\n")
        await asyncio.sleep(3 * kubeletapi.FOLLOW_POLL_S)
        assert not reading.done()
        record.unlink()
        assert await asyncio.wait_for(reading, 60) == (200, "a\nb\nc\nd\n")
    finally:
        child.kill()
        await child.wait()
