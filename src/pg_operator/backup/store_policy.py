"""What the operator allows itself when it calls a tenant's object store, as pure decisions: the limits
of each call (an overall deadline, not only a socket timeout, and a page limit on listings), which
endpoints it talks to (https unless the install allows plain HTTP), which Secrets it takes credentials
from (only those labelled for the cluster), and the ownership verdict it records in the cluster's status
so a restarted operator does not ask every store at once.

A tenant's `spec.backup` is hostile input: the endpoint is a server of the tenant's choosing, and the
access key id travels in the Authorization header of every request. Hence the same label rule as for
the user-named password Secrets (controller/reconcilers/credentials.py): a Secret is used only when whoever
may write Secrets labelled it for this cluster."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from pg_operator.api.constants import CLUSTER_LABEL

# Field paths, as the refusals name them.
BACKUP_ENDPOINT_FIELD = "spec.backup.s3.endpointURL"
BACKUP_CREDENTIALS_FIELD = "spec.backup.s3.credentials.secretName"
RECOVERY_ENDPOINT_FIELD = "spec.bootstrap.recovery.source.s3.endpointURL"
RECOVERY_CREDENTIALS_FIELD = "spec.bootstrap.recovery.source.s3.credentials.secretName"

# Degraded/ContinuousArchiving reasons (docs/architecture.md).
INSECURE_ENDPOINT = "BackupEndpointInsecure"
CREDENTIALS_UNLABELLED = "BackupCredentialUnlabelled"
CREDENTIALS_MISSING = "BackupCredentialMissing"
STORE_TIMEOUT = "StoreTimeout"


@dataclass(frozen=True)
class StoreLimits:
    """The operator's flags for store calls (cli/main.py). `call_seconds` bounds one call from the
    first connect to the last byte of its last request (retries included); `listing_seconds` one
    listing (the finalizer's, barman-cloud-backup-list in a pod); `listing_pages` how many pages
    (≤ 1000 keys each) one listing reads before it stops and the reconcile comes back."""

    call_seconds: float = 30.0
    listing_seconds: float = 120.0
    listing_pages: int = 100
    allow_insecure: bool = False
    connect_seconds: float = 5.0
    max_response_bytes: int = 8 * 1024 * 1024  # a page of 1000 keys is well under 1 MiB

    def __post_init__(self) -> None:
        if self.call_seconds <= 0 or self.listing_seconds <= 0:
            raise ValueError("store deadlines must be positive")
        if self.listing_pages < 1:
            raise ValueError("the listing page limit must be at least 1")


@dataclass(frozen=True)
class Refusal:
    """Why the operator will not call a store (or wire its credentials into pods); names the field."""

    reason: str
    field: str
    message: str

    def as_problem(self) -> tuple[str, str]:
        return self.reason, self.message


# --- endpoints -------------------------------------------------------------------------------------------


def endpoint_refusal(endpoint_url: str | None, *, field: str, allow_insecure: bool) -> Refusal | None:
    """None when the operator may send credentials to this endpoint. Unset is AWS S3 itself (https)."""
    if endpoint_url is None:
        return None
    scheme = urlsplit(endpoint_url).scheme.lower()
    if scheme == "https":
        return None
    if scheme == "http" and allow_insecure:
        return None
    if scheme == "http":
        return Refusal(
            INSECURE_ENDPOINT,
            field,
            f"{field} {endpoint_url} is plain HTTP: credentials would travel unencrypted to it; use an "
            "https:// endpoint (plain HTTP only where the operator runs with --allow-insecure-object-stores)",
        )
    return Refusal(INSECURE_ENDPOINT, field, f"{field} {endpoint_url}: only https:// endpoints are used")


# --- credentials -----------------------------------------------------------------------------------------


def credential_refusal(
    secret_labels: Mapping[str, str] | None, *, cluster: str, secret: str, field: str
) -> Refusal | None:
    """None when the Secret carries `db.example.com/cluster: <cluster>`. A missing Secret (None) is not
    refused here: the read reports it."""
    if secret_labels is None or secret_labels.get(CLUSTER_LABEL) == cluster:
        return None
    return Refusal(
        CREDENTIALS_UNLABELLED,
        field,
        f"Secret {secret} ({field}) exists without the label {CLUSTER_LABEL}={cluster}: the operator uses "
        "backup credentials only from Secrets labelled for this cluster, and sends nothing meanwhile; "
        "label it to have it used",
    )


def credential_missing(namespace: str, *, cluster: str, secret: str, field: str) -> Refusal:
    """The named Secret is not in the cluster's namespace, the only one it is read from (a Secret of that
    name in another namespace is never looked at): said as a refusal naming the field, not as a failed
    store call, since nothing was sent."""
    return Refusal(
        CREDENTIALS_MISSING,
        field,
        f"Secret {secret} ({field}) does not exist in namespace {namespace}: backup credentials are read "
        f"only from a Secret of the cluster's own namespace labelled {CLUSTER_LABEL}={cluster}, and nothing "
        "is sent meanwhile",
    )


def _s3_sets(spec: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], str, str]]:
    """(s3 mapping, endpoint field, credentials field) of spec.backup and the recovery source."""
    out: list[tuple[Mapping[str, Any], str, str]] = []
    own = (spec.get("backup") or {}).get("s3")
    if isinstance(own, Mapping):
        out.append((own, BACKUP_ENDPOINT_FIELD, BACKUP_CREDENTIALS_FIELD))
    source = (((spec.get("bootstrap") or {}).get("recovery") or {}).get("source") or {}).get("s3")
    if isinstance(source, Mapping):
        out.append((source, RECOVERY_ENDPOINT_FIELD, RECOVERY_CREDENTIALS_FIELD))
    return out


def spec_refusals(
    cluster_name: str,
    spec: Mapping[str, Any],
    *,
    secret_labels: Callable[[str], Mapping[str, str] | None],
    allow_insecure: bool,
) -> list[Refusal]:
    """Every refusal of a cluster's stores (its own archive and a recovery source), before anything is
    sent or wired into a pod. `secret_labels(name)`: the Secret's labels, None when there is none."""
    refusals: list[Refusal] = []
    for s3, endpoint_field, credentials_field in _s3_sets(spec):
        endpoint = s3.get("endpointURL")
        refused = endpoint_refusal(None if endpoint is None else str(endpoint), field=endpoint_field,
                                   allow_insecure=allow_insecure)  # fmt: skip
        if refused is not None:
            refusals.append(refused)
        secret = str((s3.get("credentials") or {}).get("secretName") or "")
        if secret:
            refused = credential_refusal(secret_labels(secret), cluster=cluster_name, secret=secret,
                                         field=credentials_field)  # fmt: skip
            if refused is not None:
                refusals.append(refused)
    return refusals


def without_refused_stores(spec: Mapping[str, Any], refusals: list[Refusal]) -> dict[str, Any]:
    """The spec the pods are built from: a refused `spec.backup` or recovery source left out, so no pod
    gets a refused Secret's values or an endpoint to send them to."""
    out = dict(spec)
    fields = {r.field for r in refusals}
    if fields & {BACKUP_ENDPOINT_FIELD, BACKUP_CREDENTIALS_FIELD}:
        out.pop("backup", None)
    if fields & {RECOVERY_ENDPOINT_FIELD, RECOVERY_CREDENTIALS_FIELD}:
        bootstrap = dict(out.get("bootstrap") or {})
        bootstrap.pop("recovery", None)
        out["bootstrap"] = bootstrap
    return out


# --- deadlines and pages ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deadline:
    """An instant on the monotonic clock by which a whole call must be done."""

    ends_at: float

    @classmethod
    def after(cls, seconds: float, now: float) -> Deadline:
        return cls(now + seconds)

    def remaining(self, now: float) -> float:
        return max(0.0, self.ends_at - now)

    def expired(self, now: float) -> bool:
        return now >= self.ends_at

    def socket_timeout(self, now: float, cap: float) -> float:
        """A socket operation's timeout: never past the deadline, never more than `cap`."""
        return min(cap, self.remaining(now))


PageStep = Literal["next", "done", "cut"]


def after_page(pages_read: int, truncated: bool, limit: int) -> PageStep:
    """After a listing's page: read the next one, done (the store has no more), or cut at the limit (the
    caller comes back on a later reconcile rather than reading an unbounded listing in one call)."""
    if not truncated:
        return "done"
    return "next" if pages_read < limit else "cut"


# --- the ownership verdict recorded in status ------------------------------------------------------------

# status.backup's key for it (api/backup.py StoreOwnershipStatus).
OWNERSHIP_STATUS_KEY = "storeOwnership"


def store_identity(uid: str, endpoint_url: str | None, bucket: str, prefix: str, spec_backup: Any) -> str:
    """A digest of what a verdict holds for: the cluster, the store, and `spec.backup` as written (another
    Secret name, endpoint or path is another identity)."""
    written = json.dumps(spec_backup, sort_keys=True, default=str)
    raw = "\n".join((uid, endpoint_url or "", bucket, prefix, written))
    return hashlib.sha256(raw.encode()).hexdigest()


OwnershipVerdict = Literal["owned", "notOwned"]


@dataclass(frozen=True)
class OwnershipRecord:
    """One recorded verdict: for which identity, "owned" or not, the reason, and when (RFC 3339)."""

    identity: str
    verdict: OwnershipVerdict
    reason: str
    checked_at: str

    def to_status(self) -> dict[str, str]:
        return {"identity": self.identity, "verdict": self.verdict, "reason": self.reason,
                "checkedAt": self.checked_at}  # fmt: skip

    @classmethod
    def from_status(cls, value: Any) -> OwnershipRecord | None:
        """The record in `status.backup.storeOwnership`; None when absent or not one."""
        if not isinstance(value, Mapping):
            return None
        verdict = value.get("verdict")
        identity, reason, at = value.get("identity"), value.get("reason"), value.get("checkedAt")
        texts = (identity, reason, at)
        if verdict not in ("owned", "notOwned") or not all(isinstance(v, str) for v in texts):
            return None
        return cls(str(identity), verdict, str(reason), str(at))


def recorded_ownership(status: Mapping[str, Any] | None) -> OwnershipRecord | None:
    backup = (status or {}).get("backup")
    if not isinstance(backup, Mapping):
        return None
    return OwnershipRecord.from_status(backup.get(OWNERSHIP_STATUS_KEY))


def trusts_record(record: OwnershipRecord | None, identity: str) -> bool:
    """A recorded "owned" verdict for the same identity stands (no request) until an event doubts it; any
    other verdict, or another identity, is asked of the store again."""
    return record is not None and record.verdict == "owned" and record.identity == identity
