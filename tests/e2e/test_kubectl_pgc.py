"""`kubectl pgc` against a real cluster (full profile): the plugin as installed with the package
(`kubectl-pgc`), with kubectl on PATH as when kubectl runs it. On the e2e tier's day-2 cluster (two
instances archiving to a store; the monitoring module shares it): status (text and JSON, exit codes),
certs, psql to the primary and to a replica over exec, logs merged by time, reload, a Backup taken and
waited for, a switchover to a named replica, a rolling restart, and errors scripts rely on (unknown
cluster, instance). Also the operator's first contact: `pg-operator run` with a Lease namespace that does
not exist stops at once with one line saying what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness.e2e_backup import DAY2_NAME, Day2, wait_condition
from harness.kube import get_json
from harness.local_cluster import Kube
from harness.net import free_port
from harness.pgcluster import status, wait_serving
from harness.waiting import wait_until

NAME = DAY2_NAME
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def ns(day2: Day2) -> str:
    return day2.namespace


@pytest.fixture(scope="module")
def db(operator: Kube, day2: Day2) -> str:
    wait_serving(operator, day2.namespace, day2.name, 2, 300)
    return day2.name


def pgc(
    kube: Kube, *args: str, input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The plugin as kubectl runs it: its own process, kubectl on PATH, flags passed through."""
    env = {**os.environ, "PATH": f"{kube.ctx.bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("KUBECONFIG", None)
    return subprocess.run(
        [str(BIN / "kubectl-pgc"), "--kubeconfig", kube.kubeconfig, *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def sql(kube: Kube, ns: str, *args: str, query: str) -> str:
    res = pgc(kube, "-n", ns, "psql", NAME, *args, "--", "-AtX", input=query)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_status_one_screen_and_json_agree_with_the_operator(operator: Kube, ns: str, db: str) -> None:
    st = status(operator, ns, db)
    text = pgc(operator, "status", db, "-n", ns)
    assert text.returncode == 0, text.stderr
    print(text.stdout)
    assert st["currentPrimary"] in text.stdout and "INSTANCE" in text.stdout and "Ready" in text.stdout
    assert "replica" in text.stdout and "Archiving" in text.stdout
    as_json = pgc(operator, "-n", ns, "status", db, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    summary = json.loads(as_json.stdout)
    assert summary["primary"] == st["currentPrimary"] and summary["ready"] is True
    assert sorted(i["role"] for i in summary["instances"]) == ["primary", "replica"]
    assert all(i["timeline"] for i in summary["instances"]), summary["instances"]
    assert {c["type"] for c in summary["conditions"]} >= {"Ready", "ContinuousArchiving"}


def test_unknown_names_exit_3_naming_what_exists(operator: Kube, ns: str, db: str) -> None:
    missing = pgc(operator, "-n", ns, "status", "no-such-db")
    assert missing.returncode == 3, missing
    assert "no-such-db" in missing.stderr and ns in missing.stderr and db in missing.stderr
    bad_target = pgc(operator, "-n", ns, "switchover", db, "--to", f"{db}-9")
    assert bad_target.returncode == 3 and f"{db}-0" in bad_target.stderr, bad_target
    assert pgc(operator, "status").returncode == 2  # no cluster named: argparse's usage error


def test_certs_lists_the_ca_and_server_certificate(operator: Kube, ns: str, db: str) -> None:
    res = pgc(operator, "-n", ns, "certs", db, "-o", "json")
    assert res.returncode == 0, res.stderr
    certs = json.loads(res.stdout)["certificates"]
    keys = {(c["secret"], c["key"]) for c in certs}
    assert {(f"{db}-ca", "ca.crt"), (f"{db}-server-tls", "tls.crt")} <= keys, keys
    assert all(c["secondsLeft"] > 86400 for c in certs), certs


def test_psql_reaches_the_primary_and_a_replica_without_a_password(operator: Kube, ns: str, db: str) -> None:
    assert sql(operator, ns, query="select pg_is_in_recovery()") == "f"
    assert sql(operator, ns, "--replica", query="select pg_is_in_recovery()") == "t"
    replica = next(i["name"] for i in status(operator, ns, db)["instances"] if i["role"] == "replica")
    assert sql(operator, ns, "--instance", replica, query="select 1") == "1"


def test_logs_of_every_instance_merged_by_time(operator: Kube, ns: str, db: str) -> None:
    res = pgc(operator, "-n", ns, "logs", db, "--tail", "30", "--timestamps")
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stdout.splitlines() if line.strip()]
    pods = {line.split()[1] for line in lines}
    assert pods == {f"{db}-0", f"{db}-1"}, pods
    stamps = [line.split()[0] for line in lines]
    assert stamps == sorted(stamps, key=lambda s: (s[:19], s[20:-1].ljust(9, "0"))), "not merged by time"


def test_logs_follow_streams_every_instance(operator: Kube, ns: str, db: str) -> None:
    env = {**os.environ, "PATH": f"{operator.ctx.bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    argv = [
        str(BIN / "kubectl-pgc"),
        "--kubeconfig",
        operator.kubeconfig,
        "-n",
        ns,
        "logs",
        db,
        "-f",
        "--tail",
        "1",
    ]
    seen: set[str] = set()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as follow:
        try:
            deadline = time.monotonic() + 30
            assert follow.stdout is not None
            while seen != {f"{db}-0", f"{db}-1"} and time.monotonic() < deadline:
                line = follow.stdout.readline()
                if line:
                    seen.add(line.split()[0])
            assert follow.poll() is None, "follow stopped on its own"
        finally:
            follow.terminate()
    assert seen == {f"{db}-0", f"{db}-1"}, seen


def test_reload_every_instance(operator: Kube, ns: str, db: str) -> None:
    res = pgc(operator, "-n", ns, "reload", db)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("configuration reloaded") == 2, res.stdout


def test_backup_is_created_and_waited_for(operator: Kube, ns: str, db: str) -> None:
    wait_condition(operator, ns, db, "ContinuousArchiving", "True", "Archiving", 240)
    res = pgc(
        operator, "-n", ns, "backup", db, "--name", "pgc-now", "--wait", "--timeout", "10m", timeout=660
    )
    assert res.returncode == 0, (res.stdout, res.stderr)
    done = get_json(operator, "backups.db.example.com", "pgc-now", "-n", ns)
    assert done["spec"]["cluster"] == db and done["status"]["phase"] == "Completed", done["status"]


def test_switchover_to_a_named_replica(operator: Kube, ns: str, db: str) -> None:
    before = status(operator, ns, db)["currentPrimary"]
    target = next(i["name"] for i in status(operator, ns, db)["instances"] if i["name"] != before)
    started = time.monotonic()
    res = pgc(
        operator, "-n", ns, "switchover", db, "--to", target, "--wait", "--timeout", "180s", timeout=240
    )
    assert res.returncode == 0, (res.stdout, res.stderr)
    print(f"switchover answered in {time.monotonic() - started:.1f}s")
    assert status(operator, ns, db)["currentPrimary"] == target
    annotations = get_json(operator, "pgc", db, "-n", ns)["metadata"].get("annotations") or {}
    assert "db.example.com/switchover-to" not in annotations
    wait_serving(operator, ns, db, 2, 180)


def test_rolling_restart_restarts_every_instance(operator: Kube, ns: str, db: str) -> None:
    wait_serving(operator, ns, db, 2, 180)
    query = "select pg_postmaster_start_time()"
    pods = [f"{db}-0", f"{db}-1"]
    before = {pod: sql(operator, ns, "--instance", pod, query=query) for pod in pods}
    started = time.monotonic()
    res = pgc(operator, "-n", ns, "restart", db, "--wait", "--timeout", "10m", timeout=660)
    assert res.returncode == 0, (res.stdout, res.stderr)
    print(f"rolling restart of 2 instances answered in {time.monotonic() - started:.1f}s")
    after = wait_until(
        "both instances to answer again",
        lambda: {pod: sql(operator, ns, "--instance", pod, query=query) for pod in pods},
        120,
        2,
    )
    assert all(after[pod] != before[pod] for pod in pods), (before, after)
    annotations = get_json(operator, "pgc", db, "-n", ns)["metadata"].get("annotations") or {}
    assert "db.example.com/restart-requested" not in annotations


def test_first_contact_without_the_lease_namespace_stops_with_what_to_do(operator: Kube) -> None:
    missing = f"pgc-missing-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "KUBECONFIG": operator.kubeconfig}
    started = time.monotonic()
    argv = [
        str(BIN / "pg-operator"),
        "run",
        "--lease-namespace",
        missing,
        "--identity",
        "pgc-e2e",
        "--health-port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
    ]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 2, res
    assert time.monotonic() - started < 30
    assert f'namespace "{missing}" for the leader Lease does not exist' in res.stderr, res.stderr
    assert f"kubectl create namespace {missing}" in res.stderr and "--lease-namespace" in res.stderr
    assert "leader election attempt failed" not in res.stderr, res.stderr
