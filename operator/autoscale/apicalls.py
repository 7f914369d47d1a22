"""The autoscaler's calls to the API server: whether this replica is the active peer, and its
merge patches (a service's status and scale, a ServiceTier's status.usage), under a field
manager of its own so that the reconciler's server-side apply of status never owns, and so
drops, the fields written here."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp

from strata.operator import names
from strata.operator.autoscale.cost import Usage, merge_usage
from strata.operator.autoscale.peering import is_active
from strata.operator.autoscale.pods import MERGE_PATCH
from strata.operator.kube import KubeClient, KubeError, Obj, object_path

log = logging.getLogger(__name__)
FIELD_MANAGER = "strata-autoscaler"
API_ERRORS = (KubeError, aiohttp.ClientError, TimeoutError)


@dataclass(frozen=True)
class Peering:
    """Where this replica's peering lives; None name: standalone, always active."""

    name: str | None
    priority: int


@dataclass
class ApiCalls:
    kube: KubeClient

    async def active(self, peering: Peering) -> bool:
        if peering.name is None:
            return True
        try:
            listed = await self.kube.request(
                "GET",
                "/apis/kopf.dev/v1/clusterkopfpeerings",
                params={"fieldSelector": f"metadata.name={peering.name}"},
            )
        except API_ERRORS as exc:
            log.warning("autoscaler: cannot read peering %s: %s", peering.name, exc)
            return False
        found: list[Obj] = listed.get("items", [])
        peers = (found[0].get("status") or {}) if found else {}
        return is_active(peers, peering.priority, datetime.now(UTC))

    async def add_usage(self, tier: Mapping[str, Any], added: Mapping[str, Usage]) -> bool:
        """False when the tier changed since the cache's copy (409 Conflict): nothing written."""
        meta = tier["metadata"]
        merged = merge_usage((tier.get("status") or {}).get("usage"), added, rfc3339(datetime.now(UTC)))
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": {"usage": merged}}
        path = object_path(names.API_VERSION, names.TIER_KIND, meta["name"])
        try:
            await self.patch(f"{path}/status", body)
        except KubeError as exc:
            if exc.status == 409:
                log.info("autoscaler: ServiceTier %s changed since read; its usage waits", meta["name"])
                return False
            raise
        return True

    async def patch_status(self, isvc: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        await self.merge_patch(isvc, "status", {"status": status})

    async def merge_patch(self, isvc: Mapping[str, Any], subresource: str, body: Mapping[str, Any]) -> None:
        """A merge patch of one of the service's subresources under the autoscaler's own manager."""
        meta = isvc["metadata"]
        path = object_path(names.API_VERSION, names.ISVC_KIND, meta["name"], meta["namespace"])
        await self.patch(f"{path}/{subresource}", body)

    async def patch(self, path: str, body: Mapping[str, Any]) -> None:
        """A merge patch under the autoscaler's own field manager."""
        await self.kube.request(
            "PATCH", path, params={"fieldManager": FIELD_MANAGER}, body=body, content_type=MERGE_PATCH
        )


def rfc3339(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
