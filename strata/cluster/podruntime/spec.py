"""The parts of a Pod the runtime acts on, parsed once from the API's JSON into frozen models.

Only the fields a kubelet would act on here are modelled; unknown fields are ignored (the API
server has validated the object already), so a newer pod field never breaks the runtime.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

RestartPolicy = Literal["Always", "OnFailure", "Never"]


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class KeyRef(_View):
    name: str = ""
    key: str
    optional: bool = False


class FieldRef(_View):
    field_path: str


class ResourceFieldRef(_View):
    container_name: str = ""
    resource: str
    divisor: str = "1"


class EnvSource(_View):
    field_ref: FieldRef | None = None
    config_map_key_ref: KeyRef | None = None
    secret_key_ref: KeyRef | None = None
    resource_field_ref: ResourceFieldRef | None = None


class EnvVar(_View):
    name: str
    value: str | None = None
    value_from: EnvSource | None = None


class NameRef(_View):
    name: str = ""
    optional: bool = False


class EnvFrom(_View):
    prefix: str = ""
    config_map_ref: NameRef | None = None
    secret_ref: NameRef | None = None


class ContainerPort(_View):
    name: str = ""
    container_port: int
    protocol: str = "TCP"


class HttpGet(_View):
    path: str = "/"
    port: int | str
    host: str = ""
    scheme: str = "HTTP"
    http_headers: tuple[dict[str, str], ...] = ()


class TcpSocket(_View):
    port: int | str
    host: str = ""


class ExecAction(_View):
    command: tuple[str, ...] = ()


class Probe(_View):
    http_get: HttpGet | None = None
    tcp_socket: TcpSocket | None = None
    exec: ExecAction | None = Field(None, alias="exec")
    initial_delay_seconds: int = 0
    period_seconds: int = 10
    timeout_seconds: int = 1
    success_threshold: int = 1
    failure_threshold: int = 3


class Handler(_View):
    http_get: HttpGet | None = None
    tcp_socket: TcpSocket | None = None
    exec: ExecAction | None = Field(None, alias="exec")
    sleep: dict[str, int] | None = None


class Lifecycle(_View):
    post_start: Handler | None = None
    pre_stop: Handler | None = None


class VolumeMount(_View):
    name: str
    mount_path: str
    read_only: bool = False
    sub_path: str = ""
    sub_path_expr: str = ""


class Resources(_View):
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}


class SecurityContext(_View):
    read_only_root_filesystem: bool = False


class Container(_View):
    name: str
    image: str = ""
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    working_dir: str = ""
    env: tuple[EnvVar, ...] = ()
    env_from: tuple[EnvFrom, ...] = ()
    ports: tuple[ContainerPort, ...] = ()
    volume_mounts: tuple[VolumeMount, ...] = ()
    resources: Resources = Resources()
    startup_probe: Probe | None = None
    readiness_probe: Probe | None = None
    liveness_probe: Probe | None = None
    lifecycle: Lifecycle | None = None
    security_context: SecurityContext = SecurityContext()
    # Only on init containers: "Always" makes it a native sidecar.
    restart_policy: str | None = None

    @property
    def is_sidecar(self) -> bool:
        return self.restart_policy == "Always"

    def port_number(self, port: int | str) -> int:
        """A probe's port: a number, or the name of one of this container's ports."""
        if isinstance(port, int) or port.isdigit():
            return int(port)
        for declared in self.ports:
            if declared.name == port:
                return declared.container_port
        raise ValueError(f"container {self.name}: no port named {port!r}")


class KeyToPath(_View):
    key: str
    path: str
    mode: int | None = None


class ConfigMapVolume(_View):
    name: str = ""
    items: tuple[KeyToPath, ...] = ()
    optional: bool = False
    default_mode: int | None = None


class SecretVolume(_View):
    secret_name: str = ""
    items: tuple[KeyToPath, ...] = ()
    optional: bool = False
    default_mode: int | None = None


class DownwardFile(_View):
    path: str
    field_ref: FieldRef | None = None
    resource_field_ref: ResourceFieldRef | None = None


class DownwardApiVolume(_View):
    items: tuple[DownwardFile, ...] = ()


class TokenProjection(_View):
    path: str
    audience: str = ""
    expiration_seconds: int = 3600


class ProjectionSource(_View):
    service_account_token: TokenProjection | None = None
    config_map: ConfigMapVolume | None = None
    secret: ConfigMapVolume | None = None
    downward_api: DownwardApiVolume | None = Field(None, alias="downwardAPI")


class ProjectedVolume(_View):
    sources: tuple[ProjectionSource, ...] = ()


class EmptyDirVolume(_View):
    medium: str = ""
    size_limit: str | None = None


class HostPathVolume(_View):
    path: str
    type: str = ""


class ClaimVolume(_View):
    claim_name: str
    read_only: bool = False


class Volume(_View):
    name: str
    empty_dir: EmptyDirVolume | None = None
    config_map: ConfigMapVolume | None = None
    secret: SecretVolume | None = None
    projected: ProjectedVolume | None = None
    downward_api: DownwardApiVolume | None = Field(None, alias="downwardAPI")
    host_path: HostPathVolume | None = None
    persistent_volume_claim: ClaimVolume | None = None
    ephemeral: dict[str, Any] | None = None


class Toleration(_View):
    key: str = ""
    operator: str = "Equal"


class PodSpec(_View):
    node_name: str = ""
    restart_policy: RestartPolicy = "Always"
    termination_grace_period_seconds: int = 30
    init_containers: tuple[Container, ...] = ()
    containers: tuple[Container, ...]
    volumes: tuple[Volume, ...] = ()
    service_account_name: str = "default"
    host_network: bool = False
    enable_service_links: bool = True
    node_selector: dict[str, str] = {}
    tolerations: tuple[Toleration, ...] = ()
    readiness_gates: tuple[dict[str, str], ...] = ()


class ObjectMeta(_View):
    name: str
    namespace: str = "default"
    uid: str
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: int | None = None


class Pod(_View):
    """A pod as the runtime sees it: identity, spec, and whether it is being deleted."""

    metadata: ObjectMeta
    spec: PodSpec

    @property
    def key(self) -> str:
        """Namespace, name and uid, as the kubelet names a pod's directories."""
        return f"{self.metadata.namespace}_{self.metadata.name}_{self.metadata.uid}"

    @property
    def terminating(self) -> bool:
        return self.metadata.deletion_timestamp is not None

    def container(self, name: str) -> Container:
        for container in (*self.spec.init_containers, *self.spec.containers):
            if container.name == name:
                return container
        raise KeyError(name)

    def named_tcp_ports(self) -> dict[str, int]:
        """The named TCP ports of every container (a Service's ``targetPort`` may name one)."""
        every = (*self.spec.init_containers, *self.spec.containers)
        return {p.name: p.container_port for c in every for p in c.ports if p.name and p.protocol == "TCP"}

    def volume(self, name: str) -> Volume:
        for volume in self.spec.volumes:
            if volume.name == name:
                return volume
        raise KeyError(f"pod {self.metadata.name}: no volume {name!r}")


def parse_pod(obj: dict[str, Any]) -> Pod:
    return Pod.model_validate(obj)
