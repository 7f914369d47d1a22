"""Just enough Kubernetes API for the router: read-only list and watch of Pods, over aiohttp.

Credentials: the pod's service account (token, ca.crt and namespace under
/var/run/secrets/kubernetes.io/serviceaccount/, the API server from KUBERNETES_SERVICE_HOST and
KUBERNETES_SERVICE_PORT), or a kubeconfig for local runs (its current context; token or client
certificate, files or inline data). The kubernetes client library is not needed: the router
only ever reads one kind.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
WATCH_TIMEOUT_S = 240  # the API server ends a watch after this; the router watches again

Obj = dict[str, Any]


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


@dataclass(frozen=True)
class Credentials:
    server: str
    ssl: ssl.SSLContext
    token: str | None
    namespace: str


def in_cluster(root: Path = SERVICE_ACCOUNT, env: Mapping[str, str] = os.environ) -> Credentials:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeError(0, "not in a cluster: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT unset")
    context = ssl.create_default_context(cafile=str(root / "ca.crt"))
    token = (root / "token").read_text().strip()
    namespace = (root / "namespace").read_text().strip()
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return Credentials(server, context, token, namespace)


def from_kubeconfig(path: str | Path) -> Credentials:
    config = yaml.safe_load(Path(path).read_text()) or {}
    try:
        name = config["current-context"]
        context = _named(config, "contexts", name)["context"]
        cluster = _named(config, "clusters", context["cluster"])["cluster"]
        user = _named(config, "users", context["user"])["user"]
    except (KeyError, TypeError) as exc:
        raise KubeError(0, f"{path}: incomplete kubeconfig ({exc})") from None
    ctx = ssl.create_default_context()
    if "certificate-authority-data" in cluster:
        ctx.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    elif "certificate-authority" in cluster:
        ctx.load_verify_locations(cafile=cluster["certificate-authority"])
    _client_cert(ctx, user)
    return Credentials(cluster["server"], ctx, user.get("token"), context.get("namespace", "default"))


def _named(config: Obj, section: str, name: str) -> Obj:
    for item in config.get(section) or []:
        if item.get("name") == name:
            found: Obj = item
            return found
    raise KeyError(f"{section}: no entry named {name!r}")


def _client_cert(ctx: ssl.SSLContext, user: Obj) -> None:
    if "client-certificate" in user:
        ctx.load_cert_chain(user["client-certificate"], user["client-key"])
    elif "client-certificate-data" in user:
        with tempfile.TemporaryDirectory() as tmp:  # ssl loads chains from files only
            cert, key = Path(tmp) / "c.pem", Path(tmp) / "k.pem"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            key.chmod(0o600)
            ctx.load_cert_chain(str(cert), str(key))


class PodReader:
    """List and watch the Pods of one namespace matching a label selector."""

    def __init__(self, creds: Credentials, namespace: str, selector: str) -> None:
        self.creds, self.namespace, self.selector = creds, namespace, selector
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json"}
            if self.creds.token:
                headers["Authorization"] = f"Bearer {self.creds.token}"
            connector = aiohttp.TCPConnector(ssl=self.creds.ssl)
            self._session = aiohttp.ClientSession(connector=connector, headers=headers)
        return self._session

    def _path(self) -> str:
        return f"{self.creds.server}/api/v1/namespaces/{self.namespace}/pods"

    async def list(self) -> tuple[list[Obj], str]:
        """The Pods and the list's resourceVersion (where a watch starts)."""
        timeout = aiohttp.ClientTimeout(total=30)
        params = {"labelSelector": self.selector}
        async with self._http().get(self._path(), params=params, timeout=timeout) as resp:
            body = await _json(resp)
        return list(body.get("items") or []), str(body.get("metadata", {}).get("resourceVersion", ""))

    async def watch(self, resource_version: str) -> AsyncIterator[Obj]:
        """Watch events ({type, object}) from ``resource_version`` until the server ends it."""
        params = {
            "labelSelector": self.selector,
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_TIMEOUT_S),
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=WATCH_TIMEOUT_S + 30)
        async with self._http().get(self._path(), params=params, timeout=timeout) as resp:
            if resp.status >= 400:
                await _json(resp)
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def _json(resp: aiohttp.ClientResponse) -> Obj:
    text = await resp.text()
    if resp.status >= 400:
        try:
            message = str(json.loads(text).get("message", text))
        except (ValueError, AttributeError):
            message = text[:300]
        raise KubeError(resp.status, message)
    body: Obj = json.loads(text)
    return body
