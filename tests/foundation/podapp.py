"""The small app the pod runtime's tests run in their pods (``python -m tests.foundation.podapp``).

It serves, on ``$POD_IP:$PORT``, a JSON report of what the container sees (hostname, selected
environment variables, files, the size of a mount, who the API server says its token belongs
to), and on SIGTERM logs it and exits after ``$TERM_DELAY_S`` seconds (or never, when negative),
answering 503 meanwhile when ``$TERM_UNHEALTHY`` is set (as a draining worker fails its probes).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
SHOWN_ENV = ("POD_IP", "POD_NAME", "POD_NAMESPACE", "GREETING", "HOSTNAME", "KUBERNETES_SERVICE_HOST")


def who_am_i() -> dict[str, Any]:
    """SelfSubjectReview with the mounted token: the identity (and pod) the API server sees."""
    token = _read(f"{ACCOUNT}/token")
    if token is None:
        return {"error": "no token"}
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode()
    request = urllib.request.Request(
        f"https://{host}:{port}/apis/authentication.k8s.io/v1/selfsubjectreviews",
        data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    context = ssl.create_default_context(cafile=f"{ACCOUNT}/ca.crt")
    with urllib.request.urlopen(request, context=context, timeout=120) as reply:
        return dict(json.load(reply)["status"]["userInfo"])


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def root_writable() -> bool:
    try:
        with open("/strata-podapp-probe", "w"):
            pass
    except OSError:
        return False
    os.unlink("/strata-podapp-probe")
    return True


def report() -> dict[str, Any]:
    files = os.environ.get("SHOW_FILES", "").split(",")
    sized = os.environ.get("SHOW_SIZE", "")
    stat = os.statvfs(sized) if sized else None
    return {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "env": {name: os.environ.get(name) for name in SHOWN_ENV},
        "files": {path: _read(path) for path in files if path},
        "size_bytes": stat.f_blocks * stat.f_frsize if stat else None,
        "root_writable": root_writable(),
        "identity": who_am_i() if os.path.isdir(ACCOUNT) else None,
    }


DRAINING = threading.Event()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(report()).encode()
        self.send_response(503 if DRAINING.is_set() and os.environ.get("TERM_UNHEALTHY") else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def on_term(signum: int, frame: FrameType | None) -> None:
    delay = float(os.environ.get("TERM_DELAY_S", "0"))
    print(f"podapp: got SIGTERM, exiting in {delay}s", flush=True)
    DRAINING.set()
    if delay >= 0:
        threading.Timer(delay, exit_now).start()


def exit_now() -> None:
    print("podapp: exiting", flush=True)
    os._exit(0)


def main() -> int:
    signal.signal(signal.SIGTERM, on_term)
    server = ThreadingHTTPServer((os.environ["POD_IP"], int(os.environ.get("PORT", "8080"))), Handler)
    print(f"podapp: serving on {server.server_address} at {time.time():.3f}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
