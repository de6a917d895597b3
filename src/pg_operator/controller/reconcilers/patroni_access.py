"""How the operator reaches an instance's Patroni: its REST API over HTTPS, verified against what the
cluster's instances trust, at the pod's name under the headless Service, with the basic-auth credentials
of Secret `<name>-patroni-api`. Never plain HTTP."""

from __future__ import annotations

import base64
import ssl

from pg_operator.api.cluster import PostgresCluster
from pg_operator.controller.cache import Snapshot
from pg_operator.orchestration.instances import Instance
from pg_operator.patroni.client import Endpoint, PatroniAuth, TrustStore
from pg_operator.specs import names
from pg_operator.specs.ca_rotation import PREVIOUS_CERT_KEY
from pg_operator.specs.tls import CA_CERT_KEY


def patroni_auth(snapshot: Snapshot, cluster: PostgresCluster) -> PatroniAuth | None:
    secret = snapshot.find("v1", "Secret", names.patroni_api_secret(cluster))
    data = (secret or {}).get("data") or {}
    try:
        return PatroniAuth(
            base64.b64decode(data["username"]).decode(), base64.b64decode(data["password"]).decode()
        )
    except (KeyError, ValueError):
        return None


def patroni_endpoint(
    snapshot: Snapshot, cluster: PostgresCluster, inst: Instance, trust: TrustStore
) -> Endpoint | str | None:
    """Where to reach the instance's Patroni; None without a pod IP; the reason (a str) when there is no
    readable CA to verify it with, so Patroni is not asked rather than asked unverified."""
    if not inst.pod_ip:
        return None
    ca = (snapshot.find("v1", "Secret", names.ca_secret(cluster)) or {}).get("data") or {}
    served = (snapshot.find("v1", "Secret", names.server_tls_secret(cluster)) or {}).get("data") or {}
    try:
        # What the instances trust (the user's server CA too, if they bring one), and the cluster's CAs:
        # during a CA rotation a member may still present the previous CA's certificate.
        ca_pem = b"".join(
            base64.b64decode(source[key], validate=True)
            for source, key in ((served, CA_CERT_KEY), (ca, CA_CERT_KEY), (ca, PREVIOUS_CERT_KEY))
            if key in source
        )
        if not ca_pem.strip():
            # An empty bundle would leave the context to the system's trust store: not this cluster's.
            raise ValueError("no CA certificate")
        context = trust.context(ca_pem)
    except (KeyError, ValueError, ssl.SSLError):
        return (
            f"Patroni on {inst.name} is not asked: no readable CA in Secret "
            f"{names.ca_secret(cluster)} to verify its certificate with (never plain HTTP)"
        )
    host = f"{inst.name}.{names.headless_service(cluster)}.{cluster.namespace}.svc"
    return Endpoint(inst.pod_ip, context, host)
