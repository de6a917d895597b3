"""Attacks a tenant makes through the Kubernetes API alone, each acted out with the tenant's own token
(harness/tenant.py: a ServiceAccount that may manage its PostgresClusters, read and create its Secrets
and, in one namespace, run pods), against the operator as the chart installs it. The admin only sets up
what an admin would have: the namespaces, the tenant's account, objects the platform put there.

- Object takeover: a cluster named after an admin's NetworkPolicy and ConfigMap changes neither, reports
  the conflict, and the real garbage collector leaves both when the tenant deletes the cluster.
- Foreign credentials: backup credentials from a Secret not labelled for the cluster, or from another
  namespace, are refused naming the field; nothing is sent to the tenant's endpoint, and the operator
  reads nothing in the other namespace.
- A hostile store: the tenant's own pod accepts the operator's call and sends one byte every 20 s; the
  call is cut at the operator's deadline and reported, while another tenant's cluster gets its store's
  verdict meanwhile.

None of these needs PostgreSQL running: each cluster is refused, in conflict, or has no node to run on
(harness.tenant.parked), so the module costs the operator's reconciles and one small pod."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.audit import Audit
from harness.e2e_backup import Moto, credentials, s3
from harness.kube import condition, events_for, get_json, get_or_none
from harness.local_cluster import Kube
from harness.objects import cluster, s3_credentials_secret
from harness.pgcluster import SMALL
from harness.tenant import Tenant, parked, pod_logs, tenant_namespace
from harness.waiting import wait_until
from pg_operator.backup.store_ownership import MARKER_NAME
from pg_operator.images import default_image

pytestmark = pytest.mark.e2e

CONDITION_TIMEOUT = 90  # a first reconcile takes seconds; generous for a loaded CI machine


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tenants")


@pytest.fixture(scope="module")
def tenant(operator: Kube, work: Path) -> Iterator[Tenant]:
    """The attacking tenant: a namespace of its own, where it may also run pods."""
    with tenant_namespace(operator, "tenant", work, runs_pods=True) as t:
        yield t


@pytest.fixture(scope="module")
def neighbour(operator: Kube, work: Path) -> Iterator[Tenant]:
    """Another tenant, in another namespace."""
    with tenant_namespace(operator, "neighbour", work) as t:
        yield t


def pgc(who: Tenant, name: str) -> dict[str, Any]:
    return dict(get_json(who.kube, "pgc", name, "-n", who.namespace))


def warnings(admin: Kube, namespace: str, name: str, reason: str) -> list[str]:
    """The Warning Events about a cluster with `reason` (the admin reads them: the tenant may not)."""
    return [e["message"] for e in events_for(admin, namespace, name)
            if e["type"] == "Warning" and e["reason"] == reason]  # fmt: skip


# --- object takeover ---------------------------------------------------------------------------------------

NETWORK_POLICIES = "networkpolicies.networking.k8s.io"


def test_a_cluster_named_after_an_admins_objects_never_changes_or_deletes_them(
    operator: Kube, work: Path
) -> None:
    """The reported attack, as the tenant makes it: the admin's deny-all NetworkPolicy `default-deny`
    and ConfigMap `default-deny-instance` are there; the tenant creates a cluster `default-deny`, then
    deletes it. Before the fix the operator rewrote the policy, merged into the ConfigMap, put its owner
    reference on both, and the garbage collector deleted both with the cluster."""
    admin, name = operator, "default-deny"
    with tenant_namespace(admin, "takeover", work) as tenant:
        ns = tenant.namespace
        policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                  "metadata": {"name": name, "namespace": ns},
                  "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}  # fmt: skip
        config = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": f"{name}-instance", "namespace": ns},
                  "data": {"owner": "the platform admin"}}  # fmt: skip
        admin.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                              "items": [policy, config]}))  # fmt: skip
        originals = {
            "NetworkPolicy": get_json(admin, NETWORK_POLICIES, name, "-n", ns),
            "ConfigMap": get_json(admin, "configmap", f"{name}-instance", "-n", ns),
        }

        def untouched() -> None:
            now = {
                "NetworkPolicy": get_or_none(admin, NETWORK_POLICIES, name, "-n", ns),
                "ConfigMap": get_or_none(admin, "configmap", f"{name}-instance", "-n", ns),
            }
            for kind, before in originals.items():
                assert now[kind] is not None, f"the admin's {kind} was deleted"
                written = f"the admin's {kind} was written: {json.dumps(now[kind])}"
                assert now[kind]["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], (
                    written
                )
                assert now[kind] == before, f"the admin's {kind} changed: {json.dumps(now[kind])}"

        tenant.create(cluster(name, ns, replicas=1, resources=SMALL))

        def conflict() -> dict[str, Any] | None:
            degraded = condition(pgc(tenant, name), "Degraded")
            message = str(degraded.get("message") or "")
            named = f"NetworkPolicy {name} " in message and f"ConfigMap {name}-instance " in message
            return degraded if degraded.get("reason") == "Conflict" and named else None

        degraded = wait_until("Degraded Conflict naming both objects", conflict, CONDITION_TIMEOUT, 1)
        assert degraded["status"] == "True", degraded
        wait_until(
            "a Conflict Warning naming each object",
            lambda: all(
                any(m.startswith(f"{what} exists and is not this cluster's") for m in
                    warnings(admin, ns, name, "Conflict"))
                for what in (f"NetworkPolicy {name}", f"ConfigMap {name}-instance")
            ),
            30,
            1,
        )  # fmt: skip
        # The operator wrote the cluster's own objects meanwhile (it kept reconciling), none of the admin's.
        wait_until("the cluster's own Secrets",
                   lambda: get_or_none(admin, "secret", f"{name}-superuser", "-n", ns), 30, 1)  # fmt: skip
        untouched()
        # The pods would mount the admin's ConfigMap and run outside the fence the policy promised: none.
        assert get_or_none(admin, "statefulset", name, "-n", ns) is None

        tenant.kubectl("delete", "pgc", name)
        wait_until(
            "the garbage collector to remove the cluster's own objects",
            lambda: (
                get_or_none(admin, "secret", f"{name}-superuser", "-n", ns) is None
                and get_or_none(admin, "serviceaccount", f"{name}-instance", "-n", ns) is None
            ),
            90,
            1,
        )
        time.sleep(3)  # anything else naming the cluster as owner went in the same sweep
        untouched()


# --- the tenant's store server --------------------------------------------------------------------------

# A server of the tenant's: it accepts every connection, logs the request line and the access key id of
# the Authorization header (what a thief wants), then sends one byte every 20 s and never a response.
SLOW_STORE = r"""
import socket, threading, time

def serve(conn, peer):
    head = b""
    try:
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = conn.recv(4096)
            if not chunk:
                break
            head += chunk
        lines = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
        auth = next((x for x in lines if x.lower().startswith("authorization:")), "")
        key = auth.split("Credential=", 1)[1].split("/", 1)[0] if "Credential=" in auth else "-"
        print(f"request from {peer}: {lines[0]} key={key}", flush=True)
        while True:
            time.sleep(20)
            conn.sendall(b"H")
    except OSError as exc:
        print(f"connection from {peer} ended: {exc}", flush=True)

listener = socket.create_server(("", 8080))
print("listening", flush=True)
while True:
    conn, addr = listener.accept()
    threading.Thread(target=serve, args=(conn, addr[0]), daemon=True).start()
"""


@dataclass(frozen=True)
class SlowStore:
    tenant: Tenant
    pod: str
    endpoint: str

    def log(self) -> str:
        return pod_logs(self.tenant, self.pod)

    def requests(self) -> list[str]:
        return [line for line in self.log().splitlines() if line.startswith("request from ")]


@pytest.fixture(scope="module")
def slow_store(tenant: Tenant) -> SlowStore:
    """The tenant's store server: a pod of its own (restricted Pod Security), from an image on the node."""
    name = "slow-store"
    tenant.create({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": tenant.namespace},
        "spec": {
            "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "store", "image": default_image("16"), "imagePullPolicy": "IfNotPresent",
                "command": ["/usr/bin/python3", "-u", "-c", SLOW_STORE], "ports": [{"containerPort": 8080}],
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
                "securityContext": {"runAsNonRoot": True, "runAsUser": 999,
                                    "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                    "seccompProfile": {"type": "RuntimeDefault"}},
            }],
        },
    })  # fmt: skip
    ip = wait_until(
        "the tenant's store pod",
        lambda: (get_json(tenant.kube, "pod", name, "-n", tenant.namespace).get("status") or {}).get("podIP"),
        120,
        1,
    )
    store = SlowStore(tenant, name, f"http://{ip}:8080")
    wait_until("the tenant's store listening", lambda: "listening" in store.log(), 60, 1)
    return store


def store_spec(endpoint: str, secret: str, bucket: str) -> dict[str, Any]:
    return {
        "s3": {"endpointURL": endpoint, "bucket": bucket, "path": "pg", "credentials": {"secretName": secret}}
    }


def archiving(who: Tenant, name: str) -> dict[str, Any]:
    return condition(pgc(who, name), "ContinuousArchiving")


def wait_archiving(who: Tenant, name: str, reason: str, timeout: float = CONDITION_TIMEOUT) -> dict[str, Any]:
    def reported() -> dict[str, Any] | None:
        cond = archiving(who, name)
        return cond if cond.get("reason") == reason else None

    try:
        return dict(wait_until(f"{name} ContinuousArchiving {reason}", reported, timeout, 1))
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; the cluster's status: {json.dumps(pgc(who, name).get('status'))}"
        ) from None


def secret_refs(admin: Kube, namespace: str, name: str) -> set[str]:
    """The Secrets the cluster's pods would read their environment from (its StatefulSet's template)."""
    sts = wait_until(f"the StatefulSet {name}",
                     lambda: get_or_none(admin, "statefulset", name, "-n", namespace), 30, 1)  # fmt: skip
    template = sts["spec"]["template"]["spec"]
    env = [
        e
        for c in [*template["containers"], *(template.get("initContainers") or ())]
        for e in c.get("env") or ()
    ]
    return {
        e["valueFrom"]["secretKeyRef"]["name"] for e in env if "secretKeyRef" in (e.get("valueFrom") or {})
    }


# --- foreign credentials -----------------------------------------------------------------------------------

PLATFORM_KEY, TEAM_KEY = "PLATFORMADMINKEYID01", "OTHERTEAMKEYID000002"


def test_backup_credentials_not_labelled_for_the_cluster_are_never_read_or_sent(
    operator: Kube, tenant: Tenant, neighbour: Tenant, slow_store: SlowStore
) -> None:
    """Two Secrets the tenant did not label for its cluster, named as its backup credentials with the
    tenant's own server as the endpoint (the access key id travels in every request's Authorization
    header): the platform's key in the tenant's namespace, unlabelled; another team's key in another
    namespace, labelled for a cluster of the very name the tenant then uses. Both are refused naming the
    field, the tenant's server hears nothing, and the operator reads nothing in the other namespace."""
    admin, ns = operator, tenant.namespace
    admin.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        s3_credentials_secret("platform-s3", ns, PLATFORM_KEY, "platform-secret-key"),
        s3_credentials_secret("team-s3", neighbour.namespace, TEAM_KEY, "team-secret-key", cluster="thief-b"),
    ]}))  # fmt: skip
    audit = Audit()
    mark = audit.mark()
    tenant.create(
        cluster("thief-a", ns, replicas=1, resources=SMALL,
                **parked(backup=store_spec(slow_store.endpoint, "platform-s3", "stolen-a"))),
        cluster("thief-b", ns, replicas=1, resources=SMALL,
                **parked(backup=store_spec(slow_store.endpoint, "team-s3", "stolen-b"))),
    )  # fmt: skip

    field = "spec.backup.s3.credentials.secretName"
    unlabelled = wait_archiving(tenant, "thief-a", "BackupCredentialUnlabelled")
    assert unlabelled["status"] == "False" and field in unlabelled["message"], unlabelled
    assert "Secret platform-s3 " in unlabelled["message"], unlabelled
    wait_until("a Warning naming the field", lambda: any(field in m for m in warnings(
        admin, ns, "thief-a", "BackupCredentialUnlabelled")), 30, 1)  # fmt: skip

    # The other namespace's Secret is not the tenant's namespace's: the cluster finds none of that name.
    elsewhere = wait_archiving(tenant, "thief-b", "BackupCredentialMissing")
    assert elsewhere["status"] == "False" and field in elsewhere["message"], elsewhere
    assert "Secret team-s3 " in elsewhere["message"] and f"namespace {ns}" in elsewhere["message"], elsewhere

    # The pods would get neither Secret's values, nor the endpoint to send them to.
    for name, secret in (("thief-a", "platform-s3"), ("thief-b", "team-s3")):
        assert secret not in secret_refs(admin, ns, name)
    # Nothing reached the tenant's server, least of all a key id.
    heard = slow_store.requests()
    assert not [r for r in heard if "stolen-" in r or PLATFORM_KEY in r or TEAM_KEY in r], heard
    # The operator asked the API server for no Secret of the other namespace (its watch of labelled
    # Secrets is cluster-wide, and not a request about that namespace).
    about_team = [(e["verb"], (e.get("objectRef") or {}).get("namespace"),
                   (e.get("responseStatus") or {}).get("code"))
                  for e in audit.events_since(mark)
                  if (e.get("objectRef") or {}).get("resource") == "secrets"
                  and (e.get("objectRef") or {}).get("name") == "team-s3"]  # fmt: skip
    assert all(where == ns for _, where, _ in about_team), about_team
    assert not audit.requests_since(mark, namespace=neighbour.namespace), audit.requests_since(
        mark, namespace=neighbour.namespace
    )
    print(json.dumps({"operator_requests_for_team_s3": about_team}), flush=True)
    tenant.kubectl("delete", "pgc", "thief-a", "thief-b")


# --- a hostile store ------------------------------------------------------------------------------------

TENANT_KEY = "TENANTOWNKEYID000003"


def test_a_store_that_trickles_bytes_is_cut_off_and_holds_up_no_other_tenant(
    operator: Kube, tenant: Tenant, neighbour: Tenant, slow_store: SlowStore, moto: Moto
) -> None:
    """The tenant's cluster names its own server as the store, with its own (labelled) credentials: the
    server accepts the operator's call and trickles a byte every 20 s. The call is cut at the operator's
    deadline (`--store-call-timeout`, 30 s as installed) and reported as StoreTimeout; a second tenant's
    cluster, created while the call hangs, gets its store's ownership verdict meanwhile."""
    admin, ns, slow = operator, tenant.namespace, "slow"
    tenant.create(
        s3_credentials_secret(f"{slow}-s3", ns, TENANT_KEY, "tenant-secret-key", cluster=slow),
        cluster(slow, ns, replicas=1, resources=SMALL,
                **parked(backup=store_spec(slow_store.endpoint, f"{slow}-s3", "tenant-bucket"))),
    )  # fmt: skip
    wait_until("the operator's call on the tenant's server",
               lambda: any(f"key={TENANT_KEY}" in r for r in slow_store.requests()),
               CONDITION_TIMEOUT, 1)  # fmt: skip
    called = time.monotonic()

    other = "neighbour-db"
    neighbour.create(
        credentials(moto, neighbour.namespace, other),
        cluster(
            other, neighbour.namespace, replicas=1, resources=SMALL, **parked(backup={"s3": s3(moto, other)})
        ),
    )

    def verdict() -> str | None:
        backup = (pgc(neighbour, other).get("status") or {}).get("backup") or {}
        return (backup.get("storeOwnership") or {}).get("verdict")

    # Generous bounds: they prove "not stuck behind the hostile store for good", not a speed.
    assert wait_until("the neighbour's store verdict", verdict, 120, 1) == "owned"
    neighbour_s = time.monotonic() - called
    cut = wait_archiving(tenant, slow, "StoreTimeout", timeout=150)
    timeout_s = time.monotonic() - called
    print(json.dumps({"measure": "tenant_hostile_store", "neighbour_verdict_s": round(neighbour_s, 1),
                      "hostile_store_timeout_reported_s": round(timeout_s, 1)}), flush=True)  # fmt: skip
    assert cut["status"] == "False" and slow_store.endpoint in cut["message"], cut
    wait_until("a StoreTimeout Warning", lambda: warnings(admin, ns, slow, "StoreTimeout"), 30, 1)
    assert f"e2e/{other}/{MARKER_NAME}" in moto.keys(f"e2e/{other}/"), (
        "the neighbour's prefix was not claimed"
    )
    tenant.kubectl("delete", "pgc", slow)
    neighbour.kubectl("delete", "pgc", other)
