"""Types of `spec.postgresql`: the PostgreSQL settings a user may set (what is refused, and why, is in
api/parameters.py) and the networks allowed to connect."""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import Field, StringConstraints, field_validator

from pg_operator.api.parameters import (
    MAX_PARAMETER_VALUE_LENGTH,
    MAX_PARAMETERS,
    OPERATOR_OWNED_PARAMETERS,
    PARAMETER_RULES,
    VALUE_RULES,
    parameter_problems,
)
from pg_operator.api.schema import SpecModel, rule, validations

# Every address: no pod network is assumed (each CNI has its own). Replication does not depend on it (the
# replication role logs in with the cluster's client certificate, from wherever its pod is), TLS and
# scram-sha-256 are required of everyone, and who may reach the port at all is the NetworkPolicy's job.
DEFAULT_ALLOWED_CIDRS: tuple[str, ...] = ("0.0.0.0/0", "::/0")


# Each value carries its own rule, so the API server's error names the parameter in its path.
_ParameterValue = Annotated[
    str,
    StringConstraints(max_length=MAX_PARAMETER_VALUE_LENGTH),
    Field(json_schema_extra=validations(*VALUE_RULES)),
]


class Postgresql(SpecModel):
    parameters: dict[str, _ParameterValue] = Field(
        default_factory=dict,
        max_length=MAX_PARAMETERS,
        description=(
            'postgresql.conf settings, as strings (e.g. shared_buffers: 256MB, max_connections: "200"). '
            "Settings the operator owns (port, wal_level, ...) and settings that run commands, load code or "
            "name files (shared_preload_libraries, ssl_cert_file, log_directory, ...) are refused; values "
            "must not contain control characters. See docs/parameters.md."
        ),
        json_schema_extra=validations(*PARAMETER_RULES),
    )
    allowed_cidrs: list[Annotated[str, StringConstraints(max_length=64)]] = Field(
        default_factory=lambda: list(DEFAULT_ALLOWED_CIDRS),
        alias="allowedCIDRs",
        min_length=1,
        max_length=16,
        description=(
            "Networks application roles may log in from (pg_hba, TLS and scram-sha-256 always required); "
            "defaults to every address. Replication does not use it: instances authenticate to each other "
            "with the cluster's client certificate. See docs/tls.md."
        ),
        json_schema_extra={
            "default": list(DEFAULT_ALLOWED_CIDRS),
            **validations(rule("self.all(c, isCIDR(c))", "postgresql.allowedCIDRs: each entry is a CIDR")),
        },
    )

    @field_validator("parameters")
    @classmethod
    def _settable(cls, parameters: dict[str, str]) -> dict[str, str]:
        problems = parameter_problems(parameters)
        if problems:
            raise ValueError(f"postgresql.parameters: {'; '.join(problems)}")
        return parameters

    @field_validator("allowed_cidrs")
    @classmethod
    def _cidrs(cls, cidrs: list[str]) -> list[str]:
        for cidr in cidrs:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"postgresql.allowedCIDRs: {cidr!r} is not a CIDR") from None
        return cidrs


__all__ = ["DEFAULT_ALLOWED_CIDRS", "OPERATOR_OWNED_PARAMETERS", "Postgresql"]
