"""A cluster writes only what it owns (issue #34), against the real API server and garbage collector.

The reported attack: an admin's NetworkPolicy `default-deny` (deny all, every pod) and a ConfigMap
`default-deny-instance` exist in a namespace; a PostgresCluster named `default-deny` is created there.
The operator must leave both (and a Secret `default-deny-app` someone put there, labelled like the
cluster's) exactly as they were — not rewritten, not merged into, no owner reference, not deleted with
the cluster — report the conflict (Degraded `Conflict`, a Warning Event per object) and still write the
cluster's other objects. Also: a foreign PodDisruptionBudget at the cluster's name is neither adopted
while the cluster wants one nor deleted once it does not, and the API server facts the write path rests
on (a uid in an apply body is a precondition; an apply carrying resourceVersion "1" only creates; a POST
never takes over)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
from lightkube import KubeConfig
from lightkube.core.exceptions import ApiError

from harness.kube import apply, condition, events_for, get_json, get_or_none, make_namespace
from harness.objects import CLUSTER_LABEL, cluster
from harness.operator_process import OperatorEnv, OperatorProcess, OperatorSpec, reconcile_passes
from harness.waiting import wait_until
from pg_operator.controller.kube_api import CREATE_ONLY_VERSION, Api, resource_for
from pg_operator.controller.metrics import Metrics
from pg_operator.controller.writes import Claims, Made, uid_refused
from pg_operator.controller.writes import create as create_owned
from pg_operator.specs.ownership import ObjectId

RESYNC = 8.0
OPERATOR = OperatorSpec("ownership", ("--resync-seconds", str(RESYNC)))
PG_API = "db.example.com/v1alpha1"


def create(kube: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """`kubectl create` as an admin would (a plain POST), the object as stored."""
    kube.kubectl("create", "-f", "-", input=json.dumps(obj))
    meta = obj["metadata"]
    return dict(get_json(kube, KUBECTL_NAMES[obj["kind"]], meta["name"], "-n", meta["namespace"]))


KUBECTL_NAMES = {
    "NetworkPolicy": "networkpolicies.networking.k8s.io",
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "PodDisruptionBudget": "poddisruptionbudgets.policy",
    "StatefulSet": "statefulsets.apps",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles.rbac.authorization.k8s.io",
    "RoleBinding": "rolebindings.rbac.authorization.k8s.io",
    "Service": "services",
}


def admins_objects(ns: str, name: str) -> list[dict[str, Any]]:
    deny_all = {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
    }  # fmt: skip
    config = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": f"{name}-instance", "namespace": ns},
              "data": {"owner": "the platform admin", "instance.yaml": "not the operator's"}}  # fmt: skip
    # Labelled like the cluster's (so in the operator's watch cache) but not created by it: the old code
    # would have set this password on the database and rewritten its keys.
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": f"{name}-app", "namespace": ns, "labels": {CLUSTER_LABEL: name}},
              "stringData": {"username": "app", "password": "chosen-by-someone-else"}}  # fmt: skip
    return [deny_all, config, secret]


def same(before: dict[str, Any], kube: Any) -> dict[str, Any] | None:
    """The object as it is now, if it is byte for byte what it was (resourceVersion, owners, content)."""
    now = get_or_none(kube, KUBECTL_NAMES[before["kind"]], before["metadata"]["name"], "-n",
                      before["metadata"]["namespace"])  # fmt: skip
    return now if now == before else None


def assert_untouched(kube: Any, originals: list[dict[str, Any]]) -> None:
    for before in originals:
        now = get_or_none(kube, KUBECTL_NAMES[before["kind"]], before["metadata"]["name"], "-n",
                          before["metadata"]["namespace"])  # fmt: skip
        what = f"{before['kind']} {before['metadata']['name']}"
        assert now is not None, f"{what} was deleted"
        assert now["metadata"].get("ownerReferences") is None, f"{what} got an owner: {now['metadata']}"
        assert now == before, f"{what} changed:\nbefore {json.dumps(before)}\nnow    {json.dumps(now)}"


def pgc(kube: Any, ns: str, name: str) -> dict[str, Any]:
    return dict(get_json(kube, "pgc", name, "-n", ns))


def wait_degraded(kube: Any, ns: str, name: str, *needles: str, timeout: float = 60) -> dict[str, Any]:
    def reported() -> dict[str, Any] | None:
        obj = pgc(kube, ns, name)
        degraded = condition(obj, "Degraded")
        message = str(degraded.get("message") or "")
        ok = degraded.get("status") == "True" and degraded.get("reason") == "Conflict"
        return obj if ok and all(n in message for n in needles) else None

    return dict(wait_until(f"{ns}/{name} Degraded Conflict naming {needles}", reported, timeout))


def ours(obj: dict[str, Any] | None, cluster_uid: str) -> bool:
    refs = ((obj or {}).get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == cluster_uid and r.get("controller") for r in refs)


@pytest.fixture
def namespace(operator_env: OperatorEnv) -> Any:
    ns = make_namespace(operator_env.kube, "owned")
    yield ns
    operator_env.kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_an_admins_objects_at_the_clusters_names_survive_the_cluster_and_its_deletion(
    operator_env: OperatorEnv, operator: OperatorProcess, namespace: str
) -> None:
    kube, ns, name = operator_env.kube, namespace, "default-deny"
    originals = [create(kube, obj) for obj in admins_objects(ns, name)]
    apply(kube, cluster(name, ns, replicas=1))
    body = wait_degraded(kube, ns, name, f"NetworkPolicy {name} ", f"ConfigMap {name}-instance ",
                         f"Secret {name}-app ", f"StatefulSet {name} not written")  # fmt: skip
    uid = body["metadata"]["uid"]
    assert body["status"]["phase"] == "Degraded: Conflict"
    message = condition(body, "Degraded")["message"]
    assert "exists and is not this cluster's (no owner)" in message

    # One Warning per foreign object, naming its kind and name.
    def warned() -> bool:
        said = [e["message"] for e in events_for(kube, ns, name) if e["reason"] == "Conflict"
                and e["type"] == "Warning"]  # fmt: skip
        return all(
            any(m.startswith(f"{what} exists and is not this cluster's") for m in said)
            for what in (f"NetworkPolicy {name}", f"ConfigMap {name}-instance", f"Secret {name}-app")
        )

    wait_until("a Conflict Warning naming each foreign object", warned, 30)

    # The cluster keeps writing what is its own; the StatefulSet, whose pods would mount the admin's
    # ConfigMap and the foreign Secret and run outside the fence they are promised, waits.
    for kind, child in [("ServiceAccount", f"{name}-instance"), ("Role", f"{name}-instance"),
                        ("RoleBinding", f"{name}-instance"), ("Service", name), ("Service", f"{name}-rw"),
                        ("Service", f"{name}-ro"), ("Service", f"{name}-r"), ("Secret", f"{name}-superuser"),
                        ("Secret", f"{name}-replication"), ("Secret", f"{name}-patroni-api"),
                        ("Secret", f"{name}-ca"), ("Secret", f"{name}-server-tls")]:  # fmt: skip
        wait_until(
            f"{kind} {child} of the cluster",
            lambda k=kind, c=child: ours(get_or_none(kube, KUBECTL_NAMES[k], c, "-n", ns), uid),
            30,
        )
    assert get_or_none(kube, KUBECTL_NAMES["StatefulSet"], name, "-n", ns) is None

    # Created by create-only applies, the children carry one field manager entry of the operator's, an
    # apply's: later applies can remove what they stop setting.
    account = get_json(kube, "serviceaccount", f"{name}-instance", "-n", ns, "--show-managed-fields")
    entries = [(e["manager"], e["operation"]) for e in account["metadata"]["managedFields"]]
    assert entries == [("pg-operator", "Apply")], entries

    # Several passes later (resyncs, and the cluster's own changes) nothing of the admin's moved, and
    # the operator no longer even tries: what it met stays known for a while (FOREIGN_KNOWN_SECONDS).
    mark = operator_env.audit.mark()
    before = reconcile_passes(operator)
    wait_until("three more passes", lambda: reconcile_passes(operator) >= before + 3, RESYNC * 4)
    assert_untouched(kube, originals)
    tried = operator_env.audit.requests_since(mark, namespace=ns)
    assert not {
        k
        for k in tried
        if k[1] in ("networkpolicies", "configmaps", "secrets") and k[0] != "list" and k[0] != "watch"
    }, tried

    kube.kubectl("delete", "pgc", name, "-n", ns)
    wait_until("the cluster's own objects to be garbage-collected",
               lambda: get_or_none(kube, "serviceaccount", f"{name}-instance", "-n", ns) is None
               and get_or_none(kube, "secret", f"{name}-superuser", "-n", ns) is None, 90)  # fmt: skip
    time.sleep(3)  # the garbage collector had its chance at anything that named the cluster
    assert_untouched(kube, originals)


def test_a_foreign_budget_at_the_clusters_name_is_neither_adopted_nor_deleted_when_undesired(
    operator_env: OperatorEnv, operator: OperatorProcess, namespace: str
) -> None:
    """Two instances want a PDB `<name>`: someone else's is there, so it is a conflict (the instances
    run regardless). Scaled to one, the cluster wants none: the old code deleted the budget it had
    adopted; now it was never the cluster's, and stays."""
    kube, ns, name = operator_env.kube, namespace, "solo"
    budget = create(kube, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": ns, "labels": {"team": "platform"}},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "payments"}}},
    })  # fmt: skip
    apply(kube, cluster(name, ns, replicas=2))
    uid = wait_degraded(kube, ns, name, f"PodDisruptionBudget {name} ")["metadata"]["uid"]
    wait_until(
        "the StatefulSet (a budget is no pod's dependency)",
        lambda: ours(get_or_none(kube, KUBECTL_NAMES["StatefulSet"], name, "-n", ns), uid),
        30,
    )
    assert_untouched(kube, [budget])

    kube.kubectl("patch", "pgc", name, "-n", ns, "--type=merge", "-p", '{"spec":{"replicas":1}}')

    def recovered() -> bool:
        degraded = condition(pgc(kube, ns, name), "Degraded")
        sts = get_or_none(kube, KUBECTL_NAMES["StatefulSet"], name, "-n", ns) or {}
        return degraded.get("status") == "False" and (sts.get("spec") or {}).get("replicas") == 1

    wait_until("one instance and no conflict left", recovered, 60)
    before = reconcile_passes(operator)
    wait_until("two more passes", lambda: reconcile_passes(operator) >= before + 2, RESYNC * 3)
    assert_untouched(kube, [budget])
    reasons = [e["reason"] for e in events_for(kube, ns, name)]
    assert "Recovered" in reasons


def test_the_api_server_checks_the_preconditions_the_write_path_sends(
    operator_env: OperatorEnv, namespace: str
) -> None:
    """What controller/writes.py rests on, on this API server: an apply carrying the uid of the object
    it means is refused when another object holds the name, or none does (it never creates); with the
    right uid it applies. An apply carrying resourceVersion "1" (kube_api.CREATE_ONLY_VERSION) is refused
    by an existing object, even forced, and creates a missing one with an apply's field manager entry.
    A POST never writes over an existing object."""
    kube, ns = operator_env.kube, namespace
    name = f"cm-{uuid.uuid4().hex[:6]}"
    theirs = create(kube, {"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": name, "namespace": ns}, "data": {"who": "them"}})  # fmt: skip

    def server_side_apply(uid: str, target: str = name, precondition: str = "uid") -> Any:
        meta = {"name": target, "namespace": ns, precondition: uid}
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"who": "us"}}
        return kube.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=pg-operator",
                            "-f", "-", input=json.dumps(body), check=False)  # fmt: skip

    refused = server_side_apply(str(uuid.uuid4()))
    assert refused.returncode != 0, refused.stdout
    assert "uid" in refused.stderr.lower(), refused.stderr
    assert same(theirs, kube) is not None

    missing = server_side_apply(str(uuid.uuid4()), target=f"{name}-none")
    assert missing.returncode != 0 and "uid mismatch" in missing.stderr, missing.stderr
    assert get_or_none(kube, "configmap", f"{name}-none", "-n", ns) is None

    posted = kube.kubectl(
        "create",
        "-f",
        "-",
        check=False,
        input=json.dumps(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}}
        ),
    )
    assert posted.returncode != 0 and "AlreadyExists" in posted.stderr, posted.stderr
    assert same(theirs, kube) is not None

    taken = server_side_apply(CREATE_ONLY_VERSION, precondition="resourceVersion")
    assert taken.returncode != 0 and "the object has been modified" in taken.stderr, taken.stderr
    assert same(theirs, kube) is not None
    made = server_side_apply(CREATE_ONLY_VERSION, target=f"{name}-new", precondition="resourceVersion")
    assert made.returncode == 0, made.stderr
    new = get_json(kube, "configmap", f"{name}-new", "-n", ns, "--show-managed-fields")
    assert [(e["manager"], e["operation"]) for e in new["metadata"]["managedFields"]] == [
        ("pg-operator", "Apply")
    ]

    accepted = server_side_apply(theirs["metadata"]["uid"])
    assert accepted.returncode == 0, accepted.stderr
    assert get_json(kube, "configmap", name, "-n", ns)["data"] == {"who": "us"}


def test_the_operators_write_path_never_writes_over_an_object_it_did_not_observe(
    operator_env: OperatorEnv, namespace: str
) -> None:
    """controller/writes.py with the operator's own identity and RBAC: a POST finds the object in its
    way and reads its metadata (a list by name: the operator may not get most kinds), an apply, a merge
    patch and a delete pinned to a uid that is not the object's are refused and change nothing (that a
    POSTed child's field manager entry becomes an apply's, the first test shows on the operator's own)."""
    kube, ns = operator_env.kube, namespace
    theirs = create(kube, {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                           "metadata": {"name": "deny", "namespace": ns},
                           "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}})  # fmt: skip
    owner = str(uuid.uuid4())  # a cluster's uid (none is created: nothing of it may be written here)
    reference = {
        "apiVersion": PG_API,
        "kind": "PostgresCluster",
        "name": "deny",
        "uid": owner,
        "controller": True,
    }
    mine: dict[str, Any] = {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "deny", "namespace": ns, "labels": {CLUSTER_LABEL: "deny"},
                     "ownerReferences": [reference]},
        "spec": {"podSelector": {"matchLabels": {CLUSTER_LABEL: "deny"}}, "policyTypes": ["Ingress"]},
    }  # fmt: skip
    wrong = str(uuid.uuid4())

    async def scenario() -> tuple[Made, set[ObjectId], list[bool]]:
        api = Api(Metrics(), KubeConfig.from_file(operator_env.kubeconfig))
        try:
            claims = Claims(ns, owner)
            made, _ = await create_owned(api, claims, mine)
            refused = []
            for attempt in (api.apply(mine, uid=wrong),
                            api.merge_patch(resource_for(mine["apiVersion"], mine["kind"]), "deny", ns,
                                            {"metadata": {"uid": wrong, "labels": {"x": "y"}}}),
                            api.delete(mine["apiVersion"], mine["kind"], "deny", ns, uid=wrong)):  # fmt: skip
                try:
                    await attempt
                    refused.append(False)
                except ApiError as exc:
                    refused.append(uid_refused(exc))
            return made, set(claims.conflicts), refused
        finally:
            await api.close()

    made, conflicts, refused = asyncio.run(scenario())
    assert made is Made.FOREIGN
    assert conflicts == {("networking.k8s.io/v1", "NetworkPolicy", "deny")}
    assert refused == [True, True, True]
    assert_untouched(kube, [theirs])
