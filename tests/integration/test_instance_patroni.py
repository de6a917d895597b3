"""Two real Patroni + PostgreSQL 16 processes, configured by the instance entrypoint, with the kwok
profile's real API server as Patroni's Kubernetes DCS.

The two Pod objects sit on a fake node (Running, no process); the processes run on this host as those
pods (loopback addresses, distinct ports and directories), as an unprivileged user, with a ServiceAccount
token bound to the Role of the pod contract. Checked: leader election and role labels, streaming
replication, the application role (scram) and database, replication of data, rotated replication and REST
API passwords taken without a restart, failover after SIGKILL of
the leader's Patroni and PostgreSQL (time measured and printed as a JSON line), and the old leader's
return as a replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from psycopg import sql

from harness.kube import apply_objects
from harness.local_cluster import Kube
from harness.net import free_ports
from harness.paths import REPO
from harness.patroni_instance import (
    LOOP_WAIT,
    RETRY_TIMEOUT,
    RUNTIME,
    TTL,
    Instance,
    become_subreaper,
    instance_rbac,
    issued_tls,
    patroni_endpoint,
    pod_object,
    reaping,
    role_labels,
    service_account_kubeconfig,
    write_tls,
)
from harness.waiting import wait_until
from pg_operator.api.instance_config import InstanceConfig
from pg_operator.controller.reconcilers.patroni_upkeep import WAKE_PATCH
from pg_operator.patroni.client import (
    Endpoint,
    PatroniAuth,
    PatroniError,
    get_cluster,
    patch_config,
    switchover,
)
from pg_operator.scram import scram_sha256_verifier


@dataclass
class Pair:
    ns: str
    cluster: str
    passwords: dict[str, str] = field(repr=False)
    instances: list[Instance]
    failed: bool = True  # until the test says otherwise: keeps logs and the work directory


@pytest.fixture
def patroni_pair(
    kube: Kube, postgresql_16: Path, patroni_python: Path, run_user: pwd.struct_passwd
) -> Iterator[Pair]:
    become_subreaper()
    cleanup = contextlib.ExitStack()
    cleanup.enter_context(reaping())
    suffix = uuid.uuid4().hex[:6]
    ns, cluster = f"inst-{suffix}", "pgit"
    kube.kubectl("create", "namespace", ns)
    work = RUNTIME / f"run-{ns}"
    instances: list[Instance] = []
    roles = ("superuser", "replication", "app", "patroni-api")
    passwords = {role: secrets.token_urlsafe(32) for role in roles}
    users = {"superuser": "postgres", "replication": "replicator", "app": "app", "patroni-api": "patroni"}
    pair = Pair(ns, cluster, passwords, instances)
    try:
        apply_objects(kube, *instance_rbac(ns, cluster))
        # Not <cluster>-0/-1: the operator benchmark's stand-in for Patroni labels unlabelled pods of any
        # namespace by ordinal, which would fight Patroni's labels here when both run at once.
        apply_objects(kube, *(pod_object(ns, cluster, f"{cluster}-{i}") for i in "ab"))
        kubeconfig = work / "kubeconfig"
        work.mkdir(parents=True)
        kubeconfig.write_text(json.dumps(service_account_kubeconfig(kube, ns, f"{cluster}-instance")))
        ca, server, replication, replication_ca = issued_tls(cluster, ns)
        (work / "ca.crt").write_bytes(ca.cert_pem)
        ports = free_ports(4)
        for i, (pg_port, api_port) in zip("ab", zip(ports[::2], ports[1::2], strict=True), strict=True):
            name = f"{cluster}-{i}"
            root = work / name
            (root / "config").mkdir(parents=True)
            (root / "data").mkdir(mode=0o700)
            settings = InstanceConfig.model_validate(
                {
                    "cluster": cluster,
                    "namespace": ns,
                    "pgMajor": "16",
                    "postgresql": {
                        "port": pg_port,
                        "parameters": {"shared_buffers": "32MB", "max_connections": "50"},
                        "allowedCIDRs": ["127.0.0.1/32"],
                    },
                    "bootstrap": {"database": "app", "owner": "app"},
                    "synchronous": {"number": 1, "dataDurability": "preferred"},
                    "patroni": {
                        "ttl": TTL,
                        "loopWait": LOOP_WAIT,
                        "retryTimeout": RETRY_TIMEOUT,
                        "port": api_port,
                    },
                }
            )
            (root / "config" / "instance.yaml").write_text(settings.to_yaml())
            write_tls(root / "tls", ca, server, replication, replication_ca)
            for role, username in users.items():
                (root / "secrets" / role).mkdir(parents=True)
                (root / "secrets" / role / "username").write_text(username)
                (root / "secrets" / role / "password").write_text(passwords[role])
            env = {
                "PATH": "/usr/bin:/bin",
                "HOME": str(root),
                "LANG": "C.UTF-8",
                "PYTHONPATH": str(REPO / "src"),
                "PYTHONDONTWRITEBYTECODE": "1",
                # The bundle's extensions must load its own libpq (the host has libpq 15).
                "LD_LIBRARY_PATH": str(postgresql_16 / "lib"),
                "KUBECONFIG": str(kubeconfig),
                "PATRONI_KUBERNETES_CONTEXT": "instance",
                "PGOP_CLUSTER_NAME": cluster,
                "PGOP_NAMESPACE": ns,
                "PGOP_POD_NAME": name,
                "PGOP_POD_IP": "127.0.0.1",
                "PGOP_PG_MAJOR": "16",
                "PGDATA": str(root / "data" / "pgdata"),
                "PGOP_CONFIG_FILE": str(root / "config" / "instance.yaml"),
                "PGOP_SECRETS_DIR": str(root / "secrets"),
                "PGOP_TLS_DIR": str(root / "tls"),
                "PGOP_RUN_DIR": str(root / "run"),
                "PGOP_PG_BIN_DIR": str(postgresql_16 / "bin"),
                "PGOP_LISTEN_HOST": "127.0.0.1",
                "PGOP_CONNECT_HOST": "localhost",
                "PGOP_METRICS_PORT": "0",  # two instances share the host's ports
                # PATRONI_LOG_LEVEL=DEBUG in the test's environment helps when a step times out.
                **{k: v for k, v in os.environ.items() if k == "PATRONI_LOG_LEVEL"},
            }
            argv = [
                "setpriv", f"--reuid={run_user.pw_uid}", f"--regid={run_user.pw_gid}", "--clear-groups", "--",
                str(patroni_python), "-m", "pg_operator.instance",
            ]  # fmt: skip
            instances.append(Instance(name, pg_port, api_port, root, env, argv))
        subprocess.run(["chown", "-R", f"{run_user.pw_uid}:{run_user.pw_gid}", str(work)], check=True)
        wait_until(
            "both pods Running on the kwok node",
            lambda: (
                kube.kubectl(
                    "get", "pods", "-n", ns, "-o", "jsonpath={.items[*].status.phase}"
                ).stdout.split()
                == ["Running", "Running"]
            ),
            timeout=60,
        )
        work.chmod(0o700)
        yield pair
    finally:
        for inst in instances:
            inst.stop()
        time.sleep(0.5)
        cleanup.close()
        if pair.failed:
            for inst in instances:
                print(inst.tail(), file=sys.stderr)
        if not (pair.failed and os.environ.get("PGOP_IT_KEEP") == "1"):
            kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        if not pair.failed:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work} for inspection", file=sys.stderr)


def test_patroni_pair_elects_replicates_and_fails_over(kube: Kube, patroni_pair: Pair) -> None:
    ns, cluster, instances = patroni_pair.ns, patroni_pair.cluster, patroni_pair.instances
    su, app = patroni_pair.passwords["superuser"], patroni_pair.passwords["app"]
    api = PatroniAuth("patroni", patroni_pair.passwords["patroni-api"])
    check_pair(kube, ns, cluster, instances, su, app, api)
    patroni_pair.failed = False


def write_on(inst: Instance, app: str, row: int) -> Callable[[], float]:
    def write() -> float:
        with inst.connect("app", app, "app") as conn:
            conn.execute("INSERT INTO orders VALUES (%s, 'planned') ON CONFLICT DO NOTHING", (row,))
        return time.monotonic()

    return write


async def planned_switchover(primary: Instance, candidate: Instance, api: PatroniAuth) -> None:
    ca_pem = (primary.root / "tls" / "ca.crt").read_bytes()
    leader = patroni_endpoint(primary.api_port, ca_pem)
    async with aiohttp.ClientSession() as session:
        view = await get_cluster(session, patroni_endpoint(candidate.api_port, ca_pem))
        assert {m["name"] for m in view["members"]} == {primary.name, candidate.name}
        # HTTPS, verified: another CA's trust, or a name the certificate does not carry, gets nowhere.
        stranger = issued_tls("stranger", "elsewhere")[0]
        with pytest.raises(PatroniError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            await get_cluster(session, patroni_endpoint(candidate.api_port, stranger.cert_pem))
        misnamed = Endpoint("127.0.0.1", leader.tls, "db-9.elsewhere.svc", primary.api_port)
        with pytest.raises(PatroniError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed|match"):
            await get_cluster(session, misnamed)
        with pytest.raises(PatroniError, match="HTTP 401"):
            wrong = PatroniAuth(api.username, "wrong")
            await switchover(session, leader, primary.name, candidate.name, wrong)
        with pytest.raises(PatroniError, match="HTTP 401"):
            await switchover(session, leader, primary.name, candidate.name, None)
        await switchover(session, leader, primary.name, candidate.name, api)


def post_reload(inst: Instance, auth: PatroniAuth) -> int:
    """POST /reload (an authenticated endpoint that changes nothing): Patroni's word on the credentials."""

    async def post() -> int:
        async with aiohttp.ClientSession() as session:
            member = patroni_endpoint(inst.api_port, (inst.root / "tls" / "ca.crt").read_bytes())
            basic = aiohttp.BasicAuth(auth.username, auth.password)
            async with session.post(member.url("/reload"), auth=basic, **member.options()) as resp:
                return resp.status

    return asyncio.run(post())


def rotate_credentials(leader: Instance, replica: Instance, su: str, api: PatroniAuth) -> PatroniAuth:
    """What the operator and the kubelet do when the replication and Patroni API Secrets change: the role
    gets the new password (as a verifier), the mounted files change; the running Patroni pick them up.
    Returns the new API credentials."""
    repl_password, new_api = secrets.token_urlsafe(32), PatroniAuth(api.username, secrets.token_urlsafe(32))
    started = {}
    for inst in (leader, replica):
        with inst.connect("postgres", su) as conn:
            started[inst.name] = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    with leader.connect("postgres", su) as conn:
        conn.execute(
            sql.SQL("ALTER ROLE replicator PASSWORD {}").format(
                sql.Literal(scram_sha256_verifier(repl_password))
            )
        )
    for inst in (leader, replica):
        (inst.root / "secrets" / "replication" / "password").write_text(repl_password)
        (inst.root / "secrets" / "patroni-api" / "password").write_text(new_api.password)
    for inst in (leader, replica):
        wait_until(f"{inst.name} to reload", lambda i=inst: "Patroni reloads its configuration" in
                   i.logs[-1].read_text(errors="replace"), timeout=30)  # fmt: skip
        wait_until(f"{inst.name}'s REST API to take the new password",
                   lambda i=inst: post_reload(i, new_api) == 202, timeout=30)  # fmt: skip
        assert post_reload(inst, api) == 401
    # The replica reconnects (its walsender ended; its client certificate, not the password, logs it in),
    # and is the synchronous standby again before the failover below.
    with leader.connect("postgres", su) as conn:
        ended = conn.execute("SELECT now()").fetchone()
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_replication")

    def streams_again() -> bool:
        with leader.connect("postgres", su) as conn:
            return conn.execute("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
                                " AND sync_state IN ('sync', 'quorum') AND application_name = %s"
                                " AND backend_start > %s",
                                (replica.name, ended[0] if ended else None)).fetchone() == (1,)  # fmt: skip

    wait_until("the replica to stream again after the rotation", streams_again, timeout=60)
    for inst in (leader, replica):
        with inst.connect("postgres", su) as conn:
            assert conn.execute("SELECT pg_postmaster_start_time()").fetchone() == started[inst.name]
    return new_api


def check_pair(
    kube: Kube, ns: str, cluster: str, instances: list[Instance], su: str, app: str, api: PatroniAuth
) -> None:
    by_name = {i.name: i for i in instances}
    for inst in instances:
        inst.start()

    # --- election and role labels ----------------------------------------------------------------------
    # The leader lock (<scope>-leader) decides; the role labels must follow it.
    def lock_holder() -> str:
        res = kube.kubectl("get", "configmap", f"{cluster}-leader", "-n", ns, "-o", "json", check=False)
        return (
            json.loads(res.stdout)["metadata"]["annotations"].get("leader", "") if res.returncode == 0 else ""
        )

    def labelled_after_lock() -> str:
        holder, labels = lock_holder(), role_labels(kube, ns, cluster)
        others = [r for n, r in labels.items() if n != holder]
        return holder if holder and labels.get(holder) == "primary" and others == ["replica"] else ""

    holder = wait_until(
        "a leader labelled role=primary, the other pod role=replica", labelled_after_lock, 180
    )
    leader = by_name[holder]
    (replica,) = [i for i in instances if i.name != holder]
    assert kube.kubectl("get", "endpoints", "-n", ns, "-o", "name").stdout.strip() == ""  # ConfigMaps mode

    # --- the replica streams from the leader (and is a synchronous standby: quorum commit) -------------
    def streaming() -> list[tuple[Any, ...]]:
        with leader.connect("postgres", su) as conn:
            return conn.execute(
                "SELECT application_name, state, sync_state FROM pg_stat_replication"
                " WHERE state = 'streaming' AND application_name = %s",
                (replica.name,),
            ).fetchall()

    wait_until("the replica to stream", streaming, timeout=120)
    wait_until("the replica to become a quorum standby", lambda: streaming()[0][2] == "quorum", timeout=60)

    # Patroni lets only the members named in <scope>-sync (the quorum's voters) take over from a
    # synchronous primary.
    def sync_key_names(name: str) -> bool:
        res = kube.kubectl(
            "get", "configmap", f"{cluster}-sync", "-n", ns, "-o", "jsonpath={.metadata.annotations}"
        )
        return json.loads(res.stdout or "{}").get("sync_standby") == name

    wait_until(f"{cluster}-sync to name the replica", lambda: sync_key_names(replica.name), timeout=30)

    # --- what initdb and the entrypoint set up ----------------------------------------------------------
    with leader.connect("postgres", su) as conn:
        assert conn.execute("SHOW data_checksums").fetchone() == ("on",)
        assert conn.execute("SHOW password_encryption").fetchone() == ("scram-sha-256",)
        methods = {r[0] for r in conn.execute("SELECT auth_method FROM pg_hba_file_rules").fetchall()}
        assert methods == {"peer", "cert", "scram-sha-256", "reject"}
        rules = conn.execute("SELECT type, address FROM pg_hba_file_rules").fetchall()
        addresses = {address for type_, address in rules if type_ == "hostssl"}
        # "all" for the replication role's certificate (and the superuser's refusal), loopback for the
        # superuser, the configured network for everyone else.
        assert addresses == {"all", "127.0.0.1", "::1"}, addresses
        assert {type_ for type_, _ in rules} == {"local", "hostssl", "hostnossl"}
        assert conn.execute("SHOW ssl").fetchone() == ("on",)
        # Replication runs over TLS, authenticated by the replication role's client certificate.
        assert conn.execute("SELECT bool_and(ssl), min(client_dn) FROM pg_stat_ssl JOIN pg_stat_replication"
                            " USING (pid)").fetchone() == (True, "/CN=replicator")  # fmt: skip
    # The replication password alone, or a certificate another CA issued for the same role, is refused.
    stranger_ca, _, stranger_client, _ = issued_tls("stranger", "elsewhere")
    stranger = leader.root.parent / "stranger"
    stranger.mkdir(exist_ok=True)
    (stranger / "client.crt").write_bytes(stranger_client.cert_pem)
    (stranger / "client.key").write_bytes(stranger_client.key_pem)
    (stranger / "client.key").chmod(0o600)
    replication_password = (leader.root / "secrets" / "replication" / "password").read_text()
    ca_file = leader.root.parent / "ca.crt"
    for client in ("", f" sslcert={stranger / 'client.crt'} sslkey={stranger / 'client.key'}"):
        with pytest.raises(psycopg.OperationalError, match=r"certificate|authentication failed|alert"):
            psycopg.connect(
                f"host=localhost port={leader.pg_port} user=replicator dbname=postgres "
                f"sslmode=verify-full sslrootcert={ca_file} replication=database "
                f"connect_timeout=5{client}",
                password=replication_password,
            ).close()
    assert stranger_ca.cert_pem != (leader.root.parent / "ca.crt").read_bytes()

    # --- TLS only: the server's name checked against the cluster's CA; no TLS, no connection ------------
    with psycopg.connect(
        host="127.0.0.1",
        port=leader.pg_port,
        user="app",
        password=app,
        dbname="app",
        sslmode="verify-full",
        sslrootcert=str(leader.root.parent / "ca.crt"),
    ) as conn:
        assert conn.execute("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                            ).fetchone()[0] is True  # fmt: skip
    with pytest.raises(psycopg.OperationalError, match="rejects connection"):
        psycopg.connect(
            host="127.0.0.1", port=leader.pg_port, user="app", password=app, dbname="app", sslmode="disable"
        ).close()
    with leader.connect("postgres", su) as conn:
        verifier = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = 'app'").fetchone()
        assert verifier is not None and verifier[0].startswith("SCRAM-SHA-256$4096:")
        owner = conn.execute(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'app'"
        ).fetchone()
        assert owner == ("app",)

    # --- the application role logs in with its password (scram) and writes ----------------------------
    with leader.connect("app", app, "app") as conn:
        assert conn.execute("SELECT current_user, current_database()").fetchone() == ("app", "app")
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO orders VALUES (1, 'before failover')")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        leader.connect("app", "not-the-password", "app").close()

    def replica_has(id_: int) -> bool:
        with replica.connect("app", app, "app") as conn:
            return conn.execute("SELECT count(*) FROM orders WHERE id = %s", (id_,)).fetchone() == (1,)

    wait_until("row 1 on the replica", lambda: replica_has(1), timeout=30)

    # --- probes and metrics on the REST API -------------------------------------------------------------
    wait_until(
        "both instances ready", lambda: all(i.api("/readiness")[0] == 200 for i in instances), timeout=30
    )
    assert all(i.api("/liveness")[0] == 200 for i in instances)
    status, metrics = leader.api("/metrics")
    assert status == 200 and "patroni_primary" in metrics and "patroni_postgres_running" in metrics

    # --- rotated Secrets: each Patroni reloads them from its mount, nothing restarts ----------------------
    api = rotate_credentials(leader, replica, su, api)
    wait_until(f"{cluster}-sync to name the replica again", lambda: sync_key_names(replica.name), timeout=30)

    # --- the operator's wake-up after a promotion: Patroni accepts it and writes nothing ------------------
    def config_key() -> tuple[str, str]:
        res = kube.kubectl("get", "configmap", f"{cluster}-config", "-n", ns, "-o", "json")
        meta = json.loads(res.stdout)["metadata"]
        return meta["resourceVersion"], meta["annotations"]["config"]

    async def wake(auth: PatroniAuth | None) -> None:
        async with aiohttp.ClientSession() as session:
            for inst in (leader, replica):
                member = patroni_endpoint(inst.api_port, (inst.root / "tls" / "ca.crt").read_bytes())
                await patch_config(session, member, WAKE_PATCH, auth)

    before = config_key()
    with pytest.raises(PatroniError, match="HTTP 401"):
        asyncio.run(wake(None))
    asyncio.run(wake(api))
    assert config_key() == before and "pg_operator_wake" not in before[1]

    # --- failover: SIGKILL the leader's Patroni and PostgreSQL ---------------------------------------------
    killed_at = time.monotonic()
    leader.kill()
    # Its primary gone, the replica no longer streams: it must stop counting as ready (well before the
    # lock expires and it is promoted).
    wait_until("the replica to report not ready", lambda: replica.api("/readiness")[0] == 503, 10, 0.1)
    promoted = wait_until(
        "the replica to be promoted",
        lambda: replica.api("/primary")[0] == 200 and time.monotonic(),
        timeout=TTL + 2 * LOOP_WAIT + 20,
        interval=0.1,
    )

    def write_after_failover() -> float:
        with replica.connect("app", app, "app") as conn:
            conn.execute("INSERT INTO orders VALUES (2, 'after failover') ON CONFLICT DO NOTHING")
        return time.monotonic()

    writable = wait_until("the new primary to accept writes", write_after_failover, timeout=30, interval=0.1)
    relabelled = wait_until(
        "the promoted pod labelled role=primary",
        lambda: role_labels(kube, ns, cluster)[replica.name] == "primary" and time.monotonic(),
        timeout=30,
        interval=0.1,
    )
    result = {
        "measure": "instance_failover_after_sigkill",
        "ttl": TTL,
        "loop_wait": LOOP_WAIT,
        "retry_timeout": RETRY_TIMEOUT,
        "promoted_s": round(promoted - killed_at, 2),
        "writable_s": round(writable - killed_at, 2),
        "role_label_s": round(relabelled - killed_at, 2),
    }
    print(json.dumps(result))
    with (RUNTIME / "failover-results.jsonl").open("a") as f:
        f.write(json.dumps({**result, "at": time.time()}) + "\n")

    # --- the old leader comes back as a replica of the new one ------------------------------------------
    leader.start()

    def old_leader_follows() -> bool:
        if role_labels(kube, ns, cluster)[leader.name] != "replica":
            return False
        with leader.connect("app", app, "app") as conn:
            return conn.execute("SELECT 1 FROM orders WHERE id = 2").fetchone() is not None

    wait_until("the old leader to rejoin as a replica with the new row", old_leader_follows, timeout=120)
    rewound = "pg_rewind exit code=0" in leader.logs[-1].read_text(errors="replace")
    with replica.connect("postgres", su) as conn:
        assert conn.execute("SELECT application_name FROM pg_stat_replication").fetchall() == [(leader.name,)]

    # --- a planned switchover through the operator's REST client: refused without the API credentials ----
    # With synchronous replication Patroni switches over only to the synchronous standby.
    wait_until(f"{cluster}-sync to name the old leader", lambda: sync_key_names(leader.name), timeout=60)
    wait_until("both instances ready", lambda: all(i.api("/readiness")[0] == 200 for i in instances), 60)
    switched_at = time.monotonic()
    asyncio.run(planned_switchover(replica, leader, api))
    wait_until("the candidate to hold the lock", lambda: lock_holder() == leader.name, 30)
    writable_again = wait_until("writes on the candidate", write_on(leader, app, 4), timeout=30, interval=0.1)
    downtime = round(writable_again - switched_at, 2)
    print(json.dumps({"measure": "instance_switchover", "writable_s": downtime}), flush=True)
    # From here on the roles are swapped: `replica` names the primary again, as the next step expects.
    leader, replica = replica, leader

    # --- a clean stop (what a pod deletion or rolling update does) hands over without waiting for ttl -----
    wait_until(f"{cluster}-sync to name {leader.name}", lambda: sync_key_names(leader.name), timeout=60)
    assert replica.proc is not None
    stopped_at = time.monotonic()
    os.killpg(replica.proc.pid, signal.SIGTERM)

    def write_on_old_leader() -> float:
        with leader.connect("app", app, "app") as conn:
            conn.execute("INSERT INTO orders VALUES (3, 'after clean stop') ON CONFLICT DO NOTHING")
        return time.monotonic()

    handed_over = wait_until(
        "the old leader to take over", write_on_old_leader, timeout=TTL + 30, interval=0.1
    )
    clean = {
        "measure": "instance_failover_after_sigterm",
        "ttl": TTL,
        "loop_wait": LOOP_WAIT,
        "writable_s": round(handed_over - stopped_at, 2),
        "old_leader_rejoined_with_pg_rewind": rewound,
    }
    print(json.dumps(clean))
    with (RUNTIME / "failover-results.jsonl").open("a") as f:
        f.write(json.dumps({**clean, "at": time.time()}) + "\n")
    assert lock_holder() == leader.name


def set_fenced(inst: Instance, fenced: list[str] | None) -> None:
    """What the operator's ConfigMap does to the mounted instance.yaml: the same settings, this list."""
    path = inst.root / "config" / "instance.yaml"
    settings = InstanceConfig.from_yaml(path.read_text()).model_copy(update={"fenced": fenced})
    path.write_text(settings.to_yaml())


def test_a_fenced_instance_keeps_running_without_postgresql_and_rejoins(
    kube: Kube, patroni_pair: Pair
) -> None:
    """Fencing in the entrypoint (instance/fencing.py): listed in instance.yaml, the replica's Patroni and
    PostgreSQL stop while the entrypoint lives on and answers the probes on Patroni's port (alive, not
    ready); its data directory is left alone; unlisted, Patroni starts again and the replica streams."""
    ns, cluster, instances = patroni_pair.ns, patroni_pair.cluster, patroni_pair.instances
    su = patroni_pair.passwords["superuser"]
    for inst in instances:
        inst.start()

    def leader_name() -> str:
        res = kube.kubectl("get", "configmap", f"{cluster}-leader", "-n", ns, "-o", "json", check=False)
        return (
            json.loads(res.stdout)["metadata"]["annotations"].get("leader", "") if res.returncode == 0 else ""
        )

    holder = wait_until("a leader", leader_name, 180)
    leader = next(i for i in instances if i.name == holder)
    replica = next(i for i in instances if i.name != holder)

    def streams() -> bool:
        with leader.connect("postgres", su) as conn:
            query = (
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND application_name = %s"
            )
            row = conn.execute(query, (replica.name,)).fetchone()
            return bool(row and row[0] == 1)

    wait_until("the replica to stream", streams, 120)
    set_fenced(replica, [replica.name])

    def fenced() -> bool:
        return (replica.postmaster_pid() is None and replica.api("/liveness")[0] == 200
                and replica.api("/readiness")[0] == 503)  # fmt: skip

    wait_until("the replica's PostgreSQL to stop behind the fence", fenced, 60, 1)
    assert (
        replica.proc is not None and replica.proc.poll() is None
    )  # the entrypoint, the pod's process, lives
    control = replica.pgdata / "global" / "pg_control"
    before = (
        control.stat().st_mtime_ns,
        control.read_bytes(),
        sorted(p.name for p in replica.pgdata.iterdir()),
    )
    with leader.connect("postgres", su) as conn:  # the leader goes on taking writes
        conn.execute("CREATE TABLE behind_the_fence AS SELECT generate_series(1, 1000) AS id")
    time.sleep(5)  # two of the entrypoint's looks at instance.yaml
    after = (
        control.stat().st_mtime_ns,
        control.read_bytes(),
        sorted(p.name for p in replica.pgdata.iterdir()),
    )
    assert after == before and replica.postmaster_pid() is None

    set_fenced(replica, None)
    wait_until("the unfenced replica to stream again", streams, 120, 1)
    wait_until("the unfenced replica to be ready", lambda: replica.api("/readiness")[0] == 200, 60, 1)
    with replica.connect("postgres", su) as conn:
        assert conn.execute("SELECT count(*) FROM behind_the_fence").fetchone() == (1000,)
    patroni_pair.failed = False
