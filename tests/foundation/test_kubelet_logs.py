"""`kubectl logs` on the local node, through the pod runtime's kubelet endpoint, and waits on
pods that fail as soon as a container cannot start."""

from __future__ import annotations

import ipaddress
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from strata.cluster import Cluster
from strata.cluster.cluster import read_state
from strata.cluster.podwait import PodStuck, wait_pod_ready
from tests.foundation.test_podruntime import container_status, local_pod, shell
from tests.foundation.waiting import WAIT_S, eventually

pytestmark = pytest.mark.cluster
LOCAL_NODE = "local-node-0"
# Counts its runs on a volume: the first run fails, the second stays up.
TWICE = (
    "n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; "
    'echo "run $n line 1"; echo "run $n line 2"; [ $n -ge 2 ] || exit 3; exec sleep 3600'
)


def _pod_with_runs(cluster: Cluster, namespace: str) -> None:
    volume = {"name": "data", "emptyDir": {}}
    container = shell("talker", TWICE, volumeMounts=[{"name": "data", "mountPath": "/data"}])
    cluster.apply(local_pod("talker", [container], volumes=[volume]), namespace)

    def second_run_up() -> bool:
        pod = wait_pod_ready(cluster, namespace, "talker", WAIT_S)
        return bool(container_status(pod, "talker")["restartCount"] >= 1)

    eventually(second_run_up, "talker's second run to be Ready")


def test_kubectl_logs_tail_and_previous_on_a_local_pod(cluster: Cluster, namespace: str) -> None:
    _pod_with_runs(cluster, namespace)

    def logs(*flags: str) -> str:
        return cluster.kubectl("logs", "talker", "-c", "talker", "-n", namespace, *flags).stdout

    assert logs() == "run 2 line 1\nrun 2 line 2\n"
    assert logs("--tail=1") == "run 2 line 2\n"
    assert logs("--previous") == "run 1 line 1\nrun 1 line 2\n"
    assert logs("--limit-bytes=5") == "run 2"
    stamped = logs("--timestamps", "--tail=1").split(" ", 1)
    assert stamped[1] == "run 2 line 2\n" and stamped[0].endswith("Z")


def _kubelet_url(cluster: Cluster, path: str) -> str:
    node = cluster.kubectl_json("get", "node", LOCAL_NODE)
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    assert port > 0
    return f"https://127.0.0.1:{port}{path}"


def _client(cluster: Cluster, cert: Path | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(cluster.ca_cert))
    if cert is not None:
        context.load_cert_chain(str(cert), str(cert.with_suffix(".key")))
    return context


def test_the_kubelet_endpoint_serves_only_the_apiservers_client_cert(cluster: Cluster) -> None:
    url = _kubelet_url(cluster, "/containerLogs/default/none/none")
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(url, timeout=WAIT_S, context=_client(cluster, None))
    admin = cluster.layout.pki / "clients" / "strata-admin.crt"  # signed by the CA, not the API server
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=WAIT_S, context=_client(cluster, admin))
    assert refused.value.code == 403
    apiserver = cluster.layout.pki / "kube-apiserver-kubelet-client.crt"
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(url, timeout=WAIT_S, context=_client(cluster, apiserver))
    assert missing.value.code == 404


def test_nodes_are_dialed_by_loopback_internal_ip(cluster: Cluster) -> None:
    for node in cluster.kubectl_json("get", "nodes")["items"]:
        internal = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
        assert internal and all(ipaddress.ip_address(a).is_loopback for a in internal), node["metadata"]
    pid = read_state(cluster.directory)["pids"]["kube-apiserver"]
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    preferred = next(a for a in argv if a.startswith("--kubelet-preferred-address-types="))
    assert preferred.split("=", 1)[1].split(",")[0] == "InternalIP"


def test_a_wait_on_a_pod_whose_command_is_missing_fails_naming_it(cluster: Cluster, namespace: str) -> None:
    missing = {"name": "engine", "image": "busybox", "command": ["no-such-command-xyz"]}
    cluster.apply(local_pod("missing", [missing]), namespace)
    with pytest.raises(PodStuck) as stuck:
        wait_pod_ready(cluster, namespace, "missing", WAIT_S)
    assert "container engine" in str(stuck.value)
    assert "no-such-command-xyz" in str(stuck.value)


def test_a_wait_on_a_pod_whose_init_container_fails_quotes_its_log(cluster: Cluster, namespace: str) -> None:
    init = shell("prepare", "echo 'cannot prepare: disk on fire'; exit 1")
    cluster.apply(local_pod("broken", [shell("main", "exec sleep 3600")], initContainers=[init]), namespace)
    with pytest.raises(PodStuck) as stuck:
        wait_pod_ready(cluster, namespace, "broken", WAIT_S)
    message = str(stuck.value)
    assert "container prepare" in message and "exit code 1" in message
    assert "cannot prepare: disk on fire" in message


def test_a_volume_over_the_checkouts_parent_hides_neither_its_code_nor_its_virtualenv(
    cluster: Cluster, namespace: str
) -> None:
    """A checkout under /tmp met a pod volume at /tmp; here the volume is at the parent directory
    of the checkout's virtualenv, wherever the checkout lives, which is the same case."""
    parent = str(Path(sys.prefix).resolve().parent.parent)
    script = "command -v strata && python -c \"import strata.cluster; print('imported')\""
    container = shell("c", script, volumeMounts=[{"name": "over", "mountPath": parent}])
    pod = local_pod("hidden", [container], restartPolicy="Never", volumes=[{"name": "over", "emptyDir": {}}])
    cluster.apply(pod, namespace)

    def finished() -> str | None:
        status = (cluster.kubectl_json("get", "pod", "hidden", "-n", namespace).get("status")) or {}
        return status.get("phase") if status.get("phase") in ("Succeeded", "Failed") else None

    phase = eventually(finished, "pod hidden to finish")
    log = cluster.container_log(namespace, "hidden", "c")
    assert phase == "Succeeded", log
    assert log.splitlines()[-1] == "imported"


def test_kubectl_logs_follow_ends_with_the_run(cluster: Cluster, namespace: str) -> None:
    """Whether ``kubectl logs -f`` starts while the run goes on (normally) or after it ended (a slow
    machine), it prints the whole run and returns."""
    script = "echo before; sleep 5; echo after"
    cluster.apply(local_pod("brief", [shell("c", script)], restartPolicy="Never"), namespace)
    eventually(lambda: cluster.container_log(namespace, "brief", "c"), "brief's first line")
    followed = cluster.kubectl("logs", "-f", "brief", "-c", "c", "-n", namespace).stdout
    assert followed == "before\nafter\n"
