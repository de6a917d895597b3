"""A cluster writes only what it owns: which objects are the cluster's, which names it writes (checked
against every builder), what is set aside from a pass, what a child puts to use, the claims a pass keeps,
and which of Patroni's ConfigMaps may be adopted."""

from __future__ import annotations

from typing import Any

import pytest

from harness.objects import cluster_model as cluster
from pg_operator.controller.writes import Claims
from pg_operator.specs import desired_children, secret_names
from pg_operator.specs.ownership import (
    conflict_event,
    conflict_message,
    controlled_by,
    generated_names,
    holder,
    needs,
    patroni_may_have_created,
    set_aside,
)
from pg_operator.specs.pooler import auth_secret
from pg_operator.specs.pooler import children as pooler_children
from pg_operator.specs.roles import role_secret
from pg_operator.specs.tls import tls_secret_names

UID = "uid-1"
PG = "db.example.com/v1alpha1"


def ref(uid: str = UID, *, controller: bool = True, kind: str = "PostgresCluster",
        api_version: str = PG, name: str = "orders-db") -> dict[str, Any]:  # fmt: skip
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": controller}


def obj(kind: str, name: str, *refs: dict[str, Any], api_version: str = "v1", **meta: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "ownerReferences": list(refs), **meta}}  # fmt: skip


def test_only_the_controller_reference_with_the_clusters_uid_makes_an_object_its() -> None:
    assert controlled_by(obj("ConfigMap", "x", ref()), UID)
    assert not controlled_by(obj("ConfigMap", "x"), UID)  # no owner at all: an admin's object
    assert not controlled_by(obj("ConfigMap", "x", ref("old-uid")), UID)  # an earlier cluster of the name
    assert not controlled_by(obj("ConfigMap", "x", ref(controller=False)), UID)  # Patroni's, adopted
    assert not controlled_by(obj("ConfigMap", "x", ref(kind="Deployment", api_version="apps/v1")), UID)
    assert not controlled_by(obj("ConfigMap", "x", ref(api_version="other.example.com/v1")), UID)
    assert not controlled_by(obj("ConfigMap", "x", ref("")), "")  # a cluster without uid owns nothing
    assert not controlled_by(None, UID)


def test_the_holder_is_said_in_names_only() -> None:
    assert holder(obj("ConfigMap", "x")) == "no owner"
    assert holder(obj("ConfigMap", "x", ref("old"))) == (
        "controlled by another PostgresCluster orders-db (uid old)"
    )
    assert holder(obj("Secret", "x", ref(kind="ExternalSecret", api_version="e.io/v1", name="s"))) == (
        "controlled by ExternalSecret s"
    )
    assert holder(obj("ConfigMap", "x", ref(controller=False))) == (
        "owned by PostgresCluster orders-db, no controller"
    )


@pytest.mark.parametrize("spec", [
    {},
    {"replicas": 1},
    {"pooler": {"readOnly": True, "instances": 2}},
    {"roles": [{"name": "orders"}, {"name": "readers", "login": False},
               {"name": "own", "passwordSecret": {"name": "mine"}}]},
])  # fmt: skip
def test_generated_names_hold_every_object_any_builder_makes(spec: dict[str, Any]) -> None:
    """The drift check: every child, pooler object and Secret the builders make is among the names at
    which a foreign object is set aside (a new builder must add its names there)."""
    c = cluster(**spec)
    made = [*desired_children(c), *pooler_children(c)]
    made_ids = {(o["apiVersion"], o["kind"], o["metadata"]["name"]) for o in made}
    secrets = [*secret_names(c), *tls_secret_names(c), auth_secret(c, "pw")["metadata"]["name"]]
    made_ids |= {("v1", "Secret", n) for n in secrets}
    for role in c.spec.roles or ():
        if role.login and role.password_secret is None:
            made_ids.add(("v1", "Secret", role_secret(c, role.name, "pw", None)["metadata"]["name"]))
    assert made_ids <= generated_names(c)
    # a Secret the user names is read, never the cluster's to write
    assert ("v1", "Secret", "mine") not in generated_names(c)
    # Patroni's ConfigMaps are not the cluster's children (adopted, never controlled)
    assert not {n for n in generated_names(c) if n[2].endswith(("-leader", "-config", "-sync"))}


def test_a_pdb_on_one_instance_and_the_pooler_when_off_are_still_the_clusters_names() -> None:
    c = cluster(replicas=1)
    names = generated_names(c)
    assert ("policy/v1", "PodDisruptionBudget", "orders-db") in names
    assert ("apps/v1", "Deployment", "orders-db-pooler-rw") in names
    assert ("v1", "Secret", "orders-db-pooler-auth") in names


def test_foreign_objects_at_the_clusters_names_are_set_aside_and_the_rest_stays() -> None:
    c = cluster()
    ours = obj("ConfigMap", "orders-db-instance", ref())
    admins = obj("NetworkPolicy", "orders-db", api_version="networking.k8s.io/v1")
    patroni = obj("ConfigMap", "orders-db-leader", ref(controller=False))
    users = obj("Secret", "orders-tls")  # named in spec.tls: read, not written
    old = obj("Secret", "orders-db-app", ref("old-uid"))
    children: dict[tuple[str, str], list[dict[str, Any]]] = {
        ("v1", "ConfigMap"): [ours, patroni], ("networking.k8s.io/v1", "NetworkPolicy"): [admins],
        ("v1", "Secret"): [users, old], ("v1", "Pod"): [obj("Pod", "orders-db-0")]}  # fmt: skip
    kept, foreign = set_aside(children, UID, generated_names(c))
    assert kept[("v1", "ConfigMap")] == [ours, patroni]
    assert kept[("networking.k8s.io/v1", "NetworkPolicy")] == []
    assert kept[("v1", "Secret")] == [users]
    assert kept[("v1", "Pod")] == children[("v1", "Pod")]
    assert set(foreign) == {
        ("networking.k8s.io/v1", "NetworkPolicy", "orders-db"),
        ("v1", "Secret", "orders-db-app"),
    }


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind)


def test_the_statefulset_needs_what_its_pods_use_and_the_fence_around_them() -> None:
    c = cluster()
    children = desired_children(c)
    got = needs(by_kind(children, "StatefulSet"), children)
    assert got == {
        ("v1", "ServiceAccount", "orders-db-instance"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", "orders-db-instance"),
        ("rbac.authorization.k8s.io/v1", "Role", "orders-db-instance"),
        ("v1", "ConfigMap", "orders-db-instance"),
        ("v1", "Secret", "orders-db-superuser"), ("v1", "Secret", "orders-db-replication"),
        ("v1", "Secret", "orders-db-app"), ("v1", "Secret", "orders-db-patroni-api"),
        ("v1", "Secret", "orders-db-server-tls"),
        ("networking.k8s.io/v1", "NetworkPolicy", "orders-db"),
    }  # fmt: skip
    # Services, the budget: the pods run without putting them to use
    assert not {i for i in got if i[1] in ("Service", "PodDisruptionBudget")}


def test_without_its_network_policy_the_statefulset_needs_none() -> None:
    c = cluster(networkPolicy={"enabled": False})
    children = desired_children(c)
    assert not {i for i in needs(by_kind(children, "StatefulSet"), children) if i[1] == "NetworkPolicy"}


def test_a_role_binding_needs_its_role_and_account_and_nothing_else_needs_anything() -> None:
    children = desired_children(cluster())
    assert needs(by_kind(children, "RoleBinding"), children) == {
        ("rbac.authorization.k8s.io/v1", "Role", "orders-db-instance"),
        ("v1", "ServiceAccount", "orders-db-instance")}  # fmt: skip
    for kind in ("ServiceAccount", "Role", "ConfigMap", "Service", "PodDisruptionBudget", "NetworkPolicy"):
        assert needs(by_kind(children, kind), children) == set(), kind


def test_the_poolers_deployments_need_their_secrets_and_their_policy() -> None:
    c = cluster(pooler={})
    children = [*desired_children(c), *pooler_children(c)]
    got = needs(by_kind(pooler_children(c), "Deployment"), children)
    assert ("v1", "Secret", "orders-db-pooler-auth") in got
    assert ("v1", "Secret", "orders-db-server-tls") in got
    assert ("networking.k8s.io/v1", "NetworkPolicy", "orders-db-pooler") in got
    assert ("networking.k8s.io/v1", "NetworkPolicy", "orders-db") not in got  # the instances' fence


def test_env_and_projected_references_count() -> None:
    env = [
        {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s2", "key": "k"}}},
        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c2", "key": "k"}}},
    ]
    env_from = [{"secretRef": {"name": "s3"}}, {"configMapRef": {"name": "c3"}}]
    projected = {"sources": [{"secret": {"name": "s1"}}, {"configMap": {"name": "c1"}}]}
    pod = {
        "volumes": [{"name": "p", "projected": projected}],
        "containers": [{"name": "x", "env": env, "envFrom": env_from}],
    }
    workload = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"template": {"spec": pod}}}
    assert needs(workload, []) == {("v1", "Secret", f"s{i}") for i in (1, 2, 3)} | {
        ("v1", "ConfigMap", f"c{i}") for i in (1, 2, 3)
    }


def test_claims_record_a_conflict_once_a_write_meets_a_foreign_object() -> None:
    np = ("networking.k8s.io/v1", "NetworkPolicy", "orders-db")
    app = ("v1", "Secret", "orders-db-app")
    claims = Claims("shop", UID, {np: obj("NetworkPolicy", "orders-db", api_version=np[0])})
    assert claims.conflicts == {}  # set aside, not yet a conflict: nothing tried to write it
    assert claims.blocked(np) and claims.conflicts == {np: "no owner"}
    assert not claims.blocked(app)
    claims.found(app, obj("Secret", "orders-db-app", ref("old")))
    assert claims.blocked(app)
    assert claims.foreign_among([np, app, ("v1", "ConfigMap", "orders-db-instance")]) == {np, app}
    assert claims.ours(obj("Secret", "x", ref())) and not claims.ours(obj("Secret", "x", ref("old")))


def test_the_conflict_message_names_each_object_and_what_waits() -> None:
    np = ("networking.k8s.io/v1", "NetworkPolicy", "default-deny")
    cm = ("v1", "ConfigMap", "default-deny-instance")
    sts = ("apps/v1", "StatefulSet", "default-deny")
    message = conflict_message({np: "no owner", cm: "no owner"}, {sts: {cm, np}})
    assert message == (
        "NetworkPolicy default-deny exists and is not this cluster's (no owner): left alone; "
        "ConfigMap default-deny-instance exists and is not this cluster's (no owner): left alone; "
        "StatefulSet default-deny not written: it would use NetworkPolicy default-deny, "
        "ConfigMap default-deny-instance; rename the cluster or remove the objects"
    )
    assert conflict_event(np, "no owner").startswith(
        "NetworkPolicy default-deny exists and is not this cluster's"
    )


def test_patroni_configmaps_are_adopted_only_when_created_after_the_cluster_without_an_owner() -> None:
    cluster_body = {"metadata": {"creationTimestamp": "2026-12-05T10:00:00Z"}}

    def cm(created: str | None, *refs: dict[str, Any]) -> dict[str, Any]:
        meta = {"creationTimestamp": created} if created else {}
        return obj("ConfigMap", "orders-db-leader", *refs, **meta)

    assert patroni_may_have_created(cm("2026-12-05T10:00:07Z"), cluster_body)
    assert not patroni_may_have_created(cm("2026-12-05T09:59:00Z"), cluster_body)  # there before
    assert not patroni_may_have_created(cm("2026-12-05T10:00:00Z"), cluster_body)  # the same second
    assert not patroni_may_have_created(cm("2026-12-05T10:00:07Z", ref("old")), cluster_body)  # owned
    assert not patroni_may_have_created(cm(None), cluster_body)
    assert not patroni_may_have_created(cm("2026-12-05T10:00:07Z"), {"metadata": {}})
