"""`strata operator ready`, what the chart's helm test runs: 200 passes, anything else fails."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from strata.operator.cli import main


@contextmanager
def serving(status: int) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/healthz"
    finally:
        server.shutdown()
        server.server_close()


def test_a_live_operator_passes(capsys: pytest.CaptureFixture[str]) -> None:
    with serving(200) as url:
        assert main(["ready", "--url", url, "--timeout", "5"]) == 0
    assert "answered 200" in capsys.readouterr().out


def test_an_unhealthy_or_absent_operator_fails_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with serving(503) as url:
        assert main(["ready", "--url", url, "--timeout", "0"]) == 1
    assert "HTTP 503" in capsys.readouterr().err
    assert main(["ready", "--url", "http://127.0.0.1:9/healthz", "--timeout", "0"]) == 1
    assert "not ready after 0 s" in capsys.readouterr().err
