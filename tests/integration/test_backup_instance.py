"""The instance entrypoint archives and restores: real Patroni + PostgreSQL 16 processes started by
`python -m pg_operator.instance`, configured by what the operator's builders make of a PostgresCluster
with `spec.backup` (instance.yaml from specs.configmap, the environment from specs.statefulset with each
secretKeyRef resolved from a local stand-in of the Secret), against a real S3 server (moto, signed
requests) and the kwok profile's API server as Patroni's DCS.

Only the host-specific parts differ from a pod: ports, directories, and PGOP_BARMAN_BIN_DIR (the
barman-cloud venv of tests/harness/local_postgres.py instead of the image's /opt/pg-operator/bin).

Checked: WAL of the source arrives under <path>/<source>/wals/; a base backup; a second cluster with
`spec.bootstrap.recovery` to a point in time has exactly the rows before it, is on timeline 2, archives
under its own name, and its application owner has the new cluster's password (not the source's, which
the restored catalog carried); the source's objects are untouched; a replica of the restored cluster
streams from it with the restore_command of the cluster's own archive; no secret value in any log.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness import local_postgres
from harness.kube import apply_objects
from harness.local_cluster import Kube
from harness.net import free_ports
from harness.paths import REPO
from harness.patroni_instance import (
    RUNTIME,
    Instance,
    become_subreaper,
    instance_rbac,
    issued_tls,
    pod_object,
    reaping,
    service_account_kubeconfig,
    write_tls,
)
from harness.s3 import REGION, S3Server, s3_server
from harness.waiting import wait_until
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.instance_config import InstanceConfig
from pg_operator.backup.archive_gate import write_gate_script
from pg_operator.backup.barman import base_backup_argv
from pg_operator.backup.from_spec import archive_settings
from pg_operator.specs.configmap import instance_config
from pg_operator.specs.statefulset import statefulset
from pg_operator.specs.tls import KeyPair

pytestmark = pytest.mark.timeout(900)

BUCKET, PATH = "backups", "it"
USERS = {"superuser": "postgres", "replication": "replicator", "app": "app", "patroni-api": "patroni"}


class Clusters:
    """Everything of one test: the namespace, the S3 server, the instances started, the secret values."""

    def __init__(self, kube: Kube, work: Path, s3: S3Server, python: Path, pg_home: Path,
                 user: pwd.struct_passwd) -> None:  # fmt: skip
        self.kube, self.work, self.s3 = kube, work, s3
        self.python, self.pg_home, self.user = python, pg_home, user
        self.ns = f"bkinst-{uuid.uuid4().hex[:6]}"
        self.barman_bin = local_postgres.barman_venv()
        self.instances: list[Instance] = []
        self.clusters: list[PostgresCluster] = []
        # The Secrets the pods would reference: (secret name, key) → value.
        self.secret_data = {("s3", "ACCESS_KEY_ID"): s3.access_key_id,
                            ("s3", "ACCESS_SECRET_KEY"): s3.secret_access_key}  # fmt: skip
        self.passwords: dict[str, dict[str, str]] = {}
        self.tls: dict[str, tuple[KeyPair, KeyPair, KeyPair, KeyPair]] = {}  # per cluster: CAs and leaves

    def s3_spec(self) -> dict[str, Any]:
        return {"endpointURL": self.s3.endpoint, "bucket": BUCKET, "path": PATH, "region": REGION,
                "credentials": {"secretName": "s3"}}  # fmt: skip

    def secret_values(self) -> list[str]:
        values = [v for v in self.secret_data.values()]
        return values + [pw for by_role in self.passwords.values() for pw in by_role.values()]

    def start(self, name: str, member: str = "a", **spec: Any) -> Instance:
        cluster = PostgresCluster.from_obj({
            "metadata": {"name": name, "namespace": self.ns, "uid": uuid.uuid4().hex},
            "spec": {"replicas": 1, "version": "16", "storage": "1Gi",
                     "postgresql": {"parameters": {"shared_buffers": "32MB", "max_connections": "50"},
                                    "allowedCIDRs": ["127.0.0.1/32"]},
                     **spec},
        })  # fmt: skip
        self.clusters.append(cluster)
        pg_port, api_port = free_ports(2)
        pod = f"{name}-{member}"
        root = self.work / pod
        (root / "config").mkdir(parents=True)
        (root / "data").mkdir(mode=0o700)
        # instance.yaml exactly as the ConfigMap builder writes it, but for this host's ports.
        built = instance_config(cluster)
        settings = built.model_copy(update={
            "postgresql": built.postgresql.model_copy(update={"port": pg_port}),
            "patroni": built.patroni.model_copy(update={"port": api_port, "loop_wait": 2}),
        })  # fmt: skip
        text = settings.to_yaml()
        assert InstanceConfig.from_yaml(text) == settings
        (root / "config" / "instance.yaml").write_text(text)
        self.passwords.setdefault(name, {role: secrets.token_urlsafe(24) for role in USERS})
        if name not in self.tls:
            self.tls[name] = issued_tls(name, self.ns)
        write_tls(root / "tls", *self.tls[name])
        for role, username in USERS.items():
            (root / "secrets" / role).mkdir(parents=True)
            (root / "secrets" / role / "username").write_text(username)
            (root / "secrets" / role / "password").write_text(self.passwords[name][role])
        apply_objects(self.kube, *instance_rbac(self.ns, name), pod_object(self.ns, name, pod))
        kubeconfig = root / "kubeconfig"
        kubeconfig.write_text(json.dumps(service_account_kubeconfig(self.kube, self.ns, f"{name}-instance")))
        env = {
            **self.pod_env(cluster),
            # The pod's fieldRefs, and what differs on this host.
            "PGOP_NAMESPACE": self.ns, "PGOP_POD_NAME": pod, "PGOP_POD_IP": "127.0.0.1",
            "PGDATA": str(root / "data" / "pgdata"),
            "PATH": "/usr/bin:/bin", "HOME": str(root), "LANG": "C.UTF-8",
            "PYTHONPATH": str(REPO / "src"), "PYTHONDONTWRITEBYTECODE": "1",
            "LD_LIBRARY_PATH": str(self.pg_home / "lib"),
            "KUBECONFIG": str(kubeconfig), "PATRONI_KUBERNETES_CONTEXT": "instance",
            "PGOP_CONFIG_FILE": str(root / "config" / "instance.yaml"),
            "PGOP_SECRETS_DIR": str(root / "secrets"), "PGOP_RUN_DIR": str(root / "run"),
            "PGOP_TLS_DIR": str(root / "tls"),
            "PGOP_PG_BIN_DIR": str(self.pg_home / "bin"), "PGOP_LISTEN_HOST": "127.0.0.1",
            "PGOP_CONNECT_HOST": "localhost",
            "PGOP_METRICS_PORT": "0",  # two instances share the host's ports
            "PGOP_BARMAN_BIN_DIR": str(self.barman_bin),
        }  # fmt: skip
        if cluster.spec.backup is not None:
            # The operator's part (backup.archive_gate): each cluster here owns its prefix, so its gate
            # in the run directory is open.
            own = archive_settings(cluster.spec.backup, name, bin_dir=str(self.barman_bin)).store
            (root / "run").mkdir(exist_ok=True)
            subprocess.run(["sh", "-c", write_gate_script("archive", own, str(root / "run"))], check=True)
        argv = local_postgres.as_user(self.user, [str(self.python), "-m", "pg_operator.instance"])
        inst = Instance(pod, pg_port, api_port, root, env, argv)
        subprocess.run(["chown", "-R", f"{self.user.pw_uid}:{self.user.pw_gid}", str(root)], check=True)

        def running() -> bool:
            phase = self.kube.kubectl("get", "pod", pod, "-n", self.ns, "-o", "jsonpath={.status.phase}")
            return phase.stdout == "Running"

        wait_until(f"pod {pod} Running on the kwok node", running, 60)
        self.instances.append(inst)
        inst.start()
        return inst

    def pod_env(self, cluster: PostgresCluster) -> dict[str, str]:
        """The postgres container's env from the StatefulSet builder; secretKeyRefs resolved here, as the
        kubelet would (an optional one whose Secret is missing is left unset)."""
        (container,) = statefulset(cluster)["spec"]["template"]["spec"]["containers"]
        env: dict[str, str] = {}
        for item in container["env"]:
            if "value" in item:
                env[item["name"]] = item["value"]
                continue
            ref = item["valueFrom"].get("secretKeyRef")
            if ref is None:
                continue  # fieldRef: set by start()
            value = self.secret_data.get((ref["name"], ref["key"]))
            if value is None:
                assert ref.get("optional"), f"{item['name']}: Secret {ref['name']} key {ref['key']} missing"
                continue
            env[item["name"]] = value
        return env

    def wait_primary(self, inst: Instance, name: str, timeout: float) -> None:
        def primary() -> bool:
            if inst.proc is not None and inst.proc.poll() is not None:
                raise AssertionError(f"{inst.name} exited {inst.proc.returncode}:\n{inst.tail(80)}")
            with inst.connect("app", self.passwords[name]["app"], "app") as conn:
                return conn.execute("SELECT NOT pg_is_in_recovery()").fetchone() == (True,)

        wait_until(f"{inst.name} to be a writable primary the app owner can log in to", primary, timeout)

    def superuser(self, inst: Instance, name: str) -> psycopg.Connection[Any]:
        return inst.connect("postgres", self.passwords[name]["superuser"])

    def close(self) -> None:
        for inst in self.instances:
            inst.stop()


@pytest.fixture
def clusters(
    kube: Kube, postgresql_16: Path, patroni_python: Path, run_user: pwd.struct_passwd
) -> Iterator[Clusters]:
    become_subreaper()
    work = RUNTIME / f"backup-{uuid.uuid4().hex[:6]}"
    work.mkdir(parents=True)
    failed = True
    with contextlib.ExitStack() as stack:
        stack.enter_context(reaping())
        s3 = stack.enter_context(s3_server(work))
        s3.client().create_bucket(Bucket=BUCKET)
        c = Clusters(kube, work, s3, patroni_python, postgresql_16, run_user)
        kube.kubectl("create", "namespace", c.ns)
        try:
            yield c
            failed = False
        finally:
            c.close()
            if failed:
                for inst in c.instances:
                    print(inst.tail(60), file=sys.stderr)
            kube.kubectl("delete", "namespace", c.ns, "--wait=false", check=False)
    if failed and os.environ.get("PGOP_IT_KEEP") == "1":
        print(f"kept {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)


def archived(c: Clusters, inst: Instance, name: str, segment: str) -> bool:
    with c.superuser(inst, name) as conn:
        row = conn.execute("SELECT last_archived_wal FROM pg_stat_archiver").fetchone()
    return row is not None and row[0] is not None and row[0] >= segment


def test_archives_to_s3_and_a_new_cluster_restores_to_a_point_in_time(clusters: Clusters) -> None:
    c = clusters
    s3 = c.s3_spec()
    src = c.start("src", backup={"s3": s3, "archiveTimeout": "10s"})
    c.wait_primary(src, "src", timeout=180)

    # --- archiving settings from spec.backup reached PostgreSQL -----------------------------------------
    with c.superuser(src, "src") as conn:
        rows = conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('archive_mode', 'archive_timeout', 'archive_command', 'max_slot_wal_keep_size')"
        ).fetchall()
    settings = dict(rows)
    assert settings["archive_mode"] == "on" and settings["archive_timeout"] == "10"
    assert settings["max_slot_wal_keep_size"] == str(10 * 1024)  # MB
    assert f"{c.barman_bin}/barman-cloud-wal-archive" in settings["archive_command"]

    # --- data, a base backup, more data after the target --------------------------------------------
    app_src = c.passwords["src"]["app"]
    with src.connect("app", app_src, "app") as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, batch text)")
        conn.execute("INSERT INTO orders SELECT g, 'before-backup' FROM generate_series(1, 100) g")
    # The base backup as the Backup controller runs it in the primary's pod: over the Unix socket.
    (source,) = [k for k in c.clusters if k.name == "src"]
    assert source.spec.backup is not None
    store = archive_settings(source.spec.backup, "src", bin_dir=str(c.barman_bin)).store
    argv = base_backup_argv(
        store, name="it-base", host=str(src.root / "run"), port=src.pg_port, user="postgres"
    )
    backup = subprocess.run(local_postgres.as_user(c.user, argv), env={"PATH": "/usr/bin:/bin", **src.env},
                            capture_output=True, text=True, timeout=300, cwd="/")  # fmt: skip
    assert backup.returncode == 0, backup.stderr
    with src.connect("app", app_src, "app") as conn:
        conn.execute("INSERT INTO orders SELECT g, 'before-target' FROM generate_series(101, 150) g")
        (target,) = conn.execute(
            "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
        ).fetchone() or ("",)
        time.sleep(1.5)
        conn.execute("INSERT INTO orders SELECT g, 'after-target' FROM generate_series(151, 200) g")
    with c.superuser(src, "src") as conn:
        (segment,) = conn.execute("SELECT pg_walfile_name(pg_switch_wal())").fetchone() or ("",)
    switched = time.monotonic()
    wait_until(f"segment {segment} archived", lambda: archived(c, src, "src", segment), 120, interval=0.1)
    figures = {"segment_archived_s": round(time.monotonic() - switched, 2)}
    wals = c.s3.keys(BUCKET, f"{PATH}/src/wals/")
    assert any(k.endswith(segment + ".gz") for k in wals), wals
    assert c.s3.keys(BUCKET, f"{PATH}/src/base/"), "no base backup under the source's prefix"
    with c.superuser(src, "src") as conn:
        (failed,) = conn.execute("SELECT failed_count FROM pg_stat_archiver").fetchone() or (None,)
    assert failed == 0

    # Freeze the source (a clean stop archives the last segment), so its objects can be compared.
    src.stop()
    source_keys = c.s3.keys(BUCKET, f"{PATH}/src/")

    # --- the restored cluster ---------------------------------------------------------------------------
    c.secret_data[("s3-source", "ACCESS_KEY_ID")] = c.s3.access_key_id
    c.secret_data[("s3-source", "ACCESS_SECRET_KEY")] = c.s3.secret_access_key
    source_s3 = {**s3, "credentials": {"secretName": "s3-source"}}
    recovery = {"source": {"clusterName": "src", "s3": source_s3}, "targetTime": target}
    started = time.monotonic()
    dst = c.start("dst", backup={"s3": s3, "archiveTimeout": "10s"}, bootstrap={"recovery": recovery})
    c.wait_primary(dst, "dst", timeout=420)
    figures["restore_to_writable_s"] = round(time.monotonic() - started, 1)
    with dst.connect("app", c.passwords["dst"]["app"], "app") as conn:
        batches = dict(conn.execute("SELECT batch, count(*) FROM orders GROUP BY batch").fetchall())
        (wal_file,) = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone() or ("",)
    assert batches == {"before-backup": 100, "before-target": 50}, batches
    assert wal_file.startswith("00000002"), wal_file  # promoted onto a new timeline
    # The restored catalog carried the source's password for the owner; post-bootstrap replaced it.
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        dst.connect("app", app_src, "app").close()
    # The new cluster archives under its own name, starting with its new timeline's history.
    wait_until("the restored cluster's own WAL in the bucket",
               lambda: any(k.endswith("00000002.history.gz") for k in c.s3.keys(BUCKET, f"{PATH}/dst/wals/")),
               120)  # fmt: skip
    assert c.s3.keys(BUCKET, f"{PATH}/src/") == source_keys

    # --- a replica of the restored cluster: base backup from its primary, WAL from its own archive -------
    started = time.monotonic()
    replica = c.start("dst", member="b", backup={"s3": s3, "archiveTimeout": "10s"},
                      bootstrap={"recovery": recovery})  # fmt: skip
    with dst.connect("app", c.passwords["dst"]["app"], "app") as conn:
        conn.execute("INSERT INTO orders SELECT g, 'after-restore' FROM generate_series(1001, 1010) g")

    def replicated() -> bool:
        with replica.connect("app", c.passwords["dst"]["app"], "app") as conn:
            in_recovery = conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
            rows = conn.execute("SELECT count(*) FROM orders WHERE batch = 'after-restore'").fetchone()
        return in_recovery and rows == (10,)

    wait_until("the restored cluster's replica to have the new rows", replicated, 240)
    figures["replica_streaming_s"] = round(time.monotonic() - started, 1)
    with c.superuser(replica, "dst") as conn:
        row = conn.execute("SELECT setting FROM pg_settings WHERE name = 'restore_command'").fetchone()
    restore = row[0] if row else ""
    # The replica fetches from the cluster's own archive, not from the source's.
    assert restore.endswith(f"s3://{BUCKET}/{PATH} dst %f %p") and "PGOP_SOURCE_" not in restore, restore
    post_bootstrap = "\n".join(log.read_text(errors="replace") for log in dst.logs)
    assert "set the password of role app" in post_bootstrap and "kept database app" in post_bootstrap
    for inst in c.instances:
        for log in inst.logs:
            text = log.read_text(errors="replace")
            assert not [v for v in c.secret_values() if v in text], f"a secret value in {log}"
    # Figures for docs/backups.md (timing goals belong there, not in assertions).
    line = json.dumps({"test": "backup_instance", "load": round(os.getloadavg()[0], 1), **figures})
    print(line)
    with (RUNTIME / "backup-results.jsonl").open("a") as f:
        f.write(line + "\n")
