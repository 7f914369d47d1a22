"""A container's environment and command line, resolved as the kubelet resolves them (pure).

``envFrom`` first, then ``env`` in order, each value expanded against the variables defined
before it; downward-API ``fieldRef`` and ``resourceFieldRef``; ConfigMap and Secret keys; then
``$(VAR)`` expansion of command and args against the result (``$$`` escapes a ``$``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from strata.cluster.podruntime.spec import Container, EnvVar, Pod, ResourceFieldRef


class ContainerConfigError(ValueError):
    """The container cannot be created as specified (the kubelet's CreateContainerConfigError)."""


@dataclass(frozen=True)
class PodFacts:
    """What the downward API can expose about a running pod."""

    pod: Pod
    pod_ip: str
    host_ip: str
    node_allocatable: Mapping[str, str] = field(default_factory=dict)


# name -> data, for the ConfigMaps and Secrets the container refers to (None: does not exist)
Sources = Mapping[str, Mapping[str, str] | None]


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: unknown references stay as written, ``$$`` is ``$``."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and (end := text.find(")", i + 2)) != -1:
            name = text[i + 2 : end]
            out.append(variables.get(name, text[i : end + 1]))
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def field_value(path: str, facts: PodFacts) -> str:
    meta = facts.pod.metadata
    simple = {
        "metadata.name": meta.name,
        "metadata.namespace": meta.namespace,
        "metadata.uid": meta.uid,
        "spec.nodeName": facts.pod.spec.node_name,
        "spec.serviceAccountName": facts.pod.spec.service_account_name,
        "status.podIP": facts.pod_ip,
        "status.podIPs": facts.pod_ip,
        "status.hostIP": facts.host_ip,
        "status.hostIPs": facts.host_ip,
    }
    if path in simple:
        return simple[path]
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if match:
        table = meta.labels if match[1] == "labels" else meta.annotations
        return table.get(match[2], "")
    if path in ("metadata.labels", "metadata.annotations"):
        table = meta.labels if path == "metadata.labels" else meta.annotations
        return "\n".join(f'{k}="{v}"' for k, v in sorted(table.items()))
    raise ContainerConfigError(f"unsupported fieldRef fieldPath {path!r}")


_SUFFIX = {
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(text: str) -> float:
    """A Kubernetes quantity as a number ("500m" -> 0.5, "4Gi" -> 4294967296)."""
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", text.strip())
    if not match or (match[2] and match[2] not in _SUFFIX):
        raise ContainerConfigError(f"not a quantity: {text!r}")
    return float(match[1]) * _SUFFIX.get(match[2], 1.0)


def resource_value(ref: ResourceFieldRef, container: Container, facts: PodFacts) -> str:
    """``limits.cpu`` and friends; a missing limit is the node's allocatable, as on a kubelet."""
    kind, _, name = ref.resource.partition(".")
    table = container.resources.limits if kind == "limits" else container.resources.requests
    raw = table.get(name) or (facts.node_allocatable.get(name) if kind == "limits" else None) or "0"
    return str(math.ceil(quantity(raw) / quantity(ref.divisor)))


def _key(sources: Sources, kind: str, name: str, key: str, optional: bool) -> str | None:
    data = sources.get(f"{kind}/{name}")
    if data is None:
        if optional:
            return None
        raise ContainerConfigError(f'{kind} "{name}" not found')
    if key not in data:
        if optional:
            return None
        raise ContainerConfigError(f'couldn\'t find key {key} in {kind} "{name}"')
    return data[key]


def _value(
    var: EnvVar, container: Container, facts: PodFacts, sources: Sources, known: Mapping[str, str]
) -> str | None:
    if var.value_from is None:
        return expand(var.value or "", known)
    source = var.value_from
    if source.field_ref is not None:
        return field_value(source.field_ref.field_path, facts)
    if source.resource_field_ref is not None:
        return resource_value(source.resource_field_ref, container, facts)
    ref = source.config_map_key_ref or source.secret_key_ref
    if ref is None:
        raise ContainerConfigError(f"env {var.name}: valueFrom names no source")
    kind = "configmap" if source.config_map_key_ref is not None else "secret"
    return _key(sources, kind, ref.name, ref.key, ref.optional)


def _env_from(container: Container, sources: Sources) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.env_from:
        ref = item.config_map_ref or item.secret_ref
        if ref is None:
            continue
        kind = "configmap" if item.config_map_ref is not None else "secret"
        data = sources.get(f"{kind}/{ref.name}")
        if data is None and not ref.optional:
            raise ContainerConfigError(f'{kind} "{ref.name}" not found')
        env.update({f"{item.prefix}{k}": v for k, v in (data or {}).items()})
    return env


def container_env(
    container: Container, facts: PodFacts, sources: Sources, base: Mapping[str, str]
) -> dict[str, str]:
    """The full environment: ``base`` (what the image and the runtime provide), then the spec's."""
    env = {**base, **_env_from(container, sources)}
    for var in container.env:
        value = _value(var, container, facts, sources, env)
        if value is not None:
            env[var.name] = value
    return env


def command_line(container: Container, env: Mapping[str, str]) -> list[str]:
    """command + args with ``$(VAR)`` expanded; the runtime runs no images, so a container without
    a command has nothing to run."""
    if not container.command:
        raise ContainerConfigError(
            f"container {container.name}: no command; the local pod runtime pulls no images, so the "
            "image's entrypoint is unknown (set command)"
        )
    return [expand(part, env) for part in (*container.command, *container.args)]


def referenced_sources(container: Container) -> list[tuple[str, str]]:
    """(kind, name) of each ConfigMap and Secret the container's environment reads."""
    refs: list[tuple[str, str]] = []
    for var in container.env:
        source = var.value_from
        if source is not None and source.config_map_key_ref is not None:
            refs.append(("configmap", source.config_map_key_ref.name))
        if source is not None and source.secret_key_ref is not None:
            refs.append(("secret", source.secret_key_ref.name))
    for item in container.env_from:
        if item.config_map_ref is not None:
            refs.append(("configmap", item.config_map_ref.name))
        if item.secret_ref is not None:
            refs.append(("secret", item.secret_ref.name))
    return refs
