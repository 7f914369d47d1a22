"""The router's credentials: the pod's service account, or a kubeconfig (files or inline data)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from strata.cluster import certs, kubeconfig
from strata.router.kube import KubeError, from_kubeconfig, in_cluster


def test_in_cluster_reads_the_service_account_and_the_api_servers_address(tmp_path: Path):
    ca = certs.create_ca(tmp_path)
    (tmp_path / "ca.crt").write_bytes(ca.cert.read_bytes())
    (tmp_path / "token").write_text("tok\n")
    (tmp_path / "namespace").write_text("team-a")
    env = {"KUBERNETES_SERVICE_HOST": "127.96.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    creds = in_cluster(tmp_path, env)
    assert (creds.server, creds.token, creds.namespace) == ("https://127.96.0.1:6443", "tok", "team-a")
    with pytest.raises(KubeError, match="not in a cluster"):
        in_cluster(tmp_path, {})


def test_a_kubeconfig_with_certificate_files_or_inline_data(tmp_path: Path):
    ca = certs.create_ca(tmp_path)
    client = certs.issue_client_cert(ca, tmp_path, "alice", ())
    path = kubeconfig.write_cert_kubeconfig(
        tmp_path / "kc", "https://127.0.0.1:6443", ca.cert, client, "alice"
    )
    creds = from_kubeconfig(path)
    assert creds.server == "https://127.0.0.1:6443" and creds.token is None and creds.namespace == "default"
    config = yaml.safe_load(path.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    inline = {
        "certificate-authority-data": base64.b64encode(
            Path(cluster.pop("certificate-authority")).read_bytes()
        ).decode(),
        "server": cluster["server"],
    }
    config["clusters"][0]["cluster"] = inline
    config["users"][0]["user"] = {
        "client-certificate-data": base64.b64encode(Path(user["client-certificate"]).read_bytes()).decode(),
        "client-key-data": base64.b64encode(Path(user["client-key"]).read_bytes()).decode(),
    }
    path.write_text(yaml.safe_dump(config))
    assert from_kubeconfig(path).server == "https://127.0.0.1:6443"


def test_an_incomplete_kubeconfig_is_named(tmp_path: Path):
    path = tmp_path / "kc"
    path.write_text(yaml.safe_dump({"current-context": "nope", "contexts": []}))
    with pytest.raises(KubeError, match="incomplete kubeconfig"):
        from_kubeconfig(path)
