"""Types of `spec.postgresql`: the PostgreSQL settings a user may set (those the operator owns are
refused, by name) and the networks allowed to connect."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import Field, StringConstraints, field_validator

from pg_operator.api.schema import SpecModel, rule, validations

# PostgreSQL settings that Patroni and the operator set themselves; a user value would break replication,
# failover, archiving or the pod layout. Compared case-insensitively, as PostgreSQL does. The archiving
# ones (backup.archiving.ARCHIVING_PARAMETERS) come from spec.backup: archiveTimeout, walMaxKeepSize.
OPERATOR_OWNED_PARAMETERS: tuple[str, ...] = (
    "archive_cleanup_command",
    "archive_command",
    "archive_library",
    "archive_mode",
    "archive_timeout",
    "cluster_name",
    "config_file",
    "data_directory",
    "external_pid_file",
    "hba_file",
    "hot_standby",
    "ident_file",
    "listen_addresses",
    "max_replication_slots",
    "max_slot_wal_keep_size",
    "max_wal_senders",
    "password_encryption",
    "port",
    "primary_conninfo",
    "primary_slot_name",
    "promote_trigger_file",
    "recovery_end_command",
    "recovery_target",
    "recovery_target_action",
    "recovery_target_inclusive",
    "recovery_target_lsn",
    "recovery_target_name",
    "recovery_target_time",
    "recovery_target_timeline",
    "recovery_target_xid",
    "restore_command",
    "synchronous_standby_names",
    "unix_socket_directories",
    "unix_socket_group",
    "unix_socket_permissions",
    "wal_level",
    "wal_log_hints",
)
PARAMETER_NAME_PATTERN = r"^[a-z_][a-z0-9_]*([.][a-z_][a-z0-9_]*)?$"  # no backslash: it goes into CEL
MAX_PARAMETERS = 128
MAX_PARAMETER_VALUE_LENGTH = 4096

DEFAULT_ALLOWED_CIDRS: tuple[str, ...] = ("10.244.0.0/16",)


# One key lookup per owned parameter, each with its own message: the API server bounds a rule's estimated
# cost, and iterating over the user's keys (map keys have no declarable maximum length) or building a
# message from them exceeds it. Upper-case names are refused by the name rule, so the exact-match lookup
# is enough for PostgreSQL's case-insensitive names.
_PARAMETER_RULES = (
    *(
        rule(
            f"!('{p}' in self)",
            f"postgresql.parameters: {p} is set by the operator and cannot be overridden",
            reason="FieldValueForbidden",
        )
        for p in OPERATOR_OWNED_PARAMETERS
    ),
    rule(
        f"self.all(k, k.matches('{PARAMETER_NAME_PATTERN}'))",
        "postgresql.parameters: names are lower-case PostgreSQL setting names, e.g. shared_buffers "
        "or auto_explain.log_min_duration",
    ),
)


class Postgresql(SpecModel):
    parameters: dict[str, Annotated[str, StringConstraints(max_length=MAX_PARAMETER_VALUE_LENGTH)]] = Field(
        default_factory=dict,
        max_length=MAX_PARAMETERS,
        description=(
            'postgresql.conf settings, as strings (e.g. shared_buffers: 256MB, max_connections: "200"). '
            "Settings the operator owns (port, wal_level, archive_command, ...) are refused."
        ),
        json_schema_extra=validations(*_PARAMETER_RULES),
    )
    allowed_cidrs: list[Annotated[str, StringConstraints(max_length=64)]] = Field(
        default_factory=lambda: list(DEFAULT_ALLOWED_CIDRS),
        alias="allowedCIDRs",
        min_length=1,
        max_length=16,
        description="Networks allowed to connect with a password (pg_hba); defaults to the pod network.",
        json_schema_extra={
            "default": list(DEFAULT_ALLOWED_CIDRS),
            **validations(rule("self.all(c, isCIDR(c))", "postgresql.allowedCIDRs: each entry is a CIDR")),
        },
    )

    @field_validator("parameters")
    @classmethod
    def _not_operator_owned(cls, parameters: dict[str, str]) -> dict[str, str]:
        owned = sorted(k for k in parameters if k.lower() in OPERATOR_OWNED_PARAMETERS)
        if owned:
            raise ValueError(
                f"postgresql.parameters: {', '.join(owned)} is set by the operator and cannot be overridden"
            )
        bad = sorted(k for k in parameters if not re.match(PARAMETER_NAME_PATTERN, k))
        if bad:
            raise ValueError(f"postgresql.parameters: {', '.join(bad)} is not a PostgreSQL setting name")
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
