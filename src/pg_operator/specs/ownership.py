"""A cluster writes only what it owns: the decisions, without I/O (the writes are controller/writes.py's).

An object is the cluster's when it carries the cluster's controller ownerReference, matched by uid (a
name can be reused by a new cluster; a uid cannot). Anything else found at one of the cluster's names —
an admin's NetworkPolicy, a Secret someone put in place, a child of an earlier cluster of the same name
that was orphaned — is foreign: never changed, adopted, read as the cluster's own, or deleted. The
cluster reports it (Degraded `Conflict`, a Warning naming the kind and the name) and keeps writing
everything else, except what would put the foreign object to use: a workload whose pods would run with
it (their ServiceAccount and its RBAC, a ConfigMap or Secret they mount or read, the NetworkPolicy that
fences them) and a RoleBinding that would bind to it. See `needs`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pg_operator import objects
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import GROUP, KIND
from pg_operator.specs import names, pooler
from pg_operator.specs import network_policy as instance_policy
from pg_operator.specs.roles import declared_roles, generates_secret, role_secret_name
from pg_operator.specs.secrets import secret_names
from pg_operator.specs.services import additional_service_names
from pg_operator.specs.tls import tls_secret_names

ObjectId = tuple[str, str, str]  # (apiVersion, kind, name)

SERVICE_ACCOUNT = ("v1", "ServiceAccount")
CONFIG_MAP = ("v1", "ConfigMap")
SECRET = ("v1", "Secret")
SERVICE = ("v1", "Service")
RBAC = "rbac.authorization.k8s.io/v1"
ROLE = (RBAC, "Role")
ROLE_BINDING = (RBAC, "RoleBinding")
NETWORK_POLICY = ("networking.k8s.io/v1", "NetworkPolicy")
PDB = ("policy/v1", "PodDisruptionBudget")
STATEFULSET = ("apps/v1", "StatefulSet")
DEPLOYMENT = ("apps/v1", "Deployment")
WORKLOADS = frozenset({STATEFULSET, DEPLOYMENT})


def controlled_by(body: Mapping[str, Any] | None, cluster_uid: str) -> bool:
    """Whether the cluster with this uid is the object's controller: the only objects it may write."""
    return bool(cluster_uid) and any(
        ref.get("controller") and ref.get("uid") == cluster_uid and ref.get("kind") == KIND
        and str(ref.get("apiVersion") or "").split("/")[0] == GROUP
        for ref in objects.owner_references(body)
    )  # fmt: skip


def holder(body: Mapping[str, Any] | None) -> str:
    """Who holds a foreign object, in words for a condition or an Event (names only, never content)."""
    refs = list(objects.owner_references(body))
    controller = next((r for r in refs if r.get("controller")), None)
    if controller is not None:
        if controller.get("kind") == KIND:
            return f"controlled by another {KIND} {controller.get('name')} (uid {controller.get('uid')})"
        return f"controlled by {controller.get('kind')} {controller.get('name')}"
    if refs:
        return "owned by " + ", ".join(f"{r.get('kind')} {r.get('name')}" for r in refs) + ", no controller"
    return "no owner"


def generated_names(cluster: PostgresCluster) -> set[ObjectId]:
    """Every object the cluster may write under a name derived from its own, whatever its spec asks for
    now (a PDB only above one instance, the pooler only when enabled): a foreign object there is never
    taken for the cluster's. Generated role Secrets count for the roles declared now."""
    instance = names.instance(cluster)
    out: set[ObjectId] = {
        (*SERVICE_ACCOUNT, instance), (*ROLE, instance), (*ROLE_BINDING, instance), (*CONFIG_MAP, instance),
        (*STATEFULSET, names.statefulset(cluster)), (*PDB, names.pdb(cluster)),
        (*PDB, names.primary_pdb(cluster)),
        (*NETWORK_POLICY, instance_policy.name(cluster)), (*NETWORK_POLICY, pooler.policy_name(cluster)),
        (*SECRET, pooler.auth_secret_name(cluster)),
    }  # fmt: skip
    for service in (names.headless_service, names.rw_service, names.ro_service, names.r_service):
        out.add((*SERVICE, service(cluster)))
    # The additional Services are named by the tenant: a foreign Service there is a conflict, never adopted.
    out |= {(*SERVICE, name) for name in additional_service_names(cluster)}
    for side in ("rw", "ro"):
        out |= {
            (*DEPLOYMENT, pooler.deployment_name(cluster, side)),
            (*SERVICE, pooler.service_name(cluster, side)),
            (*PDB, pooler.deployment_name(cluster, side)),
        }
    for secret in (*secret_names(cluster), *tls_secret_names(cluster)):
        out.add((*SECRET, secret))
    for role in declared_roles(cluster):
        if generates_secret(role):
            out.add((*SECRET, role_secret_name(cluster, role.name)))
    return out


Kind = tuple[str, str]  # (apiVersion, kind)


def set_aside(children: Mapping[Kind, Sequence[dict[str, Any]]], cluster_uid: str, generated: set[ObjectId],
              ) -> tuple[dict[Kind, list[dict[str, Any]]], dict[ObjectId, dict[str, Any]]]:  # fmt: skip
    """Split what a reconcile observed into what it may read as the cluster's and the foreign objects at the
    cluster's names. Objects at other names stay (the Secrets a user names, Patroni's ConfigMaps, pods
    and volumes are read, not written as the cluster's)."""
    kept: dict[Kind, list[dict[str, Any]]] = {}
    foreign: dict[ObjectId, dict[str, Any]] = {}
    for (api_version, kind), items in children.items():
        kept[(api_version, kind)] = []
        for body in items:
            ident = (api_version, kind, objects.name(body))
            if ident in generated and not controlled_by(body, cluster_uid):
                foreign[ident] = body
            else:
                kept[(api_version, kind)].append(body)
    return kept, foreign


def _pod_template_refs(workload: Mapping[str, Any]) -> set[ObjectId]:
    """What a workload's pods use by name: their ServiceAccount, the ConfigMaps and Secrets they mount
    or read into their environment."""
    template = objects.spec(workload).get("template") or {}
    pod = template.get("spec") or {}
    out: set[ObjectId] = set()
    account = pod.get("serviceAccountName")
    if account:
        out.add((*SERVICE_ACCOUNT, str(account)))
    for volume in pod.get("volumes") or ():
        sources = [volume, *((volume.get("projected") or {}).get("sources") or ())]
        for source in sources:
            secret = source.get("secret") or {}
            if secret.get("secretName") or secret.get("name"):
                out.add((*SECRET, str(secret.get("secretName") or secret.get("name"))))
            config = (source.get("configMap") or {}).get("name")
            if config:
                out.add((*CONFIG_MAP, str(config)))
    for container in (*(pod.get("initContainers") or ()), *(pod.get("containers") or ())):
        for env in container.get("env") or ():
            source = env.get("valueFrom") or {}
            if (source.get("secretKeyRef") or {}).get("name"):
                out.add((*SECRET, str(source["secretKeyRef"]["name"])))
            if (source.get("configMapKeyRef") or {}).get("name"):
                out.add((*CONFIG_MAP, str(source["configMapKeyRef"]["name"])))
        for env_from in container.get("envFrom") or ():
            if (env_from.get("secretRef") or {}).get("name"):
                out.add((*SECRET, str(env_from["secretRef"]["name"])))
            if (env_from.get("configMapRef") or {}).get("name"):
                out.add((*CONFIG_MAP, str(env_from["configMapRef"]["name"])))
    return out


def _selects(selector: Mapping[str, Any], pod_labels: Mapping[str, str]) -> bool:
    """Whether a NetworkPolicy's podSelector (matchLabels only, as the operator writes them) selects pods
    with these labels."""
    match = selector.get("matchLabels") or {}
    return all(pod_labels.get(k) == v for k, v in match.items()) and not selector.get("matchExpressions")


def _binding_refs(binding: Mapping[str, Any]) -> set[ObjectId]:
    role_ref = binding.get("roleRef") or {}
    out: set[ObjectId] = set()
    if role_ref.get("kind") == "Role" and role_ref.get("name"):
        out.add((*ROLE, str(role_ref["name"])))
    for subject in binding.get("subjects") or ():
        if subject.get("kind") == "ServiceAccount" and subject.get("name"):
            out.add((*SERVICE_ACCOUNT, str(subject["name"])))
    return out


def needs(desired: Mapping[str, Any], siblings: Iterable[Mapping[str, Any]]) -> set[ObjectId]:
    """The objects `desired` puts to use, so that it must not be written while one of them is foreign:
    for a workload what its pods use (`_pod_template_refs`), the cluster's RoleBindings naming their
    ServiceAccount with the Roles they bind, and the cluster's NetworkPolicies selecting its pods (the
    pods must not run outside the fence they are promised); for a RoleBinding its Role and subjects.
    `siblings`: the other objects the reconcile writes."""
    key = (str(desired.get("apiVersion")), str(desired.get("kind")))
    if key == ROLE_BINDING:
        return _binding_refs(desired)
    if key not in WORKLOADS:
        return set()
    out = _pod_template_refs(desired)
    accounts = {ident for ident in out if ident[:2] == SERVICE_ACCOUNT}
    pod_labels = ((objects.spec(desired).get("template") or {}).get("metadata") or {}).get("labels") or {}
    for sibling in siblings:
        sibling_key = (str(sibling.get("apiVersion")), str(sibling.get("kind")))
        ident = (*sibling_key, objects.name(sibling))
        if sibling_key == ROLE_BINDING and _binding_refs(sibling) & accounts:
            out |= {ident, *_binding_refs(sibling)}
        elif sibling_key == NETWORK_POLICY and _selects(objects.spec(sibling).get("podSelector") or {},
                                                        pod_labels):  # fmt: skip
            out.add(ident)
    return out


def describe(ident: ObjectId) -> str:
    return f"{ident[1]} {ident[2]}"


def conflict_message(conflicts: Mapping[ObjectId, str], held: Mapping[ObjectId, Iterable[ObjectId]]) -> str:
    """The Degraded message: each foreign object (kind, name, who holds it), then what waits for them."""
    parts = [f"{describe(i)} exists and is not this cluster's ({conflicts[i]}): left alone"
             for i in sorted(conflicts)]  # fmt: skip
    for ident in sorted(held):
        blockers = ", ".join(describe(b) for b in sorted(held[ident]))
        parts.append(f"{describe(ident)} not written: it would use {blockers}")
    return "; ".join(parts) + "; rename the cluster or remove the objects"


def conflict_event(ident: ObjectId, why: str) -> str:
    """One Warning Event's message about one foreign object."""
    return (
        f"{describe(ident)} exists and is not this cluster's ({why}): the operator leaves it alone and "
        "writes the cluster's other objects; rename the cluster or remove it"
    )


def _created(body: Mapping[str, Any] | None) -> datetime | None:
    stamp = str(objects.meta(body).get("creationTimestamp") or "")
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None
    except ValueError:
        return None


def patroni_may_have_created(configmap: Mapping[str, Any], cluster: Mapping[str, Any]) -> bool:
    """Whether one of Patroni's ConfigMaps (`<scope>-config`, `-leader`, `-failover`, `-sync`) may get the
    cluster as its (non-controller) owner, so the garbage collector removes it with the cluster.

    Patroni of this cluster creates them without an owner, and only once its pods run, well after the
    cluster was created. So never one that has an owner already, and never one created before the
    cluster or within the same second (timestamps are whole seconds): that one was there before, someone
    else's, and adopting it would hand its deletion to whoever deletes the cluster. One created later
    by someone else under these names is indistinguishable from Patroni's — and Patroni of this cluster
    uses it as its own, so it is the cluster's state either way."""
    if objects.owner_references(configmap):
        return False
    made, born = _created(configmap), _created(cluster)
    return made is not None and born is not None and made > born
