"""What every API model shares: the wire conventions and Kubernetes name patterns."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields and type coercions refused,
    as the API server refuses them."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True)


def exactly_one(model: BaseModel, fields: tuple[str, ...], where: str) -> None:
    """Refuse ``model`` unless exactly one of ``fields`` is set (a Kubernetes one-of)."""
    given = [name for name in fields if getattr(model, name) is not None]
    if len(given) != 1:
        choices = ", ".join(to_camel(name) for name in fields)
        raise ValueError(f"{where}: set exactly one of {choices} (got {given or 'none'})")
