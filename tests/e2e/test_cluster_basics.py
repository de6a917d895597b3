"""A real PostgreSQL cluster on the full profile: the operator installed from deploy/ (its image built
locally), the user's example applied, Patroni electing a primary and two streaming replicas, an
application connecting with the `<name>-app` Secret, and the Secrets as the source of truth for every
password (deleted, edited, refused, and a cluster recreated over its volumes)."""

from __future__ import annotations

import base64
import json
import re
import socket
import ssl
import struct
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography import x509

from harness.deployed_operator import EXAMPLE, EXAMPLE_NAMESPACE
from harness.e2e_backup import superuser_sql
from harness.kube import get_json, get_or_none
from harness.local_cluster import Kube
from harness.objects import cluster_model
from harness.paths import REPO
from harness.pgcluster import Writer, connect_app, healthy, secret, service_ip, status, wait_serving
from harness.waiting import wait_until
from pg_operator.scram import scram_sha256_verifier
from pg_operator.specs.credential_changes import APPLIED_ANNOTATION, fingerprint
from pg_operator.specs.tls import KeyPair, issue_client, issue_server, new_ca

SWITCHOVER = "db.example.com/switchover-to"

NS, NAME = EXAMPLE_NAMESPACE, EXAMPLE


def test_example_becomes_ready_with_one_primary_and_two_streaming_replicas(example: Kube) -> None:
    st = status(example, NS, NAME)
    assert sorted(i["role"] for i in st["instances"]) == ["primary", "replica", "replica"], st
    assert st["readyReplicas"] == 3 and st["currentPrimary"]
    states = superuser_sql(example, NS, st["currentPrimary"], "select state from pg_stat_replication")
    assert states.split() == ["streaming", "streaming"], states
    printed = example.kubectl("get", "pgc", "-n", NS).stdout
    assert NAME in printed and st["currentPrimary"] in printed, printed


def test_application_writes_through_rw_and_reads_through_ro(example: Kube) -> None:
    wait_serving(example, NS, NAME, 3, 60)
    with connect_app(example, NS, NAME, "rw") as rw:
        assert rw.execute("select pg_is_in_recovery()").fetchone() == (False,)
        rw.execute("create table if not exists orders (id serial primary key, item text not null)")
        rw.execute("insert into orders (item) select 'item-' || g from generate_series(1, 100) g")
        written = rw.execute("select count(*) from orders").fetchone()

    def replica_has_rows() -> bool:
        with connect_app(example, NS, NAME, "ro") as ro:
            assert ro.execute("select pg_is_in_recovery()").fetchone() == (True,)
            return ro.execute("select count(*) from orders").fetchone() == written

    wait_until("the rows to reach a replica through -ro", replica_has_rows, timeout=60)


def test_app_secret_uri_works_as_given(example: Kube, tmp_path: Path) -> None:
    app = secret(example, NS, f"{NAME}-app")
    ca = tmp_path / "ca.crt"
    ca.write_text(app["ca.crt"])
    # The URI names the Service's DNS name, which this host cannot resolve: libpq connects to `hostaddr`
    # and still checks the certificate against the name in the URI (sslmode=verify-full).
    assert "sslmode=verify-full" in app["uri"]
    with psycopg.connect(app["uri"], hostaddr=service_ip(example, NS, f"{NAME}-rw"), sslrootcert=str(ca),
                         connect_timeout=5) as conn:  # fmt: skip
        assert conn.execute("select current_user, current_database()").fetchone() == (
            app["username"],
            app["dbname"],
        )
        assert conn.execute("select ssl from pg_stat_ssl where pid = pg_backend_pid()").fetchone() == (True,)


# --- TLS -----------------------------------------------------------------------------------------------


def test_tls_verify_full_through_every_name_and_no_tls_is_refused(example: Kube, tmp_path: Path) -> None:
    wait_serving(example, NS, NAME, 3, 120)
    app = secret(example, NS, f"{NAME}-app")
    ca = tmp_path / "ca.crt"
    ca.write_text(app["ca.crt"])

    def connect(host: str, hostaddr: str, **extra: str) -> psycopg.Connection[Any]:
        return psycopg.connect(host=host, hostaddr=hostaddr, port=5432, user=app["username"],
                               password=app["password"], dbname=app["dbname"], sslrootcert=str(ca),
                               connect_timeout=5, **{"sslmode": "verify-full", **extra})  # fmt: skip

    checked = []
    for suffix in ("-rw", "-ro", "-r"):
        ip = service_ip(example, NS, f"{NAME}{suffix}")
        for host in (f"{NAME}{suffix}", f"{NAME}{suffix}.{NS}", f"{NAME}{suffix}.{NS}.svc",
                     f"{NAME}{suffix}.{NS}.svc.cluster.local"):  # fmt: skip
            with connect(host, ip) as conn:
                mine = "select ssl, version from pg_stat_ssl where pid = pg_backend_pid()"
                row = conn.execute(mine).fetchone()
                assert row is not None and row[0] is True and row[1] in ("TLSv1.2", "TLSv1.3"), row
            checked.append(host)
    # Each pod through the headless Service.
    for inst in status(example, NS, NAME)["instances"]:
        pod_ip = get_json(example, "pod", inst["name"], "-n", NS)["status"]["podIP"]
        with connect(f"{inst['name']}.{NAME}.{NS}.svc", pod_ip) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
        checked.append(inst["name"])
    print(json.dumps({"measure": "tls_verify_full_names", "checked": len(checked)}), flush=True)
    rw_ip = service_ip(example, NS, f"{NAME}-rw")
    with pytest.raises(psycopg.OperationalError, match=r"certificate|does not match"):
        connect("somewhere-else.example", rw_ip).close()  # a name the certificate does not carry
    with pytest.raises(psycopg.OperationalError, match="rejects connection"):
        connect(f"{NAME}-rw", rw_ip, sslmode="disable").close()
    # Replication runs over TLS, each replica logged in by the replication role's client certificate.
    primary = status(example, NS, NAME)["currentPrimary"]
    walsenders = "select s.ssl, s.client_dn from pg_stat_replication r join pg_stat_ssl s using (pid)"
    assert superuser_sql(example, NS, primary, walsenders).split() == ["t|/CN=replicator"] * 2
    # The superuser never logs in over the network, whatever the password.
    su = secret(example, NS, f"{NAME}-superuser")
    for host in (f"{NAME}-rw", f"{primary}.{NAME}.{NS}.svc"):
        address = rw_ip if host.endswith("-rw") else pod_ip_of(example, primary)
        with pytest.raises(psycopg.OperationalError, match="rejects connection"):
            psycopg.connect(host=host, hostaddr=address, port=5432, user="postgres", password=su["password"],
                            dbname="postgres", sslmode="verify-full", sslrootcert=str(ca),
                            connect_timeout=5).close()  # fmt: skip
    # Patroni's REST API speaks HTTPS only, under the pod's name, with a certificate the cluster's CA signed.
    context = ssl.create_default_context(cafile=str(ca))
    for inst in status(example, NS, NAME)["instances"]:
        with (
            socket.create_connection((pod_ip_of(example, inst["name"]), 8008), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=f"{inst['name']}.{NAME}.{NS}.svc") as tls,
        ):
            tls.sendall(b"GET /liveness HTTP/1.0\r\n\r\n")
            assert tls.recv(64).startswith(b"HTTP/1.0 200"), inst
        with socket.create_connection((pod_ip_of(example, inst["name"]), 8008), timeout=5) as raw:
            raw.sendall(b"GET /liveness HTTP/1.0\r\n\r\n")  # plain HTTP gets no answer
            try:
                answer = raw.recv(64)
            except OSError:  # reset by the TLS server
                answer = b""
            assert not answer.startswith(b"HTTP/"), (inst, answer)


def server_certificate_serial(host: str, port: int = 5432) -> int:
    """The serial of the certificate a PostgreSQL server presents (SSLRequest, then a TLS handshake)."""
    with socket.create_connection((host, port), timeout=5) as raw:
        raw.sendall(struct.pack("!ii", 8, 80877103))
        assert raw.recv(1) == b"S", "the server refused TLS"
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # read it, whoever signed it
        with context.wrap_socket(raw) as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def test_a_renewed_server_certificate_is_served_without_a_restart_or_a_failed_write(example: Kube) -> None:
    """The operator re-issues the certificate when its Secret goes (as it does when a third of its life is
    left); each instance reloads it. Writers on fresh and pooled connections see no failure."""
    wait_serving(example, NS, NAME, 3, 120)
    pods = [i["name"] for i in status(example, NS, NAME)["instances"]]
    ips = {pod: get_json(example, "pod", pod, "-n", NS)["status"]["podIP"] for pod in pods}
    before = {pod: server_certificate_serial(ip) for pod, ip in ips.items()}
    starts = {pod: restarts_of(example, pod) for pod in pods}
    with (
        Writer(example, NS, NAME, "tls_fresh") as fresh,
        Writer(example, NS, NAME, "tls_pooled", persistent=True) as pooled,
    ):
        fresh.wait_for_writes(10, 60)
        pooled.wait_for_writes(10, 60)
        example.kubectl("delete", "secret", f"{NAME}-server-tls", "-n", NS)

        def all_renewed() -> bool:
            return all(server_certificate_serial(ip) != before[pod] for pod, ip in ips.items())

        wait_until("every instance to serve the new certificate", all_renewed, 180, 2)
        fresh.wait_for_writes(10, 60)
        pooled.wait_for_writes(10, 60)
    print(json.dumps({"measure": "tls_leaf_renewal", "fresh_outage_s": round(fresh.longest_outage, 2),
                      "pooled_outage_s": round(pooled.longest_outage, 2), "fresh_acked": len(fresh.acked),
                      "pooled_acked": len(pooled.acked), "failed": fresh.failures + pooled.failures}),
          flush=True)  # fmt: skip
    assert fresh.missing() == [] and pooled.missing() == []
    assert (fresh.failures, pooled.failures) == (0, 0), "a write failed across the renewal"
    assert {pod: restarts_of(example, pod) for pod in pods} == starts, "a container restarted"


def leaf_issuer(host: str) -> str:
    """The issuer name of the certificate a PostgreSQL server presents."""
    with socket.create_connection((host, 5432), timeout=5) as raw:
        raw.sendall(struct.pack("!ii", 8, 80877103))
        assert raw.recv(1) == b"S", "the server refused TLS"
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with context.wrap_socket(raw) as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).issuer.rfc4514_string()


def postmaster_start(kube: Kube, pod: str) -> str:
    return superuser_sql(kube, NS, pod, "select pg_postmaster_start_time()")


def test_a_ca_rotation_goes_through_a_bundle_without_a_failed_write_or_a_restart(example: Kube) -> None:
    """The proof of the bundle: verifying writers (fresh and pooled, following the app Secret's ca.crt)
    see no failure while the CA is replaced, and no instance restarts (restart counts and postmaster start
    times unchanged)."""
    wait_serving(example, NS, NAME, 3, 120)
    pods = [i["name"] for i in status(example, NS, NAME)["instances"]]
    ips = {pod: pod_ip_of(example, pod) for pod in pods}
    old_ca = x509.load_pem_x509_certificate(secret(example, NS, f"{NAME}-ca")["ca.crt"].encode())
    starts = {pod: restarts_of(example, pod) for pod in pods}
    started = {pod: postmaster_start(example, pod) for pod in pods}
    token = uuid.uuid4().hex[:8]
    began = time.monotonic()
    with (
        Writer(example, NS, NAME, "ca_fresh", verify=True) as fresh,
        Writer(example, NS, NAME, "ca_pooled", persistent=True, verify=True) as pooled,
    ):
        fresh.wait_for_writes(10, 60)
        pooled.wait_for_writes(10, 60)
        example.kubectl("annotate", "pgc", NAME, "-n", NS, f"db.example.com/rotate-ca={token}", "--overwrite")

        def rotated() -> bool:
            ca = get_json(example, "secret", f"{NAME}-ca", "-n", NS)
            done = ((ca["metadata"].get("annotations") or {}).get("db.example.com/ca-rotated-for") == token
                    and "previous-ca.crt" not in ca["data"])  # fmt: skip
            new = x509.load_pem_x509_certificate(base64.b64decode(ca["data"]["ca.crt"]))
            return (
                done
                and new.subject != old_ca.subject
                and all(leaf_issuer(ip) == new.subject.rfc4514_string() for ip in ips.values())
            )

        wait_until("the CA rotation to finish and every instance to serve the new CA's leaf", rotated, 600, 3)
        took = time.monotonic() - began
        app_ca = secret(example, NS, f"{NAME}-app")["ca.crt"]
        assert app_ca.count("BEGIN CERTIFICATE") == 1
        assert app_ca == secret(example, NS, f"{NAME}-ca")["ca.crt"]
        fresh.wait_for_writes(10, 60)
        pooled.wait_for_writes(10, 60)
    print(json.dumps({"measure": "tls_ca_rotation", "seconds": round(took, 1),
                      "fresh_outage_s": round(fresh.longest_outage, 2),
                      "pooled_outage_s": round(pooled.longest_outage, 2), "fresh_acked": len(fresh.acked),
                      "pooled_acked": len(pooled.acked), "failed": fresh.failures + pooled.failures,
                      "errors": (fresh.errors + pooled.errors)[:3]}), flush=True)  # fmt: skip
    assert fresh.missing() == [] and pooled.missing() == []
    assert (fresh.failures, pooled.failures) == (0, 0), fresh.errors + pooled.errors
    assert {pod: restarts_of(example, pod) for pod in pods} == starts, "a container restarted"
    assert {pod: postmaster_start(example, pod) for pod in pods} == started
    # Replication kept going, now authenticated by the new CA's client certificate.
    walsenders = "select s.client_dn from pg_stat_replication r join pg_stat_ssl s using (pid)"
    assert on_primary(example, walsenders).split() == ["/CN=replicator"] * 2
    reasons = [e.get("message", "") for e in get_json(example, "events", "-n", NS)["items"]
               if e.get("reason") == "CertificateAuthorityRotation"]  # fmt: skip
    assert any("started" in m for m in reasons) and any("finished" in m for m in reasons), reasons
    # The operator still drives Patroni over HTTPS with the new CA: a switchover goes through.
    old_primary = wait_serving(example, NS, NAME, 3, 180)["currentPrimary"]
    example.kubectl("annotate", "pgc", NAME, "-n", NS, f"{SWITCHOVER}=auto", "--overwrite")
    wait_until("a switchover after the rotation", lambda: (st := healthy(example, NS, NAME, 3))
               and st["currentPrimary"] != old_primary, 300, 1)  # fmt: skip


def test_a_server_certificate_the_user_brings_is_served_after_its_ca_is_trusted(
    example: Kube, tmp_path: Path
) -> None:
    """spec.tls.serverSecret, as a certificate manager writes it: refused while it lacks a name, then
    served by every instance (its CA trusted everywhere first) with no failed write or restart, verified by
    a client that knows only the user's CA; taken away, the operator's certificate comes back."""
    wait_serving(example, NS, NAME, 3, 120)
    now = datetime.now(UTC)
    model = cluster_model(NAME, NS)
    corp = new_ca(model, now)  # stands for the user's CA (a certificate manager's issuer)
    leaf = issue_server(model, corp, now)
    pods = [i["name"] for i in status(example, NS, NAME)["instances"]]
    ips = {pod: pod_ip_of(example, pod) for pod in pods}
    starts = {pod: restarts_of(example, pod) for pod in pods}

    def user_secret(name: str, cert: bytes, key: bytes) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": NS, "labels": {"db.example.com/cluster": NAME}},
            "data": {
                k: base64.b64encode(v).decode()
                for k, v in {"tls.crt": cert, "tls.key": key, "ca.crt": corp.cert_pem}.items()
            },
        }
        example.kubectl("apply", "-f", "-", input=json.dumps(body))

    def use(secret_name: str | None) -> None:
        patch = {"spec": {"tls": {"serverSecret": secret_name}}}
        example.kubectl("patch", "pgc", NAME, "-n", NS, "--type=merge", "-p", json.dumps(patch))

    # Missing a name peers use: refused with the name, and nothing changes.
    narrow = issue_server(cluster_model(NAME, "elsewhere"), corp, now)
    user_secret("corp-narrow", narrow.cert_pem, narrow.key_pem)
    before = {pod: server_certificate_serial(ip) for pod, ip in ips.items()}
    use("corp-narrow")
    refused = wait_until("Degraded TlsSecretInvalid", lambda: (c := condition(example, "Degraded"))
                         and c.get("reason") == "TlsSecretInvalid" and c, 60, 1)  # fmt: skip
    assert "Secret corp-narrow key tls.crt: does not name" in refused["message"], refused
    assert {pod: server_certificate_serial(ip) for pod, ip in ips.items()} == before

    user_secret("corp-cert", leaf.cert_pem, leaf.key_pem)
    serial = x509.load_pem_x509_certificate(leaf.cert_pem).serial_number
    with (
        Writer(example, NS, NAME, "user_fresh", verify=True) as fresh,
        Writer(example, NS, NAME, "user_pooled", persistent=True, verify=True) as pooled,
    ):
        fresh.wait_for_writes(10, 60)
        pooled.wait_for_writes(10, 60)
        use("corp-cert")
        wait_until(
            "every instance to serve the user's certificate",
            lambda: all(server_certificate_serial(ip) == serial for ip in ips.values()),
            300,
            2,
        )
        wait_until(
            "no longer degraded",
            lambda: (condition(example, "Degraded") or {}).get("status") != "True",
            60,
            1,
        )
        corp_only = tmp_path / "corp.crt"
        corp_only.write_bytes(corp.cert_pem)
        app = secret(example, NS, f"{NAME}-app")
        with psycopg.connect(
            host=f"{NAME}-rw",
            hostaddr=service_ip(example, NS, f"{NAME}-rw"),
            port=5432,
            user=app["username"],
            password=app["password"],
            dbname=app["dbname"],
            sslmode="verify-full",
            sslrootcert=str(corp_only),
            connect_timeout=5,
        ) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
        replication_is_the_clusters_alone(example, corp, ips, tmp_path)
        # Taken away: the operator's own certificate again, the user's CA trusted until it is served.
        use(None)
        wait_until(
            "every instance to serve the operator's certificate again",
            lambda: all(server_certificate_serial(ip) != serial for ip in ips.values()),
            300,
            2,
        )
        fresh.wait_for_writes(10, 60)
        pooled.wait_for_writes(10, 60)
    print(json.dumps({"measure": "tls_user_server_certificate", "failed": fresh.failures + pooled.failures,
                      "fresh_outage_s": round(fresh.longest_outage, 2),
                      "pooled_outage_s": round(pooled.longest_outage, 2),
                      "errors": (fresh.errors + pooled.errors)[:3]}), flush=True)  # fmt: skip
    assert fresh.missing() == [] and pooled.missing() == []
    assert (fresh.failures, pooled.failures) == (0, 0), fresh.errors + pooled.errors
    assert {pod: restarts_of(example, pod) for pod in pods} == starts, "a container restarted"
    walsenders = "select s.client_dn from pg_stat_replication r join pg_stat_ssl s using (pid)"
    wait_until(
        "both replicas streaming",
        lambda: on_primary(example, walsenders).split() == ["/CN=replicator"] * 2,
        120,
        2,
    )


def replication_is_the_clusters_alone(kube: Kube, issuer: KeyPair, ips: dict[str, str],
                                      tmp_path: Path) -> None:  # fmt: skip
    """The attack on a shared issuer (one certificate manager's issuer for many namespaces): anyone it
    serves can get a certificate with CN=replicator. The instances accept replication client certificates
    from the cluster's replication CA alone, so that one is refused while the cluster's own is taken."""
    forged = issue_client(issuer, "replicator", datetime.now(UTC))
    own = secret(kube, NS, f"{NAME}-server-tls")
    attempts = {
        "forged": (forged.cert_pem.decode(), forged.key_pem.decode()),
        "own": (own["replication.crt"], own["replication.key"]),
    }
    outcome = {}
    for who, (cert, key) in attempts.items():
        (tmp_path / f"{who}.crt").write_text(cert)
        (tmp_path / f"{who}.key").write_text(key)
        (tmp_path / f"{who}.key").chmod(0o600)
        try:
            with psycopg.connect(
                host=next(iter(ips.values())),
                port=5432,
                user="replicator",
                dbname="postgres",
                sslmode="require",
                sslcert=str(tmp_path / f"{who}.crt"),
                sslkey=str(tmp_path / f"{who}.key"),
                connect_timeout=5,
            ) as conn:
                outcome[who] = str(conn.execute("select current_user").fetchone())
        except psycopg.OperationalError as exc:
            outcome[who] = f"refused: {exc}"
    assert outcome["own"] == "('replicator',)", outcome
    assert outcome["forged"].startswith("refused"), outcome


def restarts_of(kube: Kube, pod: str) -> int:
    statuses = get_json(kube, "pod", pod, "-n", NS)["status"].get("containerStatuses") or []
    return int(next(c.get("restartCount", 0) for c in statuses if c["name"] == "postgres"))


# --- credentials: the Secrets are the source of truth --------------------------------------------------

CREDENTIALS = ("app", "replication", "superuser", "patroni-api")


def applied_secret(kube: Kube, kind: str) -> dict[str, str] | None:
    """The decoded Secret once the operator marked exactly its current password as applied, else None."""
    body = get_or_none(kube, "secret", f"{NAME}-{kind}", "-n", NS)
    if not body:
        return None
    data = {k: base64.b64decode(v).decode() for k, v in body.get("data", {}).items()}
    mark = (body["metadata"].get("annotations") or {}).get(APPLIED_ANNOTATION)
    expected = fingerprint(body["metadata"]["uid"], data.get("username", ""), data.get("password", ""))
    return data if mark == expected else None


def pod_ip_of(kube: Kube, pod: str) -> str:
    return str(get_json(kube, "pod", pod, "-n", NS)["status"]["podIP"])


def on_primary(kube: Kube, query: str) -> str:
    """SQL as the superuser on the primary, over its Unix socket (the superuser has no network login)."""
    return superuser_sql(kube, NS, status(kube, NS, NAME)["currentPrimary"], query)


def role_has_password(kube: Kube, role: str, password: str) -> bool:
    """The role's stored SCRAM verifier was made from this password (recomputed with its salt)."""
    verifier = on_primary(kube, f"select rolpassword from pg_authid where rolname = '{role}'")  # noqa: S608
    iterations, salt = verifier.split("$")[1].split(":")
    recomputed = scram_sha256_verifier(password, salt=base64.b64decode(salt), iterations=int(iterations))
    return recomputed == verifier


def replicas_stream_after_reconnecting(kube: Kube) -> None:
    """End every walsender: each replica connects again with what it has now."""
    ended = on_primary(kube, "select now()")
    on_primary(kube, "select pg_terminate_backend(pid) from pg_stat_replication")
    streaming = ("select count(*) from pg_stat_replication where state = 'streaming'"  # noqa: S608 (the server's own now())
                 f" and backend_start > '{ended}'")  # fmt: skip
    wait_until("both replicas to stream again", lambda: on_primary(kube, streaming) == "2", 120, 1)


RELOADED = re.compile(r"the mounted Secrets changed \(([^)]*)\): Patroni reloads its configuration")


def pods_reloaded(kube: Kube, kind: str) -> bool:
    """Every instance logged that it re-read this mounted Secret and reloaded Patroni."""
    pods = [i["name"] for i in status(kube, NS, NAME)["instances"]]

    def reloaded(pod: str) -> bool:
        log = kube.kubectl("logs", pod, "-n", NS, "-c", "postgres").stdout
        return any(kind in m.group(1).split(", ") for m in RELOADED.finditer(log))

    return all(reloaded(pod) for pod in pods)


def test_each_deleted_secret_is_recreated_applied_and_nothing_is_locked_out(example: Kube) -> None:
    """The lockout the issue reported: a deleted Secret came back with a password no role had."""
    wait_serving(example, NS, NAME, 3, 120)
    for kind in CREDENTIALS:
        wait_until(f"{kind} applied once", lambda k=kind: applied_secret(example, k), 120, 1)  # fmt: skip
    passwords_before = {k: secret(example, NS, f"{NAME}-{k}")["password"] for k in CREDENTIALS}
    with (
        Writer(example, NS, NAME, "cred_fresh") as fresh,
        Writer(example, NS, NAME, "cred_pooled", persistent=True) as pooled,
    ):
        fresh.wait_for_writes(10, 60)
        pooled.wait_for_writes(10, 60)
        for kind in CREDENTIALS:
            example.kubectl("delete", "secret", f"{NAME}-{kind}", "-n", NS)
            new = wait_until(f"{NAME}-{kind} recreated and applied",
                             lambda k=kind: applied_secret(example, k), 120, 1)  # fmt: skip
            assert new["password"] != passwords_before[kind]
            if kind == "app":
                with connect_app(example, NS, NAME) as conn:  # the new Secret works at once
                    assert conn.execute("select current_user").fetchone() == (new["username"],)
            wait_until(f"every instance to reload {kind}", lambda k=kind: pods_reloaded(example, k), 120, 2)
            fresh.wait_for_writes(5, 60)
            pooled.wait_for_writes(5, 60)
        su = secret(example, NS, f"{NAME}-superuser")["password"]
        assert role_has_password(example, "postgres", su)
        assert not role_has_password(example, "postgres", passwords_before["superuser"])
        replicas_stream_after_reconnecting(example)
        # The Patroni API password is the operator's own: a switchover still goes through.
        old_primary = status(example, NS, NAME)["currentPrimary"]
        example.kubectl("annotate", "pgc", NAME, "-n", NS, f"{SWITCHOVER}=auto", "--overwrite")
        wait_until("the switchover", lambda: (st := healthy(example, NS, NAME, 3))
                   and st["currentPrimary"] != old_primary, 180, 1)  # fmt: skip
        fresh.wait_for_writes(10, 120)
        pooled.wait_for_writes(10, 120)
    print(json.dumps({"measure": "credential_secrets_deleted",
                      "fresh_outage_s": round(fresh.longest_outage, 2),
                      "pooled_outage_s": round(pooled.longest_outage, 2), "fresh_acked": len(fresh.acked),
                      "pooled_acked": len(pooled.acked), "fresh_password_refusals": fresh.password_refusals}),
          flush=True)  # fmt: skip
    assert fresh.missing() == [] and pooled.missing() == [], "acknowledged writes were lost"
    messages = [e.get("message", "") for e in get_json(example, "events", "-n", NS)["items"]
                if e.get("reason") == "CredentialApplied"]  # fmt: skip
    for kind in CREDENTIALS:
        assert any(f"Secret {NAME}-{kind}" in m for m in messages), (kind, messages)
    every_password = {*passwords_before.values(), *(secret(example, NS, f"{NAME}-{k}")["password"]
                                                    for k in CREDENTIALS)}  # fmt: skip
    assert not any(p in m for p in every_password for m in messages)
    assert (condition(example, "Degraded") or {}).get("status") != "True"


def test_an_edited_password_is_applied_and_the_uris_follow(example: Kube, tmp_path: Path) -> None:
    wait_serving(example, NS, NAME, 3, 120)
    chosen = "rotated-" + uuid.uuid4().hex
    patch = {"stringData": {"password": chosen}}
    example.kubectl("patch", "secret", f"{NAME}-app", "-n", NS, "--type=merge", "-p", json.dumps(patch))
    app = wait_until("the edited password applied", lambda: applied_secret(example, "app"), 60, 1)
    assert app["password"] == chosen and chosen in app["uri"] and chosen in app["pgpass"]
    ca = tmp_path / "ca.crt"
    ca.write_text(app["ca.crt"])
    with psycopg.connect(app["uri"], hostaddr=service_ip(example, NS, f"{NAME}-rw"), sslrootcert=str(ca),
                         connect_timeout=5) as conn:  # fmt: skip
        assert conn.execute("select current_user").fetchone() == (app["username"],)


def test_a_secret_naming_another_role_is_refused_with_a_condition(example: Kube) -> None:
    wait_serving(example, NS, NAME, 3, 120)
    app = secret(example, NS, f"{NAME}-app")
    patch = {"stringData": {"username": "mallory", "password": "never-applied"}}
    example.kubectl("patch", "secret", f"{NAME}-app", "-n", NS, "--type=merge", "-p", json.dumps(patch))

    def refused() -> dict[str, Any] | None:
        c = condition(example, "Degraded")
        return c if c and c.get("reason") == "CredentialRefused" else None

    degraded = wait_until("Degraded CredentialRefused", refused, 60, 1)
    assert f"Secret {NAME}-app: key username is 'mallory'" in degraded["message"]
    assert "never-applied" not in degraded["message"]
    warnings = [e for e in get_json(example, "events", "-n", NS)["items"]
                if e.get("reason") == "CredentialRefused"]  # fmt: skip
    assert warnings and warnings[-1]["type"] == "Warning"
    # Nothing was applied: the role keeps the password it had.
    ip = service_ip(example, NS, f"{NAME}-rw")
    with psycopg.connect(host=ip, port=5432, user=app["username"], password=app["password"],
                         dbname=app["dbname"], connect_timeout=5) as conn:  # fmt: skip
        assert conn.execute("select current_user").fetchone() == (app["username"],)
    put_back = {"stringData": {"username": app["username"], "password": app["password"]}}
    example.kubectl("patch", "secret", f"{NAME}-app", "-n", NS, "--type=merge", "-p", json.dumps(put_back))
    wait_until("no longer degraded", lambda: (condition(example, "Degraded") or {}).get("status") != "True",
               60, 1)  # fmt: skip


def test_a_cluster_recreated_over_its_volumes_takes_its_new_secrets(example: Kube) -> None:
    """Deleting the cluster keeps the volumes (the Secrets go with it): created again under the same
    name, it starts on the old data with new passwords, which must work."""
    wait_serving(example, NS, NAME, 3, 120)
    with connect_app(example, NS, NAME) as conn:
        conn.execute("create table if not exists kept (id int primary key)")
        conn.execute("insert into kept values (1) on conflict do nothing")
    old = {k: secret(example, NS, f"{NAME}-{k}")["password"] for k in CREDENTIALS}
    pvcs = sorted(p["metadata"]["name"] for p in get_json(example, "pvc", "-n", NS)["items"])
    example.kubectl("delete", "pgc", NAME, "-n", NS, "--wait=true", timeout=300)

    def gone() -> bool:
        secrets = [get_or_none(example, "secret", f"{NAME}-{k}", "-n", NS) for k in CREDENTIALS]
        return not get_json(example, "pods", "-n", NS)["items"] and not any(secrets)

    wait_until("the pods and Secrets to go", gone, 300, 2)
    assert sorted(p["metadata"]["name"] for p in get_json(example, "pvc", "-n", NS)["items"]) == pvcs
    example.kubectl("apply", "-f", str(REPO / "examples" / "orders-db.yaml"))
    wait_serving(example, NS, NAME, 3, 600)
    for kind in CREDENTIALS:
        new = wait_until(f"{kind} applied", lambda k=kind: applied_secret(example, k), 180, 1)  # fmt: skip
        assert new["password"] != old[kind]
    with connect_app(example, NS, NAME) as conn:
        assert conn.execute("select count(*) from kept").fetchone() == (1,)
    replicas_stream_after_reconnecting(example)


def condition(kube: Kube, type_: str) -> dict[str, Any] | None:
    for c in status(kube, NS, NAME).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None
