"""Writes kubeconfig files: one per identity (admin, each component, test users, ServiceAccounts).

A separate file per identity, rather than contexts in one file, so a test can hand exactly one
identity to a subprocess (``kubectl --kubeconfig``, the operator under test) with no way to
fall back to admin.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from strata.cluster.certs import CertPair


def _kubeconfig(server: str, ca_cert: Path, user: dict[str, str], name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "strata", "cluster": {"server": server, "certificate-authority": str(ca_cert)}}
        ],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": "strata", "user": name}}],
        "current-context": name,
    }


def _write(path: Path, config: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def write_cert_kubeconfig(path: Path, server: str, ca_cert: Path, client: CertPair, name: str) -> Path:
    user = {"client-certificate": str(client.cert), "client-key": str(client.key)}
    return _write(path, _kubeconfig(server, ca_cert, user, name))


def write_token_kubeconfig(path: Path, server: str, ca_cert: Path, token: str, name: str) -> Path:
    return _write(path, _kubeconfig(server, ca_cert, {"token": token}, name))
