"""Services as the runtime sees them, and the environment variables a kubelet derives from them
(pure).

With ``enableServiceLinks`` (the default) a kubelet gives every container, for each Service of the
pod's namespace that has a ClusterIP when the container starts, ``<NAME>_SERVICE_HOST``,
``<NAME>_SERVICE_PORT``, ``<NAME>_SERVICE_PORT_<PORT>`` and the docker-link ``<NAME>_PORT...``
variables (pkg/kubelet/envvars); the container's own variables win, and ``$(VAR)`` in its env,
command and args may refer to them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# The apiserver's own Service: the runtime gives containers the apiserver's real address under
# its names (host.image_env), not this ClusterIP, which no Pod stands behind.
MASTER_SERVICE = ("default", "kubernetes")


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class ServicePort(_View):
    name: str = ""
    protocol: str = "TCP"
    port: int
    target_port: int | str | None = None


class ServiceSpec(_View):
    cluster_ip: str = Field("", alias="clusterIP")
    selector: dict[str, str] = {}
    ports: tuple[ServicePort, ...] = ()


class ServiceMeta(_View):
    name: str
    namespace: str = "default"


class Service(_View):
    metadata: ServiceMeta
    spec: ServiceSpec

    @property
    def key(self) -> tuple[str, str]:
        return self.metadata.namespace, self.metadata.name

    @property
    def has_cluster_ip(self) -> bool:
        """Headless Services (``None``) and ExternalName ones (no IP) get no variables."""
        return self.spec.cluster_ip not in ("", "None")


def parse_service(obj: dict[str, Any]) -> Service:
    return Service.model_validate(obj)


def env_name(name: str) -> str:
    """The kubelet's makeEnvVariableName: upper case, dashes to underscores."""
    return name.upper().replace("-", "_")


def _one(service: Service) -> dict[str, str]:
    prefix, ip = env_name(service.metadata.name), service.spec.cluster_ip
    host = f"[{ip}]" if ":" in ip else ip
    env = {f"{prefix}_SERVICE_HOST": ip}
    for index, port in enumerate(service.spec.ports):
        if index == 0:
            env[f"{prefix}_SERVICE_PORT"] = str(port.port)
        if port.name:
            env[f"{prefix}_SERVICE_PORT_{env_name(port.name)}"] = str(port.port)
    for index, port in enumerate(service.spec.ports):
        proto = port.protocol.lower()
        link = f"{prefix}_PORT_{port.port}_{port.protocol.upper()}"
        url = f"{proto}://{host}:{port.port}"
        if index == 0:
            env[f"{prefix}_PORT"] = url
        env.update({link: url, f"{link}_PROTO": proto, f"{link}_PORT": str(port.port), f"{link}_ADDR": ip})
    return env


def service_env(services: Iterable[Service], namespace: str) -> dict[str, str]:
    """The variables of the Services of ``namespace`` (the master Service left to the runtime);
    names sorted, as the kubelet adds them, so a later Service's variable never hides an earlier's
    at random."""
    env: dict[str, str] = {}
    chosen = [s for s in services if s.metadata.namespace == namespace and s.has_cluster_ip]
    for service in sorted(chosen, key=lambda s: s.metadata.name):
        if service.key != MASTER_SERVICE:
            env.update(_one(service))
    return env
