"""What the instance pods need for backups: environment variables for barman-cloud, taken from the
credentials Secret with `secretKeyRef`, so the values never pass through the operator, a ConfigMap, argv
or a log. PostgreSQL (hence archive_command / restore_command) and Patroni's bootstrap command inherit
the container's environment.
"""

from __future__ import annotations

from typing import Any

from pg_operator.backup.barman import (
    ACCESS_KEY_ENV,
    CHECKSUM_ENV,
    REGION_ENV,
    SECRET_KEY_ENV,
    SESSION_TOKEN_ENV,
)


def _secret_env(name: str, secret: str, key: str, *, optional: bool = False) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def barman_env(
    *,
    secret_name: str,
    access_key_id_key: str,
    secret_access_key_key: str,
    session_token_key: str | None = None,
    region: str | None = None,
    prefix: str = "",
    optional: bool = False,
) -> list[dict[str, Any]]:
    """EnvVar objects for the postgres container (sorted by name, so the pod template is stable).
    `prefix` (recovery.SOURCE_ENV_PREFIX) names the recovery source's set; the checksum settings are
    given once, unprefixed, by the caller's own set or `checksum_env()`. `optional`: the pod starts even
    when the Secret or key is missing (the variable is then unset)."""
    env = [
        _secret_env(prefix + ACCESS_KEY_ENV, secret_name, access_key_id_key, optional=optional),
        _secret_env(prefix + SECRET_KEY_ENV, secret_name, secret_access_key_key, optional=optional),
    ]
    if not prefix:
        env += checksum_env()
    if session_token_key:
        env.append(_secret_env(prefix + SESSION_TOKEN_ENV, secret_name, session_token_key, optional=optional))
    if region:
        env.append({"name": prefix + REGION_ENV, "value": region})
    return sorted(env, key=lambda e: str(e["name"]))


def checksum_env() -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in CHECKSUM_ENV.items()]
