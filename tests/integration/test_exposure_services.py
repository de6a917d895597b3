"""spec.services against the real API server: the schema refuses what would take over a selector or the
operator's ownership; additional NodePort/LoadBalancer Services are created, kept (drift repaired) and
removed like the cluster's own; a foreign Service at an additional name is a conflict, never taken over."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness.kube import apply, condition, events_for, get_or_none, make_namespace
from harness.objects import CLUSTER_LABEL, cluster
from harness.operator_process import OperatorEnv, OperatorProcess, OperatorSpec
from harness.waiting import wait_until

OPERATOR = OperatorSpec("exposure", ("--resync-seconds", "8"))


@pytest.fixture
def namespace(operator_env: OperatorEnv) -> Any:
    ns = make_namespace(operator_env.kube, "exposure")
    yield ns
    operator_env.kube.kubectl("delete", "namespace", ns, "--wait=false")


def service(kube: Any, ns: str, name: str) -> dict[str, Any] | None:
    found = get_or_none(kube, "service", name, "-n", ns)
    return dict(found) if found is not None else None


def owned_by(obj: dict[str, Any] | None, uid: str) -> bool:
    refs = ((obj or {}).get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("controller") for r in refs)


def uid_of(kube: Any, ns: str, name: str) -> str:
    got = get_or_none(kube, "pgc", name, "-n", ns)
    assert got is not None
    return str(got["metadata"]["uid"])


def test_the_schema_refuses_operator_label_keys_and_operator_service_names(
    operator_env: OperatorEnv, namespace: str
) -> None:
    kube, ns = operator_env.kube, namespace
    attempts = [
        ({"labels": {CLUSTER_LABEL: "victim"}}, "labels: the operator's own label keys"),
        ({"labels": {"service.kubernetes.io/service-proxy-name": "none"}}, "labels: the operator's own"),
        ({"annotations": {"db.example.com/applied-hash": "x"}}, "annotations: the operator's own domain"),
        ({"additional": [{"name": "db-rw", "type": "NodePort"}]}, "one of the operator's own Service names"),
        ({"additional": [{"name": "ext", "target": "pooler-rw"}]}, "target pooler-rw needs spec.pooler"),
        (
            {
                "additional": [
                    {"name": "a", "type": "NodePort", "nodePort": 30555},
                    {"name": "b", "type": "NodePort", "nodePort": 30555},
                ]
            },
            "each nodePort may be used",
        ),
    ]
    for services, needle in attempts:
        body = cluster("db", ns, replicas=1, services=services)
        res = kube.kubectl(
            "apply", "--server-side", "--field-manager=test", "-f", "-", input=json.dumps(body), check=False
        )
        assert res.returncode != 0 and needle in res.stderr, (services, res.stderr)
    assert get_or_none(kube, "pgc", "db", "-n", ns) is None


def test_additional_services_are_created_kept_and_removed(
    operator_env: OperatorEnv, operator: OperatorProcess, namespace: str
) -> None:
    kube, ns, name = operator_env.kube, namespace, "db"
    services = {
        "labels": {"team": "payments"},
        "annotations": {"example.org/owner": "payments"},
        "additional": [
            {"name": "db-external", "type": "NodePort", "nodePort": 30543, "hosts": ["db.example.org"]},
            {
                "name": "db-lb",
                "target": "ro",
                "loadBalancerSourceRanges": ["10.0.0.0/8"],
                "annotations": {"service.beta.kubernetes.io/example": "internal"},
            },
        ],
    }
    apply(kube, cluster(name, ns, replicas=1, services=services))
    uid = uid_of(kube, ns, name)

    def owned(svc: str) -> dict[str, Any] | None:
        found = service(kube, ns, svc)
        return found if owned_by(found, uid) else None

    external = wait_until("db-external owned by the cluster", lambda: owned("db-external"), 60)
    assert external["spec"]["type"] == "NodePort"
    assert external["spec"]["ports"][0]["nodePort"] == 30543
    assert external["spec"]["selector"] == {
        "app.kubernetes.io/name": "postgresql",
        "app.kubernetes.io/instance": name,
        CLUSTER_LABEL: name,
        "role": "primary",
    }
    assert external["metadata"]["labels"]["team"] == "payments"
    lb = wait_until("db-lb owned by the cluster", lambda: owned("db-lb"), 60)
    assert lb["spec"]["type"] == "LoadBalancer" and lb["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    assert lb["metadata"]["annotations"]["service.beta.kubernetes.io/example"] == "internal"

    def labelled_rw() -> dict[str, Any] | None:
        found = service(kube, ns, f"{name}-rw")
        return found if found and "team" in found["metadata"].get("labels", {}) else None

    rw = wait_until("-rw with the tenant's label", labelled_rw, 60)
    assert rw["metadata"]["labels"][CLUSTER_LABEL] == name
    assert rw["metadata"]["annotations"]["example.org/owner"] == "payments"

    # Drift: someone points the Service elsewhere; the operator puts its selector back.
    kube.kubectl(
        "patch",
        "service",
        "db-external",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"selector":{"role":"replica"}}}',
    )

    def selector_role() -> str | None:
        role = (service(kube, ns, "db-external") or {}).get("spec", {}).get("selector", {}).get("role")
        return None if role is None else str(role)

    wait_until("the selector repaired", lambda: selector_role() == "primary", 60)

    # Removed from the spec: deleted.
    kube.kubectl(
        "patch",
        "pgc",
        name,
        "-n",
        ns,
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/spec/services/additional/1"}]',
    )
    wait_until("db-lb deleted", lambda: service(kube, ns, "db-lb") is None, 60)
    assert owned_by(service(kube, ns, "db-external"), uid)


def test_a_foreign_service_at_an_additional_name_is_a_conflict_not_a_takeover(
    operator_env: OperatorEnv, operator: OperatorProcess, namespace: str
) -> None:
    kube, ns, name = operator_env.kube, namespace, "shop"
    theirs_body = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "shop-public", "namespace": ns, "labels": {"team": "web"}},
        "spec": {
            "type": "ClusterIP",
            "selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        },
    }
    kube.kubectl("create", "-f", "-", input=json.dumps(theirs_body))
    before = service(kube, ns, "shop-public")
    extra = {"name": "shop-public", "type": "NodePort"}
    apply(kube, cluster(name, ns, replicas=1, services={"additional": [extra]}))

    def degraded() -> dict[str, Any] | None:
        cond = condition(get_or_none(kube, "pgc", name, "-n", ns), "Degraded")
        ok = cond.get("reason") == "Conflict" and "Service shop-public" in str(cond.get("message"))
        return cond if ok else None

    wait_until("Degraded Conflict naming Service shop-public", degraded, 60)

    def warned() -> bool:
        return any(
            e["reason"] == "Conflict" and e["type"] == "Warning" and "Service shop-public" in e["message"]
            for e in events_for(kube, ns, name)
        )

    wait_until("a Conflict Warning Event", warned, 30)
    wait_until("-rw written", lambda: service(kube, ns, f"{name}-rw") is not None, 30)
    assert service(kube, ns, "shop-public") == before  # not rewritten, not adopted

    # Once the spec no longer asks for it, the conflict clears and their Service stays.
    kube.kubectl(
        "patch", "pgc", name, "-n", ns, "--type=merge", "-p", '{"spec":{"services":{"additional":[]}}}'
    )

    def cleared() -> bool:
        return bool(
            condition(get_or_none(kube, "pgc", name, "-n", ns), "Degraded").get("reason") != "Conflict"
        )

    wait_until("the conflict cleared", cleared, 60)
    assert service(kube, ns, "shop-public") == before
