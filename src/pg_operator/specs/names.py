"""Names of a cluster's children, all derived from the cluster's name (see docs/architecture.md)."""

from __future__ import annotations

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import DATA_VOLUME


def headless_service(cluster: PostgresCluster) -> str:
    return cluster.name


def rw_service(cluster: PostgresCluster) -> str:
    return f"{cluster.name}-rw"


def ro_service(cluster: PostgresCluster) -> str:
    return f"{cluster.name}-ro"


def r_service(cluster: PostgresCluster) -> str:
    return f"{cluster.name}-r"


def statefulset(cluster: PostgresCluster) -> str:
    return cluster.name


def instance(cluster: PostgresCluster) -> str:
    """ServiceAccount, Role, RoleBinding and ConfigMap. Not `<name>-config`: Patroni's DCS owns
    `<scope>-config`, `-leader`, `-failover` and `-sync`."""
    return f"{cluster.name}-instance"


def pdb(cluster: PostgresCluster) -> str:
    """The replicas' PodDisruptionBudget (every instance's, where drains are not handled: specs/pdb.py)."""
    return cluster.name


def primary_pdb(cluster: PostgresCluster) -> str:
    """The primary's PodDisruptionBudget (specs/pdb.py)."""
    return f"{cluster.name}-primary"


def superuser_secret(cluster: PostgresCluster) -> str:
    return f"{cluster.name}-superuser"


def replication_secret(cluster: PostgresCluster) -> str:
    return f"{cluster.name}-replication"


def app_secret(cluster: PostgresCluster) -> str:
    return f"{cluster.name}-app"


def patroni_api_secret(cluster: PostgresCluster) -> str:
    return f"{cluster.name}-patroni-api"


def ca_secret(cluster: PostgresCluster) -> str:
    return f"{cluster.name}-ca"


def server_tls_secret(cluster: PostgresCluster) -> str:
    return f"{cluster.name}-server-tls"


def pod(cluster: PostgresCluster, ordinal: int) -> str:
    return f"{statefulset(cluster)}-{ordinal}"


def pvc(cluster: PostgresCluster, ordinal: int) -> str:
    return f"{DATA_VOLUME}-{pod(cluster, ordinal)}"


def rw_host(cluster: PostgresCluster) -> str:
    return f"{rw_service(cluster)}.{cluster.namespace}.svc"


def rw_fqdn(cluster: PostgresCluster, domain: str = "cluster.local") -> str:
    return f"{rw_host(cluster)}.{domain}"
