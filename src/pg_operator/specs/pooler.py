"""The pooler's children and decisions (pure): per side (`rw`, and `ro` with `readOnly`) a Deployment of
PgBouncer pods running `pg-operator-pooler` and a Service `<name>-pooler-<side>`, a PodDisruptionBudget
when a side has more than one pod, the pooler's NetworkPolicy, the auth role's Secret and the SQL that
keeps the auth role and its lookup function in every database; where each pooler pod should point and
which pods must be told (docs/pooler.md).

Pooler pods never carry the cluster label: the instances' Services, budget and policy select on it, and
so does the operator's pod cache. The Deployments do (they are the cluster's children and wake it).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pg_operator import objects
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import SUPERUSER
from pg_operator.api.pooler import POOLER_LABEL, POOLER_SIDE_LABEL, any_pooler_pod, pooler_pod_labels
from pg_operator.images import image_pull_secrets, pooler_image
from pg_operator.pooler_contract import (
    AUTH_FUNCTION,
    AUTH_SCHEMA,
    AUTH_USER,
    DEFAULT_RUN_DIR,
    ENV_AUTH_PASSWORD_FILE,
    ENV_AUTH_USER,
    ENV_CLUSTER,
    ENV_DEFAULT_POOL_SIZE,
    ENV_MAX_CLIENT_CONN,
    ENV_MAX_PREPARED_STATEMENTS,
    ENV_MODE,
    ENV_RUN_DIR,
    ENV_SIDE,
    ENV_TARGET,
    ENV_TLS_DIR,
    POOLER_METRICS_PORT,
    POOLER_PORT,
)
from pg_operator.scram import scram_sha256_verifier
from pg_operator.specs import names, placement
from pg_operator.specs.labels import MANAGED_BY, child_metadata
from pg_operator.specs.network_policy import (
    DEFAULT_OPERATOR_PEER,
    OperatorPeer,
    _peers,
    default_scrapers,
    operator_peers,
)
from pg_operator.specs.services import client_metadata

COMPONENT_POOLER = "pooler"
CONTAINER = "pgbouncer"
SUPERVISOR = "/opt/pg-operator/bin/pg-operator-pooler"
TLS_DIR = "/etc/pg-operator/tls"
AUTH_DIR = "/etc/pg-operator/pooler-auth"
PASSWORD_KEY = "password"  # noqa: S105 - a key's name
POOLER_UID = 999
# The operator writes this on a pooler pod after it pointed the pod's PgBouncer at a host, so a reconcile
# where nothing moved execs nothing.
POINTS_TO_ANNOTATION = "db.example.com/pooler-points-to"
CONDITION = "Pooler"


def deployment_name(cluster: PostgresCluster, side: str) -> str:
    return f"{cluster.name}-pooler-{side}"


def service_name(cluster: PostgresCluster, side: str) -> str:
    return deployment_name(cluster, side)


def auth_secret_name(cluster: PostgresCluster) -> str:
    return f"{cluster.name}-pooler-auth"


def policy_name(cluster: PostgresCluster) -> str:
    return f"{cluster.name}-pooler"


def pod_host(cluster: PostgresCluster, pod: str) -> str:
    """An instance by its pod DNS name under the headless Service (what the server certificate covers)."""
    return f"{pod}.{names.headless_service(cluster)}.{cluster.namespace}.svc"


def initial_target(cluster: PostgresCluster, side: str) -> str:
    """Where a fresh pooler pod points before the operator tells it the primary: the -rw (-ro) Service."""
    service = names.rw_service(cluster) if side == "rw" else names.ro_service(cluster)
    return f"{service}.{cluster.namespace}.svc"


def new_password() -> str:
    return secrets.token_urlsafe(32)


def auth_secret(cluster: PostgresCluster, password: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": child_metadata(cluster, auth_secret_name(cluster), COMPONENT_POOLER),
        "type": "kubernetes.io/basic-auth",
        "data": {
            "username": base64.b64encode(AUTH_USER.encode()).decode(),
            PASSWORD_KEY: base64.b64encode(password.encode()).decode(),
        },
    }


# --- children -------------------------------------------------------------------------------------------


def _pod_labels(cluster: PostgresCluster, side: str) -> dict[str, str]:
    return {
        **pooler_pod_labels(cluster.name, side),
        "app.kubernetes.io/instance": cluster.name,
        "app.kubernetes.io/component": COMPONENT_POOLER,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def _resources(cluster: PostgresCluster) -> dict[str, Any]:
    pooler = cluster.spec.pooler
    assert pooler is not None
    res = pooler.resources
    limits: dict[str, str] = {"memory": pooler.memory_limit}
    if res.limits.cpu:
        limits["cpu"] = res.limits.cpu
    return {"requests": {"cpu": res.requests.cpu, "memory": res.requests.memory}, "limits": limits}


def deployment(cluster: PostgresCluster, side: str, image: str | None = None) -> dict[str, Any]:
    """`image`: the install's pooler image (images.pooler_image()) unless given."""
    pooler = cluster.spec.pooler
    assert pooler is not None
    labels = _pod_labels(cluster, side)
    env = {
        ENV_CLUSTER: cluster.name,
        ENV_SIDE: side,
        ENV_MODE: pooler.mode,
        ENV_TARGET: initial_target(cluster, side),
        ENV_AUTH_USER: AUTH_USER,
        ENV_AUTH_PASSWORD_FILE: f"{AUTH_DIR}/{PASSWORD_KEY}",
        ENV_TLS_DIR: TLS_DIR,
        ENV_RUN_DIR: DEFAULT_RUN_DIR,
    }
    if pooler.default_pool_size is not None:
        env[ENV_DEFAULT_POOL_SIZE] = str(pooler.default_pool_size)
    if pooler.max_client_connections is not None:
        env[ENV_MAX_CLIENT_CONN] = str(pooler.max_client_connections)
    if pooler.max_prepared_statements is not None:
        env[ENV_MAX_PREPARED_STATEMENTS] = str(pooler.max_prepared_statements)
    probe = {"tcpSocket": {"port": "pgbouncer"}}
    container = {
        "name": CONTAINER,
        "image": image or pooler_image(),
        "imagePullPolicy": "IfNotPresent",
        "command": ["/usr/bin/tini", "-s", "--", SUPERVISOR, "run"],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [
            {"name": "pgbouncer", "containerPort": POOLER_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": POOLER_METRICS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {**probe, "periodSeconds": 2, "failureThreshold": 2},
        # A pod going away keeps serving until the Service has stopped sending it new clients.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6},
        "resources": _resources(cluster),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "run", "mountPath": DEFAULT_RUN_DIR},
            {"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
            {"name": "auth", "mountPath": AUTH_DIR, "readOnly": True},
        ],
    }
    tls_items = [{"key": k, "path": k} for k in ("tls.crt", "tls.key", "ca.crt")]
    pod_spec = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsUser": POOLER_UID,
            "runAsGroup": POOLER_UID,
            "fsGroup": POOLER_UID,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
            {
                "name": "tls",
                "secret": {
                    "secretName": names.server_tls_secret(cluster),
                    "items": tls_items,
                    "defaultMode": 0o440,
                },
            },
            {
                "name": "auth",
                "secret": {
                    "secretName": auth_secret_name(cluster),
                    "items": [{"key": PASSWORD_KEY, "path": PASSWORD_KEY}],
                    "defaultMode": 0o440,
                },
            },
        ],
        # Apart from each other over nodes (preferred: a Deployment's surge pod must find a place on a
        # small cluster), and spread over zones as the instances are (spec.affinity.zoneSpread).
        "affinity": placement.pod_affinity(
            cluster, "preferred", pooler_pod_labels(cluster.name, side), "kubernetes.io/hostname"
        ),
    }
    zones = placement.zone_spread(
        cluster.spec.affinity.zone_spread,
        cluster.spec.affinity.zone_topology_key,
        pooler_pod_labels(cluster.name, side),
    )
    if zones:
        pod_spec["topologySpreadConstraints"] = zones
    if cluster.spec.node_selector:
        pod_spec["nodeSelector"] = dict(cluster.spec.node_selector)
    pod_spec["tolerations"] = placement.pooler_tolerations(cluster)
    pull_secrets = image_pull_secrets()  # the install's --image-pull-secrets
    if pull_secrets:
        pod_spec["imagePullSecrets"] = pull_secrets
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(cluster, deployment_name(cluster, side), COMPONENT_POOLER),
        "spec": {
            "replicas": pooler.instances,
            "selector": {"matchLabels": pooler_pod_labels(cluster.name, side)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def service(cluster: PostgresCluster, side: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": client_metadata(
            cluster, child_metadata(cluster, service_name(cluster, side), COMPONENT_POOLER)
        ),
        "spec": {
            "type": "ClusterIP",
            "selector": pooler_pod_labels(cluster.name, side),
            "ports": [
                {"name": "pgbouncer", "port": POOLER_PORT, "targetPort": "pgbouncer", "protocol": "TCP"}
            ],
        },
    }


def pdb(cluster: PostgresCluster, side: str) -> dict[str, Any] | None:
    pooler = cluster.spec.pooler
    if pooler is None or pooler.instances <= 1:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(cluster, deployment_name(cluster, side), COMPONENT_POOLER),
        # One pod at a time: a drain never takes every pod of a side at once (with three or more pods,
        # minAvailable 1 would let it take all but one together).
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": pooler_pod_labels(cluster.name, side)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def network_policy(cluster: PostgresCluster,
                   operator: OperatorPeer = DEFAULT_OPERATOR_PEER) -> dict[str, Any] | None:  # fmt: skip
    """5432 from the cluster's allowFrom peers (unset: its namespace), metrics from metricsFrom (unset:
    the install's monitoring namespace and the operator, specs/network_policy.default_scrapers)."""
    spec = cluster.spec.network_policy
    if cluster.spec.pooler is None or not spec.enabled:
        return None
    clients = [{"podSelector": {}}] if spec.allow_from is None else _peers(spec.allow_from)
    scrapers = (default_scrapers(operator, operator_peers(operator)) if spec.metrics_from is None
                else _peers(spec.metrics_from))  # fmt: skip
    ingress = [{"from": clients, "ports": [{"protocol": "TCP", "port": POOLER_PORT}]}] if clients else []
    if scrapers:
        ingress.append({"from": scrapers, "ports": [{"protocol": "TCP", "port": POOLER_METRICS_PORT}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(cluster, policy_name(cluster), COMPONENT_POOLER),
        "spec": {
            "podSelector": {"matchLabels": any_pooler_pod(cluster.name)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def children(cluster: PostgresCluster, image: str | None = None,
             operator: OperatorPeer = DEFAULT_OPERATOR_PEER) -> list[dict[str, Any]]:  # fmt: skip
    pooler = cluster.spec.pooler
    if pooler is None:
        return []
    out: list[dict[str, Any]] = []
    for side in pooler.sides:
        out += [deployment(cluster, side, image), service(cluster, side)]
        budget = pdb(cluster, side)
        if budget is not None:
            out.append(budget)
    policy = network_policy(cluster, operator)
    if policy is not None:
        out.append(policy)
    return out


# --- the auth role and function -------------------------------------------------------------------------


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _ident(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


def role_sql(password: str, salt: bytes | None = None) -> str:
    """Create or fix the auth role: login, nothing else, its password the Secret's (as a verifier)."""
    verifier = scram_sha256_verifier(password, salt=salt)
    return (
        "DO $$ BEGIN\n"  # noqa: S608 - quoted literals and identifiers only
        f"  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = {_literal(AUTH_USER)}) THEN\n"
        f"    CREATE ROLE {_ident(AUTH_USER)} LOGIN;\n"
        "  END IF;\n"
        "END $$;\n"
        f"ALTER ROLE {_ident(AUTH_USER)} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
        f"NOBYPASSRLS NOINHERIT CONNECTION LIMIT 100 PASSWORD {_literal(verifier)};\n"
    )


def function_sql() -> str:
    """The lookup PgBouncer's auth_query calls, in the current database: a SECURITY DEFINER function owned
    by the superuser that returns the verifier of a login role that is neither a superuser, nor a
    replication role, nor one of the operator's own (those never log in through the pooler)."""
    schema, user = _ident(AUTH_SCHEMA), _ident(AUTH_USER)
    return (
        f"CREATE SCHEMA IF NOT EXISTS {schema} AUTHORIZATION {_ident(SUPERUSER)};\n"  # noqa: S608
        f"REVOKE ALL ON SCHEMA {schema} FROM PUBLIC;\n"
        f"GRANT USAGE ON SCHEMA {schema} TO {user};\n"
        f"CREATE OR REPLACE FUNCTION {AUTH_FUNCTION}(i_username text, OUT usename name, OUT passwd text)\n"
        "  RETURNS record LANGUAGE sql STABLE SECURITY DEFINER\n"
        "  SET search_path = pg_catalog, pg_temp AS $fn$\n"
        "    SELECT a.rolname, a.rolpassword FROM pg_catalog.pg_authid a\n"
        "    WHERE a.rolname = i_username AND a.rolcanlogin AND NOT a.rolsuper AND NOT a.rolreplication\n"
        "      AND a.rolname NOT LIKE 'pgop\\_%' AND a.rolname <> 'postgres'\n"
        "      AND (a.rolvaliduntil IS NULL OR a.rolvaliduntil > pg_catalog.now())\n"
        "  $fn$;\n"
        f"ALTER FUNCTION {AUTH_FUNCTION}(text) OWNER TO {_ident(SUPERUSER)};\n"
        f"REVOKE ALL ON FUNCTION {AUTH_FUNCTION}(text) FROM PUBLIC;\n"
        f"GRANT EXECUTE ON FUNCTION {AUTH_FUNCTION}(text) TO {user};\n"
    )


# Databases PgBouncer may serve: every one that takes connections, and template1 so a database created
# later (from template1, as CREATE DATABASE does by default) has the function from the start.
LIST_DATABASES_SQL = (
    "SELECT datname FROM pg_catalog.pg_database WHERE (datallowconn AND NOT datistemplate) "
    "OR datname = 'template1' ORDER BY datname"
)


def setup_sql(password: str, databases: Iterable[str], salt: bytes | None = None) -> str:
    """One psql script (ON_ERROR_STOP): the role, then the function in each database (\\connect)."""
    out = [role_sql(password, salt)]
    body = function_sql()
    out.extend(f"{_connect(db)}{body}" for db in sorted(set(databases)))
    return "".join(out)


def _connect(db: str) -> str:
    if "\n" in db or "'" in db or "\\" in db:
        raise ValueError(f"database name {db!r} cannot be put on a psql line")
    return f"\\connect {_literal(db)}\n"


def teardown_sql(databases: Iterable[str]) -> str:
    """One psql script (ON_ERROR_STOP) that undoes setup_sql once the pooler is off: the lookup's schema
    in each database (the function and the grants to the role go with it), then the role. Each step is a
    no-op where it was done already, so a retry after a partial run finishes the job."""
    drop = f"DROP SCHEMA IF EXISTS {_ident(AUTH_SCHEMA)} CASCADE;\n"
    out = [f"{_connect(db)}{drop}" for db in sorted(set(databases))]
    out.append(f"DROP ROLE IF EXISTS {_ident(AUTH_USER)};\n")
    return "".join(out)


def setup_trigger(cluster: PostgresCluster, primary: str, secret: Mapping[str, Any] | None,
                  databases: Sequence[str]) -> str:  # fmt: skip
    """What, changed, asks for the setup SQL again: the primary, the Secret's version, the databases."""
    version = objects.resource_version(secret) or ""
    text = "|".join([primary, objects.uid(secret), version, *sorted(databases)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- where the pods point -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolerPod:
    name: str
    side: str
    points_to: str  # the operator's annotation: "" for a pod it never pointed


def pooler_pods(cluster_name: str, metas: Iterable[Mapping[str, Any]]) -> list[PoolerPod]:
    """The pooler pods of a cluster from their metadata (a metadata-only listing), those going left out."""
    out = []
    for meta in metas:
        labels = meta.get("labels") or {}
        if labels.get(POOLER_LABEL) != cluster_name or meta.get("deletionTimestamp"):
            continue
        points_to = str((meta.get("annotations") or {}).get(POINTS_TO_ANNOTATION) or "")
        side = str(labels.get(POOLER_SIDE_LABEL) or "")
        out.append(PoolerPod(str(meta.get("name") or ""), side, points_to))
    return sorted(out, key=lambda p: p.name)


def desired_target(cluster: PostgresCluster, side: str, primary: str | None) -> str | None:
    """Where one side's pods should point: the rw side at the primary by its pod name (not through the
    -rw Service, whose endpoints follow the role label a moment later); the ro side at -ro. None: no
    primary known, leave them."""
    if side == "ro":
        return initial_target(cluster, side)
    return pod_host(cluster, primary) if primary else None


def to_point(cluster: PostgresCluster, pods: Sequence[PoolerPod],
             primary: str | None) -> list[tuple[str, str]]:  # fmt: skip
    """(pod, host) for every pooler pod whose recorded target is not where it should point (a pod the
    operator never pointed points where its Deployment started it)."""
    out = []
    for pod in pods:
        target = desired_target(cluster, pod.side, primary)
        current = pod.points_to or initial_target(cluster, pod.side)
        if target is not None and current != target:
            out.append((pod.name, target))
    return out


def ready_pods(cluster: PostgresCluster, deployments: Iterable[Mapping[str, Any]]) -> int:
    """Ready pooler pods of the current template, from the status of the pooler's Deployments: while one
    rolls out (its controller has not seen the new template, or old pods still serve) its old pods do not
    count, so Ready waits for the rollout."""
    wanted = {deployment_name(cluster, side) for side in ("rw", "ro")}
    total = 0
    for d in deployments:
        status = d.get("status") or {}
        seen = int(status.get("observedGeneration") or 0)
        if objects.name(d) not in wanted or seen < objects.generation(d):
            continue
        ready, updated = int(status.get("readyReplicas") or 0), int(status.get("updatedReplicas") or 0)
        replicas = int(status.get("replicas") or 0)
        total += min(ready, updated) if replicas <= updated else 0
    return total


def status_condition(cluster: PostgresCluster, ready: int, pointed: int, primary: str | None,
                     problem: str | None) -> tuple[bool, str, str]:  # fmt: skip
    """The Pooler condition: (ok, reason, message) from the ready pods, how many rw pods point at the
    primary, and a problem the sub-reconciler met."""
    pooler = cluster.spec.pooler
    assert pooler is not None
    wanted = pooler.instances * len(pooler.sides)
    target = desired_target(cluster, "rw", primary)
    if problem:
        return False, "PoolerProblem", problem
    if ready < wanted:
        return False, "PoolerStarting", f"{ready}/{wanted} pooler pods ready"
    if target is None:
        return False, "PoolerWaiting", f"{ready}/{wanted} pooler pods ready; no running primary to point at"
    if pointed < pooler.instances:
        return False, "PoolerPointing", f"{ready}/{wanted} pooler pods ready; {pointed} pointed at {target}"
    return True, "PoolerReady", f"{ready}/{wanted} pooler pods ready, pointing at {target}"
