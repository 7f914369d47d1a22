"""``strata crds apply``: server-side apply this version's CRDs to the cluster.

The chart's pre-upgrade hook Job runs it (Helm never upgrades crds/). The CRDs come from the
same models as the chart's crds/ (``strata crds check`` keeps them equal), so the image applies
exactly what its chart version ships. Force takes over fields Helm or kubectl wrote at install."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from strata.operator.api.generate import crds
from strata.operator.kube import APPLY_PATCH, KubeClient

FIELD_MANAGER = "strata-crds"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


async def apply_crds(kube: KubeClient, manifests: Iterable[dict[str, Any]]) -> list[str]:
    """Apply each CRD; returns 'name: created|configured' lines."""
    done: list[str] = []
    for crd in manifests:
        name = crd["metadata"]["name"]
        code, _ = await kube.request_with_code(
            "PATCH",
            f"{CRD_PATH}/{name}",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            body=crd,
            content_type=APPLY_PATCH,
        )
        done.append(f"{name}: {'created' if code == 201 else 'configured'}")
    return done


async def run(kubeconfig: str | None) -> list[str]:
    kube = KubeClient.from_environment(kubeconfig)
    try:
        return await apply_crds(kube, crds())
    finally:
        await kube.close()


def main(kubeconfig: str | None) -> int:
    for line in asyncio.run(run(kubeconfig)):
        print(line)
    return 0
