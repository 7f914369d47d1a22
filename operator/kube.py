"""A small async Kubernetes client: server-side apply, get, list, delete, status apply, and the
same by path (create, patch, delete, list-then-watch: ``kubewatch``) for the test cluster's pod
runtime, the one other user: one client for both.

The operator writes a handful of kinds, always the same way, so a table of kinds and aiohttp
(already kopf's transport) keep every call non-blocking without the generated client's threads.
Credentials come from the kubeconfig or the in-cluster service account, like kopf's own.

Every call is bounded and polite to a busy API server (strata.operator.backoff): at most
``max_in_flight`` requests at once, a timeout sized to the server's recent latency, and retries
with jittered back-off for timeouts, broken connections, 429 and 5xx. All the operator's calls
are idempotent (server-side apply, merge patches of whole values, gets, deletes by uid), so a
retry never does anything twice. An :class:`ApiObserver` sees every request and retry."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from strata.operator import names
from strata.operator.backoff import AdaptiveLimit, Backoff, LatencyTimeout, retry_after_s, retry_reason

Obj = dict[str, Any]
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML, so the body is plain JSON
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    namespaced: bool

    def base(self) -> str:
        return f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"


KINDS: dict[tuple[str, str], Kind] = {
    ("v1", "ConfigMap"): Kind("", "v1", "configmaps", True),
    ("v1", "Service"): Kind("", "v1", "services", True),
    ("v1", "PersistentVolumeClaim"): Kind("", "v1", "persistentvolumeclaims", True),
    ("v1", "Namespace"): Kind("", "v1", "namespaces", False),
    ("v1", "ServiceAccount"): Kind("", "v1", "serviceaccounts", True),
    ("rbac.authorization.k8s.io/v1", "Role"): Kind("rbac.authorization.k8s.io", "v1", "roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): Kind(
        "rbac.authorization.k8s.io", "v1", "rolebindings", True
    ),
    ("apps/v1", "Deployment"): Kind("apps", "v1", "deployments", True),
    ("apps/v1", "StatefulSet"): Kind("apps", "v1", "statefulsets", True),
    ("policy/v1", "PodDisruptionBudget"): Kind("policy", "v1", "poddisruptionbudgets", True),
    ("networking.k8s.io/v1", "NetworkPolicy"): Kind("networking.k8s.io", "v1", "networkpolicies", True),
    ("scheduling.k8s.io/v1", "PriorityClass"): Kind("scheduling.k8s.io", "v1", "priorityclasses", False),
    (names.API_VERSION, names.ISVC_KIND): Kind(names.GROUP, names.VERSION, names.ISVC_PLURAL, True),
    (names.API_VERSION, names.TIER_KIND): Kind(names.GROUP, names.VERSION, names.TIER_PLURAL, False),
}


class KubeError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def kind_of(api_version: str, kind: str) -> Kind:
    try:
        return KINDS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"the operator does not manage {kind} ({api_version})") from None


def object_path(api_version: str, kind: str, name: str | None, namespace: str | None = None) -> str:
    k = kind_of(api_version, kind)
    if k.namespaced and not namespace:
        raise ValueError(f"{kind} is namespaced: a namespace is required")
    prefix = f"{k.base()}/namespaces/{quote(namespace or '')}" if k.namespaced else k.base()
    return f"{prefix}/{k.plural}" + (f"/{quote(name)}" if name else "")


class ApiObserver(Protocol):
    """Told about every request the client sends (metrics, the benchmark)."""

    def request(self, verb: str, resource: str, code: str, seconds: float) -> None: ...
    def retry(self, reason: str) -> None: ...
    def throttled(self) -> None: ...
    def slot_wait(self, seconds: float) -> None: ...


class _Unobserved:
    def request(self, verb: str, resource: str, code: str, seconds: float) -> None:
        pass

    def retry(self, reason: str) -> None:
        pass

    def throttled(self) -> None:
        pass

    def slot_wait(self, seconds: float) -> None:
        pass


@dataclass(frozen=True)
class ClientPolicy:
    max_in_flight: int = 32
    timeout_floor_s: float = 10.0
    timeout_ceiling_s: float = 120.0
    retries: Backoff = field(default_factory=lambda: Backoff(first_s=0.25, max_s=8.0, attempts=6))


class _Retry(Exception):
    """One attempt failed in a way another attempt may not."""

    def __init__(self, reason: str, error: Exception, after_s: float = 0.0) -> None:
        super().__init__(reason)
        self.reason, self.error, self.after_s = reason, error, after_s


class KubeClient:
    def __init__(
        self,
        configuration: k8s_client.Configuration,
        field_manager: str = names.FIELD_MANAGER,
        policy: ClientPolicy | None = None,
    ):
        self._cfg = configuration
        self._field_manager = field_manager
        self._session: aiohttp.ClientSession | None = None
        self.policy = policy or ClientPolicy()
        self.observer: ApiObserver = _Unobserved()
        self.timeout = LatencyTimeout(self.policy.timeout_floor_s, self.policy.timeout_ceiling_s)
        self.flow = AdaptiveLimit(self.policy.max_in_flight)
        self._in_flight = 0
        self._room = asyncio.Condition()

    @classmethod
    def from_environment(
        cls, kubeconfig: str | None = None, policy: ClientPolicy | None = None
    ) -> KubeClient:
        """In-cluster credentials when running in a pod, else the kubeconfig (``$KUBECONFIG``)."""
        cfg = k8s_client.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=cfg, persist_config=False
            )
        return cls(cfg, policy=policy)

    @classmethod
    def from_kubeconfig(cls, path: str | Path, policy: ClientPolicy | None = None) -> KubeClient:
        """The kubeconfig's credentials only (a process beside the cluster, not in a pod)."""
        cfg = k8s_client.Configuration()
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(path), client_configuration=cfg, persist_config=False
        )
        return cls(cfg, policy=policy)

    @property
    def server(self) -> str:
        return str(self._cfg.host).rstrip("/")

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self._cfg.verify_ssl:
            return False
        context = ssl.create_default_context(cafile=self._cfg.ssl_ca_cert)
        if self._cfg.cert_file:
            context.load_cert_chain(self._cfg.cert_file, self._cfg.key_file)
        return context

    def _headers(self) -> dict[str, str]:
        token = self._cfg.get_api_key_with_prefix("authorization") or self._cfg.get_api_key_with_prefix(
            "BearerToken"
        )
        return {"Authorization": token} if token else {}

    async def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl(), limit=self.policy.max_in_flight)
            # No session-wide timeout: each attempt gets one sized to the current latency.
            self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(None))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        return (
            await self.request_with_code(method, path, params=params, body=body, content_type=content_type)
        )[1]

    async def request_with_code(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> tuple[int, Obj]:
        headers = {**self._headers(), "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        call = _Call(method, path, params, data, headers)
        backoff = self.policy.retries
        for attempt in range(backoff.attempts):
            try:
                return await self._attempt(call, attempt)
            except _Retry as retry:
                if attempt + 1 == backoff.attempts:
                    raise retry.error from None
                self.observer.retry(retry.reason)
                await asyncio.sleep(max(backoff.delay(attempt), retry.after_s))
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _attempt(self, call: _Call, attempt: int) -> tuple[int, Obj]:
        async with self._slot():
            started = time.monotonic()
            try:
                status, text, retry_after = await self._send(call, self.timeout.for_attempt(attempt))
            except _Retry:
                self.flow.overloaded(time.monotonic())
                raise
            elapsed = time.monotonic() - started
        verb, resource = describe(call.method, call.path)
        self.observer.request(verb, resource, str(status), elapsed)
        if status < 500:
            self.timeout.observe(elapsed)
        reason = retry_reason(status)
        if reason is None:
            self.flow.answered()
        else:
            self.flow.overloaded(time.monotonic())
        if status >= 400:
            error = _error(status, text)
            if reason is not None:
                raise _Retry(reason, error, retry_after_s(retry_after, self.policy.retries.max_s))
            raise error
        parsed: Obj = json.loads(text) if text else {}
        return status, parsed

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        """One of the requests allowed in flight now (strata.operator.backoff.AdaptiveLimit)."""
        asked = time.monotonic()
        async with self._room:
            if self._in_flight >= self.flow.limit:
                self.observer.throttled()
            await self._room.wait_for(lambda: self._in_flight < self.flow.limit)
            self._in_flight += 1
        self.observer.slot_wait(time.monotonic() - asked)
        try:
            yield
        finally:
            async with self._room:
                self._in_flight -= 1
                self._room.notify(max(0, self.flow.limit - self._in_flight))

    async def _send(self, call: _Call, limit: float) -> tuple[int, str, str | None]:
        session = await self._http()
        url = self._cfg.host.rstrip("/") + call.path
        verb, resource = describe(call.method, call.path)
        try:
            async with asyncio.timeout(limit):
                async with session.request(
                    call.method, url, params=call.params, data=call.data, headers=call.headers
                ) as resp:
                    return resp.status, await resp.text(), resp.headers.get("Retry-After")
        except TimeoutError:
            self.observer.request(verb, resource, "timeout", limit)
            self.timeout.observe(limit)
            raise _Retry(
                "timeout", TimeoutError(f"{call.method} {call.path}: no answer in {limit:.0f}s")
            ) from None
        except aiohttp.ClientConnectionError as exc:
            self.observer.request(verb, resource, "connection", 0.0)
            raise _Retry("connection", exc) from None

    @contextlib.asynccontextmanager
    async def stream(self, path: str, params: Mapping[str, str], read_timeout_s: float) -> AsyncIterator[Any]:
        """A long-lived GET (a watch): its response, read line by line; no attempt timeout, no
        retry (the caller lists again), each read within ``read_timeout_s``."""
        timeout = aiohttp.ClientTimeout(total=None, sock_read=read_timeout_s)
        session = await self._http()
        async with session.get(
            self.server + path, params=params, headers=self._headers(), timeout=timeout
        ) as response:
            if response.status >= 400:
                raise _error(response.status, await response.text())
            yield response.content

    async def read_path(self, path: str, params: Mapping[str, str] | None = None) -> Obj | None:
        """The object at ``path``, or None when there is none."""
        try:
            return await self.request("GET", path, params=params)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def create_path(self, path: str, body: Mapping[str, Any]) -> Obj:
        return await self.request("POST", path, body=body)

    async def patch_path(self, path: str, body: Mapping[str, Any], content_type: str = MERGE_PATCH) -> Obj:
        return await self.request("PATCH", path, body=body, content_type=content_type)

    async def delete_path(self, path: str, body: Mapping[str, Any] | None = None) -> bool:
        """Delete the object at ``path``; False when it was gone (or another object by now: a
        precondition's uid)."""
        try:
            await self.request("DELETE", path, body=body)
        except KubeError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def apply(self, manifest: Mapping[str, Any], *, subresource: str = "") -> Obj:
        return (await self.apply_created(manifest, subresource=subresource))[0]

    async def apply_created(self, manifest: Mapping[str, Any], *, subresource: str = "") -> tuple[Obj, bool]:
        """Server-side apply under the operator's one field manager; force takes over fields that
        a person edited by hand, which is exactly how drift is repaired. True when it created."""
        meta = manifest["metadata"]
        path = object_path(manifest["apiVersion"], manifest["kind"], meta["name"], meta.get("namespace"))
        params = {"fieldManager": self._field_manager, "force": "true"}
        code, obj = await self.request_with_code(
            "PATCH",
            path + (f"/{subresource}" if subresource else ""),
            params=params,
            body=manifest,
            content_type=APPLY_PATCH,
        )
        return obj, code == 201

    async def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return await self.request("GET", object_path(api_version, kind, name, namespace))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(
        self, api_version: str, kind: str, namespace: str | None = None, label_selector: str = ""
    ) -> list[Obj]:
        k = kind_of(api_version, kind)
        path = object_path(api_version, kind, None, namespace) if namespace else f"{k.base()}/{k.plural}"
        params = {"labelSelector": label_selector} if label_selector else None
        items: list[Obj] = (await self.request("GET", path, params=params)).get("items", [])
        return items

    async def delete(
        self, api_version: str, kind: str, name: str, namespace: str | None = None, uid: str | None = None
    ) -> bool:
        """Delete one object (only the incarnation with ``uid`` when given); False if it was gone."""
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", object_path(api_version, kind, name, namespace), body=body)
        except KubeError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    params: Mapping[str, str] | None
    data: str | None
    headers: dict[str, str]


def describe(method: str, path: str) -> tuple[str, str]:
    """(verb, resource) of a request path, as the API server's own metrics name them: ``get``
    or ``list``, ``patch`` ...; ``pods``, ``inferenceservices/status`` ..."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]  # after /api/v1 or /apis/group/version
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        rest = rest[2:]  # a namespaced path; /namespaces/<name> itself is the namespace
    plural, named = (rest[0] if rest else ""), len(rest) > 1
    resource = plural + (f"/{rest[2]}" if len(rest) > 2 else "")
    verbs = {"GET": "get" if named else "list", "POST": "create", "PATCH": "patch", "DELETE": "delete"}
    return verbs.get(method, method.lower()), resource


def _error(status: int, text: str) -> KubeError:
    try:
        body = json.loads(text)
        return KubeError(status, str(body.get("reason", "")), str(body.get("message", text)))
    except (json.JSONDecodeError, AttributeError):
        return KubeError(status, "", text[:500])
