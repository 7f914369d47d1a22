"""The tenant rule: one cache namespace per Kubernetes namespace incarnation.

Every KV block key is chained from ``root_hash(cache_namespace, model, block_size)``, so two
workers share cached blocks only when their cache namespaces are equal. The tenant boundary is
the Kubernetes namespace, and the salt is its name *and* its UID:

- all services of one namespace share a salt, so a tenant's services (and their re-created
  versions) reuse each other's blocks of the same model, in every tier, shared included;
- two namespaces never share one, because names are unique at any one time;
- a namespace deleted and re-created under the same name (perhaps for another team) gets a new
  UID, so it can never hit blocks the old tenant left on NVMe or shared storage."""

from __future__ import annotations

import re
from collections.abc import Mapping

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_UID = re.compile(r"^[0-9a-fA-F-]{8,64}$")


def cache_namespace(namespace: str, namespace_uid: str) -> str:
    """``<namespace>.<uid>``: a dot cannot occur in a namespace name, so the split is unambiguous."""
    if not _NAMESPACE.match(namespace):
        raise ValueError(f"namespace {namespace!r} is not a DNS label")
    if not _UID.match(namespace_uid):
        raise ValueError(f"namespace uid {namespace_uid!r} is not a Kubernetes UID")
    return f"{namespace}.{namespace_uid.lower()}"


# The Pod Security admission label of a namespace, and the levels that refuse hostPath volumes.
POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
NO_HOST_PATH_LEVELS = ("baseline", "restricted")


def host_path_allowed(labels: Mapping[str, str]) -> bool:
    """Whether pods of a namespace labelled ``labels`` may mount a hostPath volume: not where
    Pod Security admission enforces ``baseline`` or ``restricted``."""
    return labels.get(POD_SECURITY_ENFORCE, "privileged") not in NO_HOST_PATH_LEVELS
