"""A tenant as the e2e attack modules act it out: a ServiceAccount of one namespace with the rights a
tenant team gets there (its PostgresClusters, its Secrets, pods of its own), and a kubeconfig holding
nothing but that account's token, so every request the tenant makes is authenticated and authorized as
that account, never as the admin (no impersonation: the API server sees the token alone).

An admin sets up what an admin would have (the namespace, the account and its Role, objects the platform
put there) through the admin's own `Kube`; the attacks go through `Tenant.kube`."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.local_cluster import Kube

ACCOUNT = "e2e-tenant"
# What a tenant team is given in its namespace: its own clusters and Secrets (reading them, and creating
# the ones it labels for its clusters), nothing of the operator's, no exec.
CLUSTER_RULE = {"apiGroups": ["db.example.com"], "resources": ["postgresclusters"],
                "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]}  # fmt: skip
SECRET_RULE = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "create"]}
# A team that runs its applications there may also run pods (and read their logs).
POD_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "create", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
]


def tenant_rbac(namespace: str, *, runs_pods: bool = False) -> list[dict[str, Any]]:
    """The tenant's ServiceAccount, Role and RoleBinding in `namespace`."""
    rules = [CLUSTER_RULE, SECRET_RULE, *(POD_RULES if runs_pods else ())]
    meta = {"name": ACCOUNT, "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACCOUNT},
         "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}]},
    ]  # fmt: skip


@dataclass(frozen=True)
class Tenant:
    """One tenant: its namespace, and `kube`, a Kube whose kubeconfig carries only the account's token."""

    namespace: str
    kube: Kube

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{ACCOUNT}"

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> Any:
        return self.kube.kubectl(*args, "-n", self.namespace, check=check, input=input)

    def create(self, *objects: dict[str, Any]) -> None:
        """`kubectl create` of the objects as the tenant (a POST each, in its namespace)."""
        body = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        self.kubectl("create", "-f", "-", input=json.dumps(body))


def token_kubeconfig(admin: Kube, namespace: str, path: Path) -> Kube:
    """A kubeconfig at `path` for the account ACCOUNT of `namespace`: the admin kubeconfig's server and
    CA, and a token the TokenRequest API issued for the account (no client certificate)."""
    token = admin.kubectl("create", "token", ACCOUNT, "-n", namespace, "--duration=2h").stdout.strip()
    config = yaml.safe_load(Path(admin.kubeconfig).read_text())
    current = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    server = next(c for c in config["clusters"] if c["name"] == current["cluster"])
    tenant = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [server],
        "users": [{"name": "tenant", "user": {"token": token}}],
        "contexts": [{"name": "tenant", "context": {"cluster": server["name"], "user": "tenant"}}],
        "current-context": "tenant",
    }
    path.write_text(yaml.safe_dump(tenant))
    path.chmod(0o600)
    return Kube(profile=admin.profile, kubeconfig=str(path), ctx=admin.ctx)


def grant(admin: Kube, namespace: str, work: Path, *, runs_pods: bool = False) -> Tenant:
    """The tenant's account in an existing namespace, and its token kubeconfig under `work`. Checked: the
    token authenticates as the account, which may not exec into pods nor read another namespace."""
    rbac = {"apiVersion": "v1", "kind": "List", "items": tenant_rbac(namespace, runs_pods=runs_pods)}
    admin.kubectl("apply", "-f", "-", input=json.dumps(rbac))
    tenant = Tenant(namespace, token_kubeconfig(admin, namespace, work / f"tenant-{namespace}.kubeconfig"))
    who = json.loads(tenant.kube.kubectl("auth", "whoami", "-o", "json").stdout)
    assert who["status"]["userInfo"]["username"] == tenant.user, who
    # (`can-i create pods/exec` would ask about a pod named exec: a subresource is a flag.)
    for verb, resource, where in [("create", ("pods", "--subresource=exec"), namespace),
                                  ("patch", ("pods", "--subresource=ephemeralcontainers"), namespace),
                                  ("get", ("secrets",), "kube-system")]:  # fmt: skip
        said = tenant.kube.kubectl("auth", "can-i", verb, *resource, "-n", where, check=False).stdout.strip()
        assert said == "no", f"the tenant may {verb} {' '.join(resource)} in {where}"
    return tenant


def revoke(admin: Kube, namespace: str) -> None:
    admin.kubectl("delete", "rolebinding,role,serviceaccount", ACCOUNT, "-n", namespace, "--ignore-not-found")


@contextmanager
def tenant_namespace(admin: Kube, prefix: str, work: Path, *, runs_pods: bool = False) -> Iterator[Tenant]:
    """A new namespace `<prefix>-<6 hex digits>` with its tenant; the namespace is deleted afterwards (not
    waited for)."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    admin.kubectl("create", "namespace", namespace)
    try:
        yield grant(admin, namespace, work, runs_pods=runs_pods)
    finally:
        admin.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")


def parked(**spec: Any) -> dict[str, Any]:
    """Spec fields that keep a cluster's pods from being scheduled (no node has the label): for attacks
    that need the operator's reconcile of a cluster, not PostgreSQL running."""
    return {"nodeSelector": {"e2e.example.com/no-such-node": "true"}, **spec}


def pod_logs(tenant: Tenant, pod: str) -> str:
    return str(tenant.kubectl("logs", pod).stdout)
