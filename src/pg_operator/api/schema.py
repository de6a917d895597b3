"""What every model of the API is built from: the model bases, CEL rule entries, the cluster name's
shape and length limit.

A model's constraints land twice from one definition: as JSON-schema keywords or CEL rules in the CRD (the
API server refuses bad input) and as pydantic validation (an error naming the field should the schema be
bypassed).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

# Room for the longest derived name: the StatefulSet's controller-revision-hash label "<name>-<10 chars>"
# and Service names "<name>-rw" must stay within 63 characters, and Services need a DNS-1035 label. A
# cluster's name is also barman's server name, and Backups and restores name clusters by it.
MAX_NAME_LENGTH = 50
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class SpecModel(BaseModel):
    """Input the operator reads (a spec, instance.yaml): camelCase on the wire, snake_case in Python;
    unknown fields are an error (the API server prunes them, so one here means a bug or a bypassed
    schema)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class StatusModel(BaseModel):
    """What the operator writes: camelCase, and fields it does not know (an older or newer operator's)
    are ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


def rule(rule: str, message: str, **extra: str) -> dict[str, str]:
    """One entry of x-kubernetes-validations; `fieldPath`, `reason` or `messageExpression` in extra."""
    return {"rule": rule, "message": message, **extra}


def requests_within_limits(where: str) -> tuple[dict[str, str], ...]:
    """CEL rules of a resources object: each CPU or memory request no larger than its limit, the message
    naming the fields from `where` (e.g. `pooler.resources`)."""
    return tuple(
        rule(
            f"!has(self.limits.{res}) || !has(self.requests.{res}) || "
            f"quantity(string(self.requests.{res})).compareTo(quantity(string(self.limits.{res}))) <= 0",
            f"{where}.requests.{res} must not exceed {where}.limits.{res}",
            fieldPath=f".requests.{res}",
        )
        for res in ("cpu", "memory")
    )


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """CEL rules as a model's or field's json_schema_extra."""
    return {"x-kubernetes-validations": list(rules)}
