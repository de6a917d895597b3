"""The operator's own client of tenants' S3-compatible stores (boto3): deleting a cluster's objects,
the ownership marker, and small documents of the operator's own (backup generations), from the operator
process itself, so it works when the cluster's pods are broken or gone. Plumbing below the backup
reconcilers and the cluster's sub-reconcilers, which both call it. The credentials are read from the
user's Secret for the call and never logged; errors are reported with the store's own error code.

Before anything is read or sent, the store is checked against the install's policy
(backup.store_policy): https unless plain HTTP is allowed, and a credentials Secret labelled for the
cluster. Every call runs bounded and fair (store_calls: a deadline, a slot per namespace)."""

from __future__ import annotations

import base64
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Secret

from pg_operator.api.backup import BackupConfiguration, S3Destination
from pg_operator.backup.barman import CHECKSUM_ENV, ObjectStore
from pg_operator.backup.store_policy import (
    BACKUP_CREDENTIALS_FIELD,
    BACKUP_ENDPOINT_FIELD,
    RECOVERY_CREDENTIALS_FIELD,
    RECOVERY_ENDPOINT_FIELD,
    after_page,
    credential_missing,
    credential_refusal,
    endpoint_refusal,
)
from pg_operator.controller.kube_api import Api
from pg_operator.controller.store_calls import (
    StoreBusy,
    StoreError,
    StoreRefused,
    StoreTimeout,
    attach,
    bounded,
)
from pg_operator.controller.store_limits import limits

__all__ = [
    "StoreAccess",
    "StoreBusy",
    "StoreError",
    "StoreRefused",
    "StoreTimeout",
    "s3_access",
    "store_access",
]


@dataclass(frozen=True)
class StoreAccess:
    namespace: str  # whose slot the calls take (store_calls)
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


async def store_access(
    api: Api, namespace: str, config: BackupConfiguration, store: ObjectStore, *, cluster: str
) -> StoreAccess:
    """The store's address and the credentials from the user's Secret (read for the call, never kept).
    Raises StoreRefused, naming the field, when the endpoint or the Secret may not be used."""
    return await s3_access(api, namespace, config.s3, store, cluster=cluster)


async def s3_access(
    api: Api, namespace: str, s3: S3Destination, store: ObjectStore, *, cluster: str, recovery: bool = False
) -> StoreAccess:
    """store_access for any S3 destination of the spec (`recovery`: the recovery source's)."""
    endpoint_field = RECOVERY_ENDPOINT_FIELD if recovery else BACKUP_ENDPOINT_FIELD
    credentials_field = RECOVERY_CREDENTIALS_FIELD if recovery else BACKUP_CREDENTIALS_FIELD
    insecure = limits().allow_insecure
    refused = endpoint_refusal(store.endpoint_url, field=endpoint_field, allow_insecure=insecure)
    if refused is not None:
        raise StoreRefused(refused)
    creds = s3.credentials
    try:
        secret = await api.get(Secret, creds.secret_name, namespace)
    except ApiError as exc:
        if exc.status.code == 404:
            raise StoreRefused(credential_missing(namespace, cluster=cluster, secret=creds.secret_name,
                                                  field=credentials_field)) from None  # fmt: skip
        raise StoreError(f"credentials Secret {creds.secret_name}: {exc.status.message}") from None
    labels = (secret.metadata.labels if secret.metadata is not None else None) or {}
    refused = credential_refusal(labels, cluster=cluster, secret=creds.secret_name, field=credentials_field)
    if refused is not None:
        raise StoreRefused(refused)
    data = secret.data or {}

    def value(key: str | None) -> str | None:
        if key is None or key not in data:
            return None
        return base64.b64decode(data[key]).decode()

    key_id, secret_key = value(creds.access_key_id_key), value(creds.secret_access_key_key)
    if not key_id or not secret_key:
        raise StoreError(
            f"credentials Secret {creds.secret_name} lacks {creds.access_key_id_key} or "
            f"{creds.secret_access_key_key}"
        )
    return StoreAccess(
        namespace=namespace,
        bucket=store.bucket,
        prefix=store.prefix,
        endpoint_url=store.endpoint_url,
        region=store.region,
        access_key_id=key_id,
        secret_access_key=secret_key,
        session_token=value(creds.session_token_key),
    )


# One boto3 session for the process, and a client per distinct endpoint and credentials (clients are
# thread-safe; sessions are not, hence the lock). A session per call loaded S3's service model anew each
# time: about 15 MiB per concurrent call, most of the operator's peak memory with backups.
_SESSION_LOCK = threading.Lock()
_SESSION: Any = None
_CLIENTS: OrderedDict[tuple[str | None, ...], Any] = OrderedDict()
_MAX_CLIENTS = 16


def _client(access: StoreAccess) -> Any:
    global _SESSION
    key = (access.endpoint_url, access.region, access.access_key_id, access.secret_access_key,
           access.session_token)  # fmt: skip
    with _SESSION_LOCK:
        client = _CLIENTS.get(key)
        if client is not None:
            _CLIENTS.move_to_end(key)
            return client
        import boto3
        from botocore.config import Config

        config = Config(
            # Bounds of botocore's own; the call's overall deadline is store_calls' (its requests are
            # sent there, over a socket shut at the deadline).
            connect_timeout=5,
            read_timeout=30,
            retries={"max_attempts": 2, "mode": "standard"},
            # boto3 >= 1.36 sends checksums many S3-compatible servers refuse (see backup.barman).
            request_checksum_calculation=CHECKSUM_ENV["AWS_REQUEST_CHECKSUM_CALCULATION"],
            response_checksum_validation=CHECKSUM_ENV["AWS_RESPONSE_CHECKSUM_VALIDATION"],
            max_pool_connections=4,
        )
        if _SESSION is None:
            _SESSION = boto3.session.Session()
        client = _SESSION.client(
            "s3",
            endpoint_url=access.endpoint_url,
            region_name=access.region,
            aws_access_key_id=access.access_key_id,
            aws_secret_access_key=access.secret_access_key,
            aws_session_token=access.session_token,
            config=config,
        )
        attach(client)
        _CLIENTS[key] = client
        while len(_CLIENTS) > _MAX_CLIENTS:
            _CLIENTS.popitem(last=False)
        return client


@dataclass(frozen=True)
class Deleted:
    count: int
    complete: bool  # False: the listing stopped at the page limit; the next reconcile deletes the rest


def _delete_prefix(access: StoreAccess, page_limit: int) -> Deleted:
    """Delete the keys under the prefix, a page (≤ 1000 keys) at a time, at most `page_limit` pages."""
    from botocore.exceptions import BotoCoreError, ClientError

    if not access.prefix.endswith("/") or access.prefix == "/":
        raise StoreError(f"refusing to delete under {access.prefix!r}: not one cluster's prefix")
    deleted, pages = 0, 0
    try:
        client = _client(access)
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=access.bucket, Prefix=access.prefix):
            pages += 1
            keys = [{"Key": o["Key"]} for o in page.get("Contents") or ()]
            step = after_page(pages, bool(page.get("IsTruncated")), page_limit)
            if not keys:
                if step == "cut":
                    return Deleted(deleted, complete=False)
                continue
            result = client.delete_objects(Bucket=access.bucket, Delete={"Objects": keys, "Quiet": True})
            errors = result.get("Errors") or []
            if errors:
                first = errors[0]
                raise StoreError(
                    f"{first.get('Code')}: could not delete {first.get('Key')}: {first.get('Message')}"
                )
            deleted += len(keys)
            if step == "cut":
                return Deleted(deleted, complete=False)
    except ClientError as exc:
        error = exc.response.get("Error") or {}
        raise StoreError(f"{error.get('Code')}: {error.get('Message') or exc}") from None
    except BotoCoreError as exc:
        raise StoreError(f"{type(exc).__name__}: {exc}") from None
    return Deleted(deleted, complete=True)


async def delete_prefix(access: StoreAccess) -> Deleted:
    """On the store pool, within the listing deadline and page limit."""
    bound = limits()
    return await bounded(access.namespace, lambda: _delete_prefix(access, bound.listing_pages),
                         seconds=bound.listing_seconds)  # fmt: skip


# --- the ownership marker (backup.store_ownership) --------------------------------------------------------


def _store_error(exc: Exception) -> StoreError:
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error") or {}
        return StoreError(f"{error.get('Code')}: {error.get('Message') or exc}")
    return StoreError(f"{type(exc).__name__}: {exc}")


def _read_key(client: Any, bucket: str, key: str) -> bytes | None:
    """The object's bytes, or None when there is none."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        data: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read(65536)
        return data
    except ClientError as exc:
        if (exc.response.get("Error") or {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
            return None
        raise _store_error(exc) from None
    except BotoCoreError as exc:
        raise _store_error(exc) from None


def _has_any(client: Any, bucket: str, key_prefix: str, *, besides: str | None = None) -> bool:
    """Whether any key starts with `key_prefix` (other than `besides`)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        page = client.list_objects_v2(Bucket=bucket, Prefix=key_prefix, MaxKeys=2)
    except (ClientError, BotoCoreError) as exc:
        raise _store_error(exc) from None
    return any(o["Key"] != besides for o in page.get("Contents") or ())


@dataclass(frozen=True)
class PrefixContents:
    """What the ownership decision needs from the store: the marker's bytes (None: no marker), whether
    anything else is under the prefix, and the first evidence prefix with objects (its index)."""

    marker: bytes | None
    has_objects: bool
    evidence_found: int | None = None


def _inspect(access: StoreAccess, marker_key: str, evidence: tuple[str, ...]) -> PrefixContents:
    client = _client(access)
    marker = _read_key(client, access.bucket, marker_key)
    has_objects = _has_any(client, access.bucket, access.prefix, besides=marker_key)
    found = None
    if marker is None and has_objects:
        found = next((i for i, p in enumerate(evidence) if _has_any(client, access.bucket, p)), None)
    return PrefixContents(marker, has_objects, found)


@dataclass(frozen=True)
class PutResult:
    created: bool  # False: an object was there already (the store refused the conditional create)
    conditional: bool  # the store honoured If-None-Match; False: a plain write (read-check-write)
    read_back: bytes | None  # the marker as the store holds it afterwards


def _put_if_absent(access: StoreAccess, key: str, data: bytes) -> PutResult:
    """Create the object only if there is none: `If-None-Match: *` (S3 since 2024, MinIO, Ceph, moto),
    then read it back. A store that refuses the header as not implemented gets a plain write (the caller
    read the key just before: read-check-write, whose window between the read and the write is the race
    it accepts there); the read-back still shows who won a race that ended before it."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = _client(access)
    conditional, created = True, True
    try:
        client.put_object(Bucket=access.bucket, Key=key, Body=data, IfNoneMatch="*",
                          ContentType="application/json")  # fmt: skip
    except ClientError as exc:
        code = str((exc.response.get("Error") or {}).get("Code"))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
            created = False
        elif code in ("NotImplemented", "InvalidArgument") or status == 501:
            conditional = False
            try:
                client.put_object(Bucket=access.bucket, Key=key, Body=data, ContentType="application/json")
            except (ClientError, BotoCoreError) as again:
                raise _store_error(again) from None
        else:
            raise _store_error(exc) from None
    except BotoCoreError as exc:
        raise _store_error(exc) from None
    return PutResult(created, conditional, _read_key(client, access.bucket, key))


async def inspect_prefix(access: StoreAccess, marker_key: str, evidence: tuple[str, ...]) -> PrefixContents:
    """On the store pool, within the call deadline (boto3 is blocking)."""
    return await bounded(access.namespace, lambda: _inspect(access, marker_key, evidence))


async def put_if_absent(access: StoreAccess, key: str, data: bytes) -> PutResult:
    return await bounded(access.namespace, lambda: _put_if_absent(access, key, data))


# --- small documents of the operator's own (backup.generations) ------------------------------------------


def _put(access: StoreAccess, key: str, data: bytes) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        _client(access).put_object(Bucket=access.bucket, Key=key, Body=data, ContentType="application/json")
    except (ClientError, BotoCoreError) as exc:
        raise _store_error(exc) from None


async def read_object(access: StoreAccess, key: str) -> bytes | None:
    """The object's bytes (at most 64 KiB), or None when there is none. On the store pool."""
    return await bounded(access.namespace, lambda: _read_key(_client(access), access.bucket, key))


async def put_object(access: StoreAccess, key: str, data: bytes) -> None:
    await bounded(access.namespace, lambda: _put(access, key, data))
