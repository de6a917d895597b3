"""`pg-operator run` on a fresh cluster: a Lease namespace that does not exist is told apart from a
Lease that does not exist yet, and ends the run with one line saying what to do."""

from __future__ import annotations

from lightkube.models.meta_v1 import Status, StatusDetails

from pg_operator.controller.lease import LeaseNamespaceMissing, missing_namespace


def test_a_missing_namespace_is_named() -> None:
    status = Status(
        code=404,
        reason="NotFound",
        message='namespaces "pg-operator-system" not found',
        details=StatusDetails(kind="namespaces", name="pg-operator-system"),
    )
    assert missing_namespace(status) == "pg-operator-system"


def test_a_missing_lease_or_another_failure_is_not() -> None:
    lease = Status(
        code=404, details=StatusDetails(kind="leases", name="pg-operator-leader", group="coordination.k8s.io")
    )
    assert missing_namespace(lease) is None
    assert missing_namespace(Status(code=403, details=StatusDetails(kind="namespaces", name="x"))) is None
    assert missing_namespace(Status(code=404)) is None
    assert missing_namespace(None) is None


def test_the_line_says_what_to_do() -> None:
    text = str(LeaseNamespaceMissing("pg-operator-system"))
    assert "\n" not in text
    assert 'namespace "pg-operator-system" for the leader Lease does not exist' in text
    assert "kubectl create namespace pg-operator-system" in text and "--lease-namespace" in text
