"""Typed model of `spec.bootstrap.import`: a new cluster filled from an existing PostgreSQL server by a
logical dump and restore (docs/import.md).

Every value here is tenant input that ends up in a Job's environment and argv. None of it is ever
interpolated into a shell script or a connection string: host, port, database and role names reach
libpq as separate environment variables (PGHOST, PGPORT, PGDATABASE, PGUSER). The patterns below are
still narrow, so a mistake is refused by the API server naming the field rather than met at run time.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from pg_operator.api.backup import SECRET_KEY_PATTERN, SECRET_NAME_PATTERN
from pg_operator.api.schema import SpecModel, rule, validations

# A DNS name or an IPv4 address (a host name libpq resolves); IPv6 literals in brackets are not needed by
# libpq's PGHOST, so colons are allowed for a bare IPv6 address.
HOST_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9.:]*[A-Za-z0-9])?$"
MAX_HOST_LENGTH = 253
# Database and role names of the source: what PostgreSQL allows unquoted plus upper case, digits, `-`
# and `$` (common in migrated systems). No spaces, quotes, `=` (libpq would read a conninfo) or `/`.
SOURCE_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_$-]{0,62}$"
SourceName = Annotated[str, StringConstraints(pattern=SOURCE_NAME_PATTERN, min_length=1, max_length=63)]
MAX_IMPORT_JOBS = 8
# Field paths, as the refusals and the conditions name them.
PASSWORD_FIELD = "spec.bootstrap.import.source.passwordSecret.name"  # noqa: S105 (a field path)
CA_FIELD = "spec.bootstrap.import.source.ca"


class SourcePassword(SpecModel):
    name: str = Field(
        max_length=253, pattern=SECRET_NAME_PATTERN,
        description=(
            "Secret of the cluster's namespace holding the source role's password. It must carry the label "
            "db.example.com/cluster=<this cluster's name> (the same rule as the backup credentials)."
        ),
    )  # fmt: skip
    key: str = Field(
        "password", max_length=253, pattern=SECRET_KEY_PATTERN, description="Key of the password."
    )


class SourceCA(SpecModel):
    """Where the CA certificate that signed the source's server certificate is: one key of a Secret or of
    a ConfigMap of the cluster's namespace."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                "has(self.secretName) != has(self.configMapName)",
                "bootstrap.import.source.ca: set exactly one of secretName and configMapName",
            )
        )
    )

    secret_name: str | None = Field(None, max_length=253, pattern=SECRET_NAME_PATTERN)
    config_map_name: str | None = Field(None, max_length=253, pattern=SECRET_NAME_PATTERN)
    key: str = Field("ca.crt", max_length=253, pattern=SECRET_KEY_PATTERN, description="Key of the PEM.")

    @model_validator(mode="after")
    def _one_place(self) -> SourceCA:
        if (self.secret_name is None) == (self.config_map_name is None):
            raise ValueError("bootstrap.import.source.ca: set exactly one of secretName and configMapName")
        return self


class ImportSource(SpecModel):
    host: str = Field(
        max_length=MAX_HOST_LENGTH, pattern=HOST_PATTERN,
        description="Host name or address of the source server, as the cluster's pods resolve it.",
    )  # fmt: skip
    port: int = Field(5432, ge=1, le=65535, description="Port of the source server.")
    user: str = Field(
        max_length=63, pattern=SOURCE_NAME_PATTERN,
        description="Role the dump connects as; read-only access suffices (docs/import.md).",
    )  # fmt: skip
    password_secret: SourcePassword = Field(description="Where the role's password is.")
    ssl_mode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] = Field(
        "verify-full",
        description="libpq's sslmode towards the source; verify-ca and verify-full need `ca`.",
    )
    ca: SourceCA | None = Field(None, description="CA certificate of the source's server certificate.")


class ImportBootstrap(SpecModel):
    """A new cluster filled by dumping an external server's database(s) and restoring them, once, after its
    primary is up and before it is reported Ready."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                "self.mode != 'microservice' || size(self.databases) == 1",
                "bootstrap.import.databases: microservice mode imports exactly one database",
                fieldPath=".databases",
            ),
            rule(
                "!has(self.source.ca) || self.source.sslMode != 'disable'",
                "bootstrap.import.source.ca: useless with sslMode disable",
                fieldPath=".source.ca",
            ),
            rule(
                "!(self.source.sslMode in ['verify-ca', 'verify-full']) || has(self.source.ca)",
                "bootstrap.import.source.ca is required with sslMode verify-ca or verify-full",
                fieldPath=".source.sslMode",
            ),
        )
    )

    source: ImportSource = Field(description="The server to import from; it is only read.")
    mode: Literal["microservice"] = Field(
        "microservice",
        description=(
            "microservice: one source database into the cluster's application database "
            "(bootstrap.initdb.database), every object owned by the application role."
        ),
    )
    databases: list[SourceName] = Field(
        min_length=1, max_length=1, description="The source database to import.",
    )  # fmt: skip
    jobs: int = Field(
        1, ge=1, le=MAX_IMPORT_JOBS,
        description="Parallel workers of pg_dump -Fd -j and pg_restore -j (1: sequential).",
    )  # fmt: skip

    @model_validator(mode="after")
    def _checked(self) -> ImportBootstrap:
        verifying = self.source.ssl_mode in ("verify-ca", "verify-full")
        if verifying and self.source.ca is None:
            raise ValueError("bootstrap.import.source.ca is required with sslMode verify-ca or verify-full")
        if self.source.ca is not None and self.source.ssl_mode == "disable":
            raise ValueError("bootstrap.import.source.ca: useless with sslMode disable")
        return self
