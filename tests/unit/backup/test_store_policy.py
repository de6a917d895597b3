"""What the operator allows itself with a tenant's object store (backup.store_policy), with plain dicts:
https unless allowed, credentials only from a Secret labelled for the cluster, deadlines, the page
limit, and the ownership verdict recorded in status."""

from __future__ import annotations

from typing import Any

import pytest

from pg_operator.api.cluster import PostgresCluster
from pg_operator.backup.store_policy import (
    BACKUP_CREDENTIALS_FIELD,
    BACKUP_ENDPOINT_FIELD,
    CREDENTIALS_MISSING,
    CREDENTIALS_UNLABELLED,
    INSECURE_ENDPOINT,
    RECOVERY_CREDENTIALS_FIELD,
    RECOVERY_ENDPOINT_FIELD,
    Deadline,
    OwnershipRecord,
    StoreLimits,
    after_page,
    credential_missing,
    credential_refusal,
    endpoint_refusal,
    recorded_ownership,
    spec_refusals,
    store_identity,
    trusts_record,
    without_refused_stores,
)
from pg_operator.specs.backup_pod import backup_refusals, recovery_refusals, wired_for_pods
from pg_operator.specs.statefulset import statefulset

LABEL = "db.example.com/cluster"


def s3(endpoint: str | None, creds: str = "s3-creds") -> dict[str, Any]:
    out: dict[str, Any] = {"bucket": "backups", "path": "prod", "credentials": {"secretName": creds}}
    if endpoint is not None:
        out["endpointURL"] = endpoint
    return out


# --- endpoints -------------------------------------------------------------------------------------------


def test_https_and_aws_default_are_allowed() -> None:
    assert (
        endpoint_refusal("https://minio.storage:9000", field=BACKUP_ENDPOINT_FIELD, allow_insecure=False)
        is None
    )
    assert endpoint_refusal(None, field=BACKUP_ENDPOINT_FIELD, allow_insecure=False) is None


def test_plain_http_is_refused_naming_the_field_unless_allowed() -> None:
    refusal = endpoint_refusal("http://10.0.0.9:8080", field=BACKUP_ENDPOINT_FIELD, allow_insecure=False)
    assert refusal is not None
    assert refusal.reason == INSECURE_ENDPOINT
    assert refusal.field == "spec.backup.s3.endpointURL"
    assert (
        "spec.backup.s3.endpointURL" in refusal.message
        and "--allow-insecure-object-stores" in refusal.message
    )
    assert endpoint_refusal("http://10.0.0.9:8080", field=BACKUP_ENDPOINT_FIELD, allow_insecure=True) is None


def test_other_schemes_are_refused_even_when_http_is_allowed() -> None:
    assert endpoint_refusal("ftp://x", field=BACKUP_ENDPOINT_FIELD, allow_insecure=True) is not None


# --- credentials -----------------------------------------------------------------------------------------


def test_a_secret_labelled_for_the_cluster_is_used() -> None:
    assert (
        credential_refusal({LABEL: "orders"}, cluster="orders", secret="s3", field=BACKUP_CREDENTIALS_FIELD)
        is None
    )


@pytest.mark.parametrize("labels", [{}, {LABEL: "other"}, {"app": "orders"}])
def test_a_secret_not_labelled_for_the_cluster_is_refused_naming_secret_and_field(
    labels: dict[str, str],
) -> None:
    refusal = credential_refusal(labels, cluster="orders", secret="db-admin", field=BACKUP_CREDENTIALS_FIELD)
    assert refusal is not None
    assert refusal.reason == CREDENTIALS_UNLABELLED
    assert "Secret db-admin" in refusal.message
    assert BACKUP_CREDENTIALS_FIELD in refusal.message
    assert f"{LABEL}=orders" in refusal.message


def test_a_missing_secret_is_left_to_the_read() -> None:
    assert credential_refusal(None, cluster="orders", secret="gone", field=BACKUP_CREDENTIALS_FIELD) is None


def test_a_secret_the_namespace_lacks_is_refused_naming_the_field_and_the_namespace_read() -> None:
    """What the read says when the cluster's namespace has no Secret of that name (one of another
    namespace's names, say): a refusal naming the field, not a failed store call."""
    refusal = credential_missing("shop", cluster="orders", secret="team-s3", field=RECOVERY_CREDENTIALS_FIELD)
    assert refusal.reason == CREDENTIALS_MISSING
    assert refusal.field == RECOVERY_CREDENTIALS_FIELD
    assert "Secret team-s3" in refusal.message and "namespace shop" in refusal.message
    assert RECOVERY_CREDENTIALS_FIELD in refusal.message and f"{LABEL}=orders" in refusal.message


def test_spec_refusals_cover_the_archive_and_the_recovery_source() -> None:
    spec = {
        "backup": {"s3": s3("http://evil:80", "db-admin")},
        "bootstrap": {"recovery": {"source": {"clusterName": "old", "s3": s3("https://s3", "old-creds")}}},
    }
    labels = {"db-admin": {}, "old-creds": {LABEL: "other"}}
    refusals = spec_refusals("orders", spec, secret_labels=labels.get, allow_insecure=False)
    assert {r.field for r in refusals} == {
        BACKUP_ENDPOINT_FIELD,
        BACKUP_CREDENTIALS_FIELD,
        RECOVERY_CREDENTIALS_FIELD,
    }
    kept = without_refused_stores(spec, refusals)
    assert "backup" not in kept and "recovery" not in kept["bootstrap"]
    assert (
        spec_refusals(
            "orders",
            {"backup": {"s3": s3("https://s3")}},
            secret_labels=lambda _: {LABEL: "orders"},
            allow_insecure=False,
        )
        == []
    )
    recovery_only = spec_refusals(
        "orders",
        {"bootstrap": {"recovery": {"source": {"s3": s3("http://s3")}}}},
        secret_labels=lambda _: {LABEL: "orders"},
        allow_insecure=False,
    )
    assert [r.field for r in recovery_only] == [RECOVERY_ENDPOINT_FIELD]


# --- the pods ---


def _cluster(endpoint: str) -> PostgresCluster:
    return PostgresCluster.from_obj({
        "apiVersion": "db.example.com/v1alpha1", "kind": "PostgresCluster",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u1", "generation": 1},
        "spec": {"replicas": 1, "version": "16", "storage": "1Gi",
                 "backup": {"s3": {**s3(endpoint, "db-admin"), "region": "us-east-1"}}},
    })  # fmt: skip


def _secret_refs(sts: dict[str, Any]) -> set[str]:
    containers = sts["spec"]["template"]["spec"]["containers"]
    return {
        e["valueFrom"]["secretKeyRef"]["name"]
        for c in containers
        for e in c.get("env") or ()
        if "secretKeyRef" in (e.get("valueFrom") or {})
    }


def test_pods_get_no_reference_to_an_unlabelled_secret() -> None:
    cluster = _cluster("https://s3.example")
    assert [r.reason for r in backup_refusals(cluster, labelled=lambda _: False, allow_insecure=False)] == [
        CREDENTIALS_UNLABELLED
    ]
    wired = wired_for_pods(cluster, labelled=lambda _: False, allow_insecure=False)
    assert wired.spec.backup is None
    assert "db-admin" not in _secret_refs(statefulset(wired))
    labelled = wired_for_pods(cluster, labelled=lambda name: name == "db-admin", allow_insecure=False)
    assert labelled is cluster
    assert "db-admin" in _secret_refs(statefulset(labelled))


def test_pods_get_no_plain_http_store_unless_allowed() -> None:
    cluster = _cluster("http://10.1.2.3:9000")
    assert wired_for_pods(cluster, labelled=lambda _: True, allow_insecure=False).spec.backup is None
    assert wired_for_pods(cluster, labelled=lambda _: True, allow_insecure=True) is cluster


def test_a_recovery_source_is_wired_only_from_a_labelled_secret_over_https() -> None:
    """A tenant who may not read a Secret names it as the recovery source's credentials (and its own
    plain-HTTP endpoint): the pods get neither; the sub-reconciler holds back a new cluster's StatefulSet."""
    source = {"clusterName": "old-db", "s3": {"bucket": "backups", "endpointURL": "http://10.9.9.9:9000",
                                              "credentials": {"secretName": "admin-keys"}}}  # fmt: skip
    spec = {"replicas": 1, "version": "16", "storage": "1Gi", "bootstrap": {"recovery": {"source": source}}}
    meta = {"name": "db", "namespace": "ns", "uid": "u"}
    restored = PostgresCluster.from_obj({"metadata": meta, "spec": spec})
    refused = recovery_refusals(restored, labelled=lambda _: False, allow_insecure=False)
    assert [(r.reason, r.field) for r in refused] == [
        (INSECURE_ENDPOINT, RECOVERY_ENDPOINT_FIELD),
        (CREDENTIALS_UNLABELLED, RECOVERY_CREDENTIALS_FIELD),
    ]
    wired = wired_for_pods(restored, labelled=lambda _: False, allow_insecure=False)
    assert wired.spec.bootstrap.recovery is None
    assert "admin-keys" not in _secret_refs(statefulset(wired))
    allowed = wired_for_pods(restored, labelled=lambda name: name == "admin-keys", allow_insecure=True)
    assert allowed is restored and "admin-keys" in _secret_refs(statefulset(allowed))


# --- deadlines and pages ---


def test_a_deadline_bounds_every_socket_operation() -> None:
    deadline = Deadline.after(30.0, now=100.0)
    assert deadline.remaining(110.0) == 20.0
    assert deadline.socket_timeout(110.0, cap=5.0) == 5.0
    assert deadline.socket_timeout(128.0, cap=5.0) == 2.0
    assert not deadline.expired(129.9)
    assert deadline.expired(130.0)
    assert deadline.remaining(200.0) == 0.0


def test_a_listing_stops_at_its_page_limit() -> None:
    assert after_page(1, truncated=True, limit=3) == "next"
    assert after_page(3, truncated=True, limit=3) == "cut"
    assert after_page(3, truncated=False, limit=3) == "done"
    assert after_page(1, truncated=False, limit=1) == "done"


def test_limits_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        StoreLimits(call_seconds=0)
    with pytest.raises(ValueError):
        StoreLimits(listing_pages=0)


# --- the verdict in status ---


def test_a_recorded_owned_verdict_is_trusted_only_for_the_same_identity() -> None:
    spec_backup = {"s3": s3("https://s3")}
    identity = store_identity("uid-1", "https://s3", "backups", "prod/orders/", spec_backup)
    record = OwnershipRecord(identity, "owned", "StorePrefixClaimed", "2026-12-05T08:00:00Z")
    status = {"backup": {"storeOwnership": record.to_status()}}
    assert recorded_ownership(status) == record
    assert trusts_record(recorded_ownership(status), identity)
    other = store_identity("uid-1", "https://s3", "backups", "prod/orders/", {"s3": s3("https://s3", "new")})
    assert other != identity
    assert not trusts_record(record, other)
    assert not trusts_record(OwnershipRecord(identity, "notOwned", "StorePrefixNotEmpty", "x"), identity)
    assert not trusts_record(None, identity)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "owned",
        {"verdict": "maybe", "identity": "a", "reason": "r", "checkedAt": "t"},
        {"verdict": "owned"},
    ],
)
def test_a_malformed_record_is_no_record(value: Any) -> None:
    assert recorded_ownership({"backup": {"storeOwnership": value}}) is None
    assert recorded_ownership({}) is None
