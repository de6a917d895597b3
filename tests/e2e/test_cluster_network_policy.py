"""The cluster's NetworkPolicy on real pods, enforced by the local cluster's kube-router (docs/network.md).

On the e2e tier's example cluster (orders-db, three instances; other modules share it, so the module
gives it back with its default policy). Client pods run the PostgreSQL image (it has psql and bash):
one in the cluster's namespace (admitted to 5432 by default), one in another namespace (admitted
nowhere). Each probe is a TCP connect from inside
the pod, so what is measured is the packet filter, not PostgreSQL's own pg_hba. The operator runs in
the cluster (deploy/), so its switchover over Patroni's REST API crosses the policy too.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from harness.deployed_operator import EXAMPLE, EXAMPLE_NAMESPACE
from harness.kube import get_json, get_or_none
from harness.local_cluster import Kube
from harness.pgcluster import healthy, kill_container, secret, status, wait_serving
from harness.waiting import wait_until
from pg_operator.images import default_image

NS, NAME = EXAMPLE_NAMESPACE, EXAMPLE
REPLICAS = 3
OUTSIDE_NS = "netpol-outside"
INSIDER, OUTSIDER = "insider", "outsider"
CONNECT_SECONDS = 4
SESSION_ENCRYPTED = "select ssl from pg_stat_ssl where pid = pg_backend_pid()"


def client_pod(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "netpol-client"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 999, "runAsGroup": 999},
            "containers": [{
                "name": "client", "image": default_image("16"), "imagePullPolicy": "Never",
                "command": ["/usr/bin/tini", "-s", "--", "sleep", "infinity"],
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def guarded(example: Kube) -> Iterator[Kube]:
    """The example cluster with its default policy, and the two client pods; afterwards the policy is
    the default again and the clients are gone."""
    example.kubectl("create", "namespace", OUTSIDE_NS)
    try:
        wait_serving(example, NS, NAME, REPLICAS, 300)
        for name, namespace in ((INSIDER, NS), (OUTSIDER, OUTSIDE_NS)):
            example.kubectl("apply", "-f", "-", input=json.dumps(client_pod(name, namespace)))
        for name, namespace in ((INSIDER, NS), (OUTSIDER, OUTSIDE_NS)):
            example.kubectl("-n", namespace, "wait", f"pod/{name}", "--for=condition=Ready", "--timeout=120s",
                            timeout=130)  # fmt: skip
        yield example
    finally:
        default = '{"spec":{"networkPolicy":null}}'
        example.kubectl("patch", "pgc", NAME, "-n", NS, "--type=merge", "-p", default)
        example.kubectl("delete", "pod", INSIDER, "-n", NS, "--ignore-not-found", "--wait=false")
        example.kubectl("delete", "namespace", OUTSIDE_NS, "--ignore-not-found", "--wait=false")
        wait_until("the default policy back", lambda: the_policy(example), 60, 1)


def in_pod(
    kube: Kube, namespace: str, pod: str, script: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run a bash script in a client pod; anything secret goes through stdin, never the command line."""
    res: subprocess.CompletedProcess[str] = kube.kubectl(
        "-n", namespace, "exec", "-i", pod, "--", "bash", "-c", script, input=stdin, check=False, timeout=60
    )
    return res


def tcp_connects(kube: Kube, namespace: str, pod: str, ip: str, port: int) -> bool:
    """Whether a TCP connection from the pod to ip:port is established within CONNECT_SECONDS."""
    res = in_pod(kube, namespace, pod, f"timeout {CONNECT_SECONDS} bash -c 'exec 3<>/dev/tcp/{ip}/{port}'")
    return res.returncode == 0


def pod_ip(kube: Kube, pod: str) -> str:
    return str(get_json(kube, "pod", pod, "-n", NS)["status"]["podIP"])


def primary(kube: Kube) -> str:
    st = wait_until("a healthy cluster", lambda: healthy(kube, NS, NAME, REPLICAS), 300)
    return str(st["currentPrimary"])


def psql_over_tls(kube: Kube, namespace: str, pod: str) -> subprocess.CompletedProcess[str]:
    """From a client pod: whether its session through <name>-rw is encrypted ("t"), connecting with
    sslmode=verify-full, the app Secret's CA and password."""
    app = secret(kube, NS, f"{NAME}-app")
    host = f"{NAME}-rw.{NS}.svc"
    conninfo = (
        f"host={host} port={app['port']} user={app['username']} dbname={app['dbname']} "
        "sslmode=verify-full sslrootcert=/tmp/ca.crt connect_timeout=5"
    )
    script = (
        "set -e; read -r PGPASSWORD; read -r conninfo; export PGPASSWORD; cat > /tmp/ca.crt; "
        'psql "$conninfo" -Atc ' + shlex.quote(SESSION_ENCRYPTED)
    )
    stdin = "\n".join([app["password"], conninfo, app["ca.crt"]])
    return in_pod(kube, namespace, pod, script, stdin=stdin)


def the_policy(kube: Kube) -> dict[str, Any] | None:
    found: dict[str, Any] | None = get_or_none(kube, "networkpolicy", NAME, "-n", NS)
    return found


def test_the_cluster_gets_its_policy_by_default(guarded: Kube) -> None:
    policy = wait_until("the NetworkPolicy", lambda: the_policy(guarded), 60)
    ports = {r["ports"][0]["port"]: r["from"] for r in policy["spec"]["ingress"]}
    assert set(ports) == {5432, 8008, 9187}, ports
    # Metrics from the install's monitoring namespace (the chart's default), never from every namespace.
    assert {"namespaceSelector": {}} not in ports[9187], ports[9187]
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    assert monitoring in ports[9187], ports[9187]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    owner = policy["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("PostgresCluster", NAME)


def test_a_pod_outside_the_allowed_set_reaches_no_port_of_the_instances(guarded: Kube) -> None:
    leader = primary(guarded)
    ip = pod_ip(guarded, leader)
    rw = str(get_json(guarded, "service", f"{NAME}-rw", "-n", NS)["spec"]["clusterIP"])
    # The positive control first: the same probe from the insider connects, so a failure below is the
    # policy and not the probe.
    assert tcp_connects(guarded, NS, INSIDER, ip, 5432), "the insider cannot reach 5432: the probe is broken"
    for target, port in ((ip, 5432), (ip, 8008), (ip, 9187), (rw, 5432)):
        reached = tcp_connects(guarded, OUTSIDE_NS, OUTSIDER, target, port)
        assert not reached, f"the outsider reached {target}:{port}"
    res = psql_over_tls(guarded, OUTSIDE_NS, OUTSIDER)
    assert res.returncode != 0, "psql from outside the allowed set connected"


def test_a_pod_of_the_namespace_connects_with_psql_over_tls_but_not_to_patroni(guarded: Kube) -> None:
    res = psql_over_tls(guarded, NS, INSIDER)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "t", f"the session is not encrypted: {res.stdout!r}"
    leader = primary(guarded)
    assert not tcp_connects(guarded, NS, INSIDER, pod_ip(guarded, leader), 8008), (
        "Patroni's REST API is open to every pod of the namespace"
    )


def test_replication_and_failover_work_under_the_policy(guarded: Kube) -> None:
    old = primary(guarded)

    def streaming() -> bool:
        instances = status(guarded, NS, NAME).get("instances") or []
        return any(i.get("role") == "replica" and i.get("ready") for i in instances)

    wait_until("the replica to stream", streaming, 120)
    kill_container(guarded, NS, old)
    new = wait_until("a new primary", lambda: (st := healthy(guarded, NS, NAME, REPLICAS)) and
                     st["currentPrimary"] != old and st["currentPrimary"], 300, 1)  # fmt: skip
    assert new != old
    assert psql_over_tls(guarded, NS, INSIDER).stdout.strip() == "t"


def test_the_operator_switches_over_through_patroni_under_the_policy(guarded: Kube) -> None:
    old = primary(guarded)
    target = next(i["name"] for i in status(guarded, NS, NAME)["instances"] if i["name"] != old)
    guarded.kubectl("annotate", "pgc", NAME, "-n", NS, f"db.example.com/switchover-to={target}")

    def switched() -> bool:
        return bool(status(guarded, NS, NAME).get("currentPrimary") == target)

    wait_until(f"{target} to become primary", switched, 180, 1)


def test_allow_from_admits_the_named_namespace_instead(guarded: Kube) -> None:
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": OUTSIDE_NS}}}]
    patch = {"spec": {"networkPolicy": {"allowFrom": peers}}}
    guarded.kubectl("patch", "pgc", NAME, "-n", NS, "--type=merge", "-p", json.dumps(patch))
    ip = pod_ip(guarded, primary(guarded))
    wait_until("the outsider to be admitted to 5432",
               lambda: tcp_connects(guarded, OUTSIDE_NS, OUTSIDER, ip, 5432), 60, 1)  # fmt: skip
    wait_until("the insider to be shut out of 5432",
               lambda: not tcp_connects(guarded, NS, INSIDER, ip, 5432), 60, 1)  # fmt: skip
    assert not tcp_connects(guarded, OUTSIDE_NS, OUTSIDER, ip, 8008), "allowFrom opened Patroni's REST API"


def test_the_api_server_refuses_a_bad_peer_naming_the_field(guarded: Kube) -> None:
    body = get_json(guarded, "pgc", NAME, "-n", NS)
    outside = {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16"]}}
    body["spec"]["networkPolicy"] = {"allowFrom": [outside]}
    res = guarded.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(body), check=False)
    assert res.returncode != 0
    assert "spec.networkPolicy.allowFrom[0].ipBlock.except" in res.stderr, res.stderr
    body["spec"]["networkPolicy"] = {"allowFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}
    res = guarded.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(body), check=False)
    assert res.returncode != 0
    assert "spec.networkPolicy.allowFrom[0]" in res.stderr and "either an ipBlock" in res.stderr, res.stderr


def test_turning_the_policy_off_removes_it(guarded: Kube) -> None:
    patch = {"spec": {"networkPolicy": {"enabled": False}}}
    guarded.kubectl("patch", "pgc", NAME, "-n", NS, "--type=merge", "-p", json.dumps(patch))
    wait_until("the NetworkPolicy to go", lambda: the_policy(guarded) is None, 60, 1)
    ip = pod_ip(guarded, primary(guarded))
    wait_until("the outsider to reach Patroni once nothing filters",
               lambda: tcp_connects(guarded, OUTSIDE_NS, OUTSIDER, ip, 8008), 60, 1)  # fmt: skip
