"""Recognising the API server's refusal to create objects in a namespace that is being deleted."""

from __future__ import annotations

from lightkube.core.exceptions import ApiError
from lightkube.models import meta_v1

from pg_operator.controller.reconcile import (
    cluster_mark,
    namespace_terminating,
    namespace_terminating_refusal,
)

# As kube-apiserver's NamespaceLifecycle admission answers a create in a terminating namespace.
REFUSAL = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": 'services "db-rw" is forbidden: unable to create new content in namespace t1 because it is '
    "being terminated",
    "reason": "Forbidden",
    "details": {
        "name": "db-rw",
        "kind": "services",
        "causes": [
            {
                "reason": "NamespaceTerminating",
                "message": "namespace t1 is being terminated",
                "field": "metadata.namespace",
            }
        ],
    },
    "code": 403,
}


def test_the_terminating_namespace_refusal_is_recognised() -> None:
    assert namespace_terminating_refusal(REFUSAL)


def test_it_is_recognised_by_the_cause_alone_or_by_the_message_alone() -> None:
    by_cause = {**REFUSAL, "message": "forbidden"}
    by_message = {k: v for k, v in REFUSAL.items() if k != "details"}
    assert namespace_terminating_refusal(by_cause)
    assert namespace_terminating_refusal(by_message)


def test_other_refusals_are_not_taken_for_it() -> None:
    rbac = {
        "code": 403,
        "reason": "Forbidden",
        "message": 'services "db-rw" is forbidden: User "system:serviceaccount:x:y" cannot patch resource',
        "details": {"name": "db-rw", "kind": "services"},
    }
    assert not namespace_terminating_refusal(rbac)
    # Same words, another code (e.g. a conflict that quotes them) is not the admission refusal.
    assert not namespace_terminating_refusal({**REFUSAL, "code": 409})
    assert not namespace_terminating_refusal({})


def test_a_cluster_version_is_its_uid_and_resource_version() -> None:
    body = {"metadata": {"name": "db", "uid": "u-1", "resourceVersion": "42"}}
    assert cluster_mark(body) == ("u-1", "42")
    changed = {"metadata": {"name": "db", "uid": "u-1", "resourceVersion": "43"}}
    recreated = {"metadata": {"name": "db", "uid": "u-2", "resourceVersion": "42"}}
    assert cluster_mark(changed) != cluster_mark(body)
    assert cluster_mark(recreated) != cluster_mark(body)
    assert cluster_mark(None) is None
    assert cluster_mark({"metadata": {"name": "db"}}) is None


def test_the_work_loop_and_the_reconciler_read_a_client_error_the_same_way() -> None:
    refused = ApiError(status=meta_v1.Status.from_dict(REFUSAL))
    forbidden = ApiError(
        status=meta_v1.Status.from_dict({**REFUSAL, "message": "RBAC: access denied", "details": {}})
    )
    assert namespace_terminating(refused)
    assert not namespace_terminating(forbidden)
