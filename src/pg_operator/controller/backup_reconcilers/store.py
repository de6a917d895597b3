"""Deleting a cluster's objects in its S3-compatible store, from the operator process itself (boto3), so
it works when the cluster's pods are broken or gone. The credentials are read from the user's Secret
for the call and never logged; errors are reported with the store's own error code."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from pg_operator.backup.barman import CHECKSUM_ENV


@dataclass(frozen=True)
class StoreAccess:
    bucket: str
    prefix: str  # "<path>/<cluster>/"
    endpoint_url: str | None
    region: str | None
    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.access_key_id, self.secret_access_key, self.session_token) if s)


class StoreError(Exception):
    """A failed store call; str() is the store's error (no secret values)."""


def _client(access: StoreAccess) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=5,
        read_timeout=30,
        retries={"max_attempts": 2, "mode": "standard"},
        # boto3 >= 1.36 sends checksums many S3-compatible servers refuse (see backup.barman).
        request_checksum_calculation=CHECKSUM_ENV["AWS_REQUEST_CHECKSUM_CALCULATION"],
        response_checksum_validation=CHECKSUM_ENV["AWS_RESPONSE_CHECKSUM_VALIDATION"],
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=access.endpoint_url,
        region_name=access.region,
        aws_access_key_id=access.access_key_id,
        aws_secret_access_key=access.secret_access_key,
        aws_session_token=access.session_token,
        config=config,
    )


def _delete_prefix(access: StoreAccess) -> int:
    """Delete every key under the prefix, a page (≤ 1000 keys) at a time; returns how many."""
    from botocore.exceptions import BotoCoreError, ClientError

    if not access.prefix.endswith("/") or access.prefix == "/":
        raise StoreError(f"refusing to delete under {access.prefix!r}: not one cluster's prefix")
    deleted = 0
    try:
        client = _client(access)
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=access.bucket, Prefix=access.prefix):
            keys = [{"Key": o["Key"]} for o in page.get("Contents") or ()]
            if not keys:
                continue
            result = client.delete_objects(Bucket=access.bucket, Delete={"Objects": keys, "Quiet": True})
            errors = result.get("Errors") or []
            if errors:
                first = errors[0]
                raise StoreError(
                    f"{first.get('Code')}: could not delete {first.get('Key')}: {first.get('Message')}"
                )
            deleted += len(keys)
    except ClientError as exc:
        error = exc.response.get("Error") or {}
        raise StoreError(f"{error.get('Code')}: {error.get('Message') or exc}") from None
    except BotoCoreError as exc:
        raise StoreError(f"{type(exc).__name__}: {exc}") from None
    return deleted


async def delete_prefix(access: StoreAccess) -> int:
    """In a thread: boto3 is blocking."""
    return await asyncio.to_thread(_delete_prefix, access)
