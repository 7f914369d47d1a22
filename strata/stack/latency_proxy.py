"""A deliberately slow API server: a TCP proxy on loopback that delays what clients send.

Every chunk a client sends waits ``latency_s`` (plus up to ``jitter_s``) before it is passed on,
and every ``stall_every``-th chunk waits ``stall_s`` instead: requests answered slowly, a few
very slowly, as a busy API server answers them. What the server sends back (watch events
included) is not delayed. TLS passes through untouched: the proxy listens on 127.0.0.1, an
address the test control plane's serving certificate names."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CHUNK = 65536


@dataclass
class LatencyProxy:
    upstream_port: int
    latency_s: float = 0.2
    jitter_s: float = 0.1
    stall_s: float = 0.0
    stall_every: int = 0  # 0: no stalls
    seed: int = 0
    chunks: int = 0
    stalls: int = 0
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)
    _random: random.Random = field(default_factory=random.Random)
    _stop: asyncio.Event | None = None

    def start(self) -> LatencyProxy:
        self._random.seed(self.seed)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._serve()), daemon=True, name="latency-proxy"
        )
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the latency proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)

    def kubeconfig(self, original: Path, out: Path) -> Path:
        """A copy of ``original`` that reaches the API server through this proxy."""
        config: dict[str, Any] = yaml.safe_load(original.read_text())
        for entry in config["clusters"]:
            entry["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        out.write_text(yaml.safe_dump(config, sort_keys=False))
        out.chmod(0o600)
        return out

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(
            self._pipe(client_r, server_w, delayed=True), self._pipe(server_r, client_w, delayed=False)
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delayed: bool) -> None:
        try:
            while chunk := await reader.read(CHUNK):
                if delayed:
                    await asyncio.sleep(self._delay())
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                writer.close()

    def _delay(self) -> float:
        self.chunks += 1
        if self.stall_every and self.chunks % self.stall_every == 0:
            self.stalls += 1
            return self.stall_s
        return self.latency_s + self._random.random() * self.jitter_s
