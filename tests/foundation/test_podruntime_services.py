"""The local pod runtime's Services, without a cluster: the kubelet's Service environment
variables, endpoint selection, and the userspace proxy forwarding real TCP connections."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes import client as k8s_client

from strata.cluster.podruntime import endpoints, services
from strata.cluster.podruntime import env as envs
from strata.cluster.podruntime.endpoints import PodEndpoint
from strata.cluster.podruntime.proxy import ServiceProxy
from strata.cluster.podruntime.spec import parse_pod
from strata.operator.kube import KubeClient


def service(
    name: str,
    ip: str = "127.96.3.4",
    ports: list[dict[str, Any]] | None = None,
    namespace: str = "ns",
    selector: dict[str, str] | None = None,
) -> services.Service:
    default = [{"name": "http", "port": 80, "targetPort": "web"}]
    spec: dict[str, Any] = {
        "clusterIP": ip,
        "selector": {"app": "a"} if selector is None else selector,
        "ports": default if ports is None else ports,
    }
    return services.parse_service({"metadata": {"name": name, "namespace": namespace}, "spec": spec})


def test_service_env_names_hosts_ports_and_docker_links_as_the_kubelet_does() -> None:
    ports = [
        {"name": "metrics", "port": 9090, "targetPort": "metrics"},
        {"name": "liveness-http", "port": 8080},
    ]
    env = services.service_env([service("strata-metrics", ports=ports)], "ns")
    assert env == {
        "STRATA_METRICS_SERVICE_HOST": "127.96.3.4",
        "STRATA_METRICS_SERVICE_PORT": "9090",
        "STRATA_METRICS_SERVICE_PORT_METRICS": "9090",
        "STRATA_METRICS_SERVICE_PORT_LIVENESS_HTTP": "8080",
        "STRATA_METRICS_PORT": "tcp://127.96.3.4:9090",
        "STRATA_METRICS_PORT_9090_TCP": "tcp://127.96.3.4:9090",
        "STRATA_METRICS_PORT_9090_TCP_PROTO": "tcp",
        "STRATA_METRICS_PORT_9090_TCP_PORT": "9090",
        "STRATA_METRICS_PORT_9090_TCP_ADDR": "127.96.3.4",
        "STRATA_METRICS_PORT_8080_TCP": "tcp://127.96.3.4:8080",
        "STRATA_METRICS_PORT_8080_TCP_PROTO": "tcp",
        "STRATA_METRICS_PORT_8080_TCP_PORT": "8080",
        "STRATA_METRICS_PORT_8080_TCP_ADDR": "127.96.3.4",
    }


def test_service_env_skips_other_namespaces_headless_and_the_master_service() -> None:
    listed = [
        service("other", namespace="elsewhere"),
        service("headless", ip="None"),
        service("kubernetes", ip="127.96.0.1", namespace="default"),
        service("web", ports=[{"port": 80}]),
    ]
    assert services.service_env(listed, "ns") == {
        "WEB_SERVICE_HOST": "127.96.3.4",
        "WEB_SERVICE_PORT": "80",
        "WEB_PORT": "tcp://127.96.3.4:80",
        "WEB_PORT_80_TCP": "tcp://127.96.3.4:80",
        "WEB_PORT_80_TCP_PROTO": "tcp",
        "WEB_PORT_80_TCP_PORT": "80",
        "WEB_PORT_80_TCP_ADDR": "127.96.3.4",
    }
    assert "KUBERNETES_SERVICE_HOST" not in services.service_env(listed, "default")


def test_service_env_is_expanded_in_args_and_the_containers_own_variables_win() -> None:
    pod = parse_pod(
        {
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "command": ["curl"],
                        "args": ["http://$(WEB_SERVICE_HOST):$(WEB_SERVICE_PORT_HTTP)/"],
                        "env": [{"name": "WEB_SERVICE_PORT", "value": "mine"}],
                    }
                ]
            },
        }
    )
    (container,) = pod.spec.containers
    base = services.service_env([service("web")], "ns")
    env = envs.container_env(container, envs.PodFacts(pod, "127.64.1.2", "127.0.0.1"), {}, base)
    assert env["WEB_SERVICE_PORT"] == "mine"
    assert envs.command_line(container, env) == ["curl", "http://127.96.3.4:80/"]
    assert pod.spec.enable_service_links is True


def endpoint(ip: str, ready: bool = True, **changes: Any) -> PodEndpoint:
    fields: dict[str, Any] = {
        "namespace": "ns",
        "labels": {"app": "a", "extra": "x"},
        "ip": ip,
        "ready": ready,
        "terminating": False,
        "ports": {"web": 8000},
    }
    return PodEndpoint(**{**fields, **changes})


def test_endpoints_are_the_ready_selected_pods_at_their_named_or_numbered_target_port() -> None:
    pods = [
        endpoint("127.64.1.3"),
        endpoint("127.64.1.2", ports={"web": 8001}),
        endpoint("127.64.1.4", ready=False),
        endpoint("127.64.1.5", terminating=True),
        endpoint("127.64.1.6", labels={"app": "b"}),
        endpoint("127.64.1.7", namespace="elsewhere"),
        endpoint("127.64.1.8", ports={}),  # no port of that name: left out
    ]
    assert endpoints.endpoints(service("s"), 80, pods) == [("127.64.1.2", 8001), ("127.64.1.3", 8000)]
    numbered = service("s", ports=[{"port": 81, "targetPort": 9000}, {"port": 82}])
    assert endpoints.endpoints(numbered, 81, pods[:1]) == [("127.64.1.3", 9000)]
    assert endpoints.endpoints(numbered, 82, pods[:1]) == [("127.64.1.3", 82)]
    assert endpoints.endpoints(numbered, 83, pods[:1]) == []
    assert endpoints.endpoints(service("s", selector={}), 80, pods) == []
    # Never beyond this machine: a pod IP outside loopback is refused, never connected to.
    outside = endpoints.endpoints(service("s"), 80, [endpoint("203.0.113.3"), *pods[:1]])
    assert endpoints.split_loopback(outside) == ([("127.64.1.3", 8000)], [("203.0.113.3", 8000)])


def test_pick_goes_round_robin_with_the_others_as_fallbacks() -> None:
    found = [("127.64.1.2", 1), ("127.64.1.3", 1), ("127.64.1.4", 1)]
    firsts = [endpoints.pick(found, turn)[0] for turn in range(4)]
    assert firsts == [found[0], found[1], found[2], found[0]]
    assert endpoints.pick(found, 1) == [found[1], found[2], found[0]]
    assert endpoints.pick([], 5) == []


def test_listeners_only_for_loopback_cluster_ips_of_the_service_range_and_tcp_ports() -> None:
    ports: list[dict[str, Any]] = [{"port": 80}, {"port": 53, "protocol": "UDP"}]
    wanted, refused = endpoints.listeners(service("s", ports=ports), "127.96.0.0/16")
    assert wanted == [endpoints.Listener("ns", "s", "127.96.3.4", 80)] and refused is None
    for ip in ("203.0.113.10", "127.97.0.1"):
        wanted, refused = endpoints.listeners(service("s", ip=ip), "127.96.0.0/16")
        assert wanted == [] and refused is not None and ip in refused
    assert endpoints.listeners(service("s", ip="None"), "127.96.0.0/16") == ([], None)
    assert not endpoints.is_loopback("203.0.113.1") and endpoints.is_loopback("127.64.0.9")


# -- the proxy, forwarding real connections (no API server: the Service is given directly) ------
async def _echo_name(name: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    request = await reader.readline()
    writer.write(name + b" " + request)
    await writer.drain()
    writer.close()


async def _ask(ip: str, port: int) -> bytes:
    reader, writer = await asyncio.open_connection(ip, port)
    writer.write(b"hello\n")
    await writer.drain()
    try:
        answer = await asyncio.wait_for(reader.read(), 60)
    except ConnectionResetError:  # closed unread, with our request in its buffer
        answer = b""
    writer.close()
    return answer


async def _proxy_round_trip() -> tuple[list[bytes], bytes]:
    rng = random.Random()
    base = f"127.{rng.randint(200, 250)}.{rng.randint(1, 250)}"
    backends = [
        await asyncio.start_server(functools.partial(_echo_name, n), f"{base}.{i + 2}", 0)
        for i, n in enumerate((b"one", b"two"))
    ]
    pods = [
        endpoint(f"{base}.{i + 2}", ports={"web": s.sockets[0].getsockname()[1]})
        for i, s in enumerate(backends)
    ]
    ready = {"now": True}
    proxy = ServiceProxy(
        KubeClient(k8s_client.Configuration(host="https://127.0.0.1:1")),  # never called here
        f"{base}.0/24",
        lambda: [p if ready["now"] else endpoint(p.ip, ready=False) for p in pods],
        connect_deadline_s=0.3,
    )
    svc = service("s", ip=f"{base}.1", ports=[{"port": rng.randint(20000, 60000), "targetPort": "web"}])
    proxy.services[svc.key] = svc
    await proxy._sync(svc.key)
    port = svc.spec.ports[0].port
    answers = [await _ask(f"{base}.1", port) for _ in range(4)]
    ready["now"] = False
    closed = await _ask(f"{base}.1", port)
    await proxy.close()
    for backend in backends:
        backend.close()
    return answers, closed


def test_the_proxy_forwards_round_robin_and_closes_when_no_pod_is_ready_by_its_deadline() -> None:
    answers, closed = asyncio.run(_proxy_round_trip())
    assert answers == [b"one hello\n", b"two hello\n", b"one hello\n", b"two hello\n"]
    assert closed == b""


async def _late_pod_round_trip() -> list[bytes]:
    """A pod that refuses connections for a moment (restarting, its accept queue full): the
    proxy keeps the client's connection and hands it over once the pod listens."""
    rng = random.Random()
    base = f"127.{rng.randint(200, 250)}.{rng.randint(1, 250)}"
    probe = await asyncio.start_server(functools.partial(_echo_name, b"late"), f"{base}.2", 0)
    pod_port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()  # nothing listens there now: connections are refused
    pod = endpoint(f"{base}.2", ports={"web": pod_port})
    proxy = ServiceProxy(
        KubeClient(k8s_client.Configuration(host="https://127.0.0.1:1")), f"{base}.0/24", lambda: [pod]
    )
    svc = service("s", ip=f"{base}.1", ports=[{"port": rng.randint(20000, 60000), "targetPort": "web"}])
    proxy.services[svc.key] = svc
    await proxy._sync(svc.key)
    asks = [asyncio.create_task(_ask(f"{base}.1", svc.spec.ports[0].port)) for _ in range(20)]
    await asyncio.sleep(0.5)
    late = await asyncio.start_server(functools.partial(_echo_name, b"late"), f"{base}.2", pod_port)
    answers = await asyncio.gather(*asks)
    await proxy.close()
    late.close()
    return answers


def test_the_proxy_holds_a_connection_until_a_refusing_pod_takes_it() -> None:
    assert asyncio.run(_late_pod_round_trip()) == [b"late hello\n"] * 20


def test_the_proxy_pauses_between_rounds_growing_to_a_second() -> None:
    from strata.cluster.podruntime.proxy import retry_pause_s

    pauses = [retry_pause_s(n) for n in range(8)]
    assert pauses[:3] == [0.05, 0.1, 0.2] and pauses[-1] == 1.0
    assert pauses == sorted(pauses) and retry_pause_s(10_000) == 1.0


@pytest.mark.parametrize("cidr", ["203.0.113.0/24", "127.96.0.0/33"])
def test_the_runtime_refuses_a_service_range_outside_loopback(cidr: str) -> None:
    from strata.cluster.podruntime.main import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--kubeconfig=k", "--root=r", "--logs=l", f"--service-cidr={cidr}"])


async def _answer_nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readline()  # takes the request, then dies without a word (a router killed)
    writer.transport.abort()


async def _half_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readline()
    writer.write(b"par")
    await writer.drain()
    writer.transport.abort()


async def _resent_round_trip(first: Callable[..., Awaitable[None]]) -> list[bytes]:
    """Two pods, the first of which fails as ``first`` does; four connections, each starting
    at the next pod in turn."""
    rng = random.Random()
    base = f"127.{rng.randint(200, 250)}.{rng.randint(1, 250)}"
    handlers: list[Callable[..., Awaitable[None]]] = [first, functools.partial(_echo_name, b"two")]
    backends = [await asyncio.start_server(h, f"{base}.{i + 2}", 0) for i, h in enumerate(handlers)]
    pods = [
        endpoint(f"{base}.{i + 2}", ports={"web": s.sockets[0].getsockname()[1]})
        for i, s in enumerate(backends)
    ]
    proxy = ServiceProxy(
        KubeClient(k8s_client.Configuration(host="https://127.0.0.1:1")), f"{base}.0/24", lambda: pods
    )
    svc = service("s", ip=f"{base}.1", ports=[{"port": rng.randint(20000, 60000), "targetPort": "web"}])
    proxy.services[svc.key] = svc
    await proxy._sync(svc.key)
    answers = [await _ask(f"{base}.1", svc.spec.ports[0].port) for _ in range(4)]
    await proxy.close()
    for backend in backends:
        backend.close()
    return answers


def test_a_request_a_pod_closed_unanswered_goes_to_another_pod() -> None:
    assert asyncio.run(_resent_round_trip(_answer_nothing)) == [b"two hello\n"] * 4


def test_a_reply_cut_short_is_not_sent_again() -> None:
    answers = asyncio.run(_resent_round_trip(_half_answer))
    assert sorted(answers) == [b"par", b"par", b"two hello\n", b"two hello\n"]


def test_the_exchange_keeps_the_request_until_an_answer_and_only_so_much() -> None:
    from strata.cluster.podruntime.proxy import REPLAY_LIMIT, Exchange

    exchange = Exchange()
    exchange.from_client(b"POST /v1 ")
    assert exchange.resendable and bytes(exchange.sent) == b"POST /v1 "
    exchange.from_pod()
    exchange.from_client(b"more")
    assert not exchange.resendable and not exchange.sent
    big = Exchange()
    big.from_client(b"x" * (REPLAY_LIMIT + 1))
    assert not big.resendable and not big.sent
    gone = Exchange(client_gone=True)
    assert not gone.resendable
