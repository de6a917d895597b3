"""Declared roles and databases on the shared example cluster (orders-db in shop): an application connects
with each generated role Secret (verify-full through -rw), a database gets an extension and a schema owned
by a declared role, a role altered and one dropped by hand are put back, a password the user manages in
their own Secret is rotated there and applied, and removal retains or drops as the policy says. What the
module adds is removed at its end; the cluster keeps serving."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness.audit import Audit
from harness.deployed_operator import EXAMPLE, EXAMPLE_NAMESPACE, OPERATOR_NAMESPACE, RELEASE
from harness.e2e_backup import superuser_sql
from harness.kube import get_json, get_or_none
from harness.local_cluster import Kube
from harness.pgcluster import secret, service_ip, status, wait_serving
from harness.waiting import wait_until

pytestmark = pytest.mark.e2e

NS, NAME = EXAMPLE_NAMESPACE, EXAMPLE
USER_SECRET = "e2e-carol-password"
GENERATED = ("e2e_orders", "e2e_report", "e2e_temp", "e2e_gone")
ROLES: list[dict[str, Any]] = [
    {"name": "e2e_orders", "inRoles": ["e2e_readers"]},
    {"name": "e2e_readers", "login": False},
    {"name": "e2e_report", "inRoles": ["pg_read_all_data"], "connectionLimit": 5},
    {"name": "e2e_carol", "passwordSecret": {"name": USER_SECRET}},
    {"name": "e2e_temp"},
    {"name": "e2e_gone"},
]
DATABASES: list[dict[str, Any]] = [
    {"name": "e2e_shop", "owner": "e2e_orders", "extensions": ["pg_trgm"],
     "schemas": [{"name": "sales", "owner": "e2e_readers"}]},
]  # fmt: skip
# A check runs at most every 60 s on a steady cluster (controller/reconcilers/roles.py CHECK_SECONDS).
REPAIR_TIMEOUT = 150


def patch_spec(kube: Kube, spec: dict[str, Any]) -> None:
    kube.kubectl("patch", "pgc", NAME, "-n", NS, "--type=merge", "-p", json.dumps({"spec": spec}))


def on_primary(kube: Kube, query: str) -> str:
    primary = str(status(kube, NS, NAME)["currentPrimary"])
    return str(superuser_sql(kube, NS, primary, query))


def user_secret(password: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": USER_SECRET, "namespace": NS, "labels": {"db.example.com/cluster": NAME}},
        "data": {"password": base64.b64encode(password.encode()).decode()},
    })  # fmt: skip


def all_applied(kube: Kube) -> dict[str, Any] | None:
    st = status(kube, NS, NAME)
    roles = {r["name"]: r for r in st.get("roles") or ()}
    dbs = {d["name"]: d for d in st.get("databases") or ()}
    declared = {r["name"] for r in ROLES}
    ok = (declared <= roles.keys() and all(roles[n]["applied"] for n in declared)
          and dbs.get("e2e_shop", {}).get("applied") is True)  # fmt: skip
    return st if ok else None


def connect_with(kube: Kube, tmp_path: Path, values: dict[str, str], *, password: str | None = None,
                 dbname: str | None = None) -> psycopg.Connection[Any]:  # fmt: skip
    """What an application does with a role Secret: verify-full against its ca.crt through -rw."""
    ca = tmp_path / f"{values['username']}-ca.crt"
    ca.write_text(values["ca.crt"])
    return psycopg.connect(host=values["host"], hostaddr=service_ip(kube, NS, f"{NAME}-rw"),
                           port=int(values["port"]), user=values["username"],
                           password=password if password is not None else values["password"],
                           dbname=dbname or values["dbname"], sslmode="verify-full", sslrootcert=str(ca),
                           connect_timeout=5, autocommit=True)  # fmt: skip


@pytest.fixture(scope="module")
def declared(example: Kube) -> Iterator[Kube]:
    """The roles and databases declared on the example cluster; all of it removed (dropped) at the end."""
    crd = get_json(example, "crd", "postgresclusters.db.example.com")
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert "roles" in spec_schema, (
        "the installed CRD has no spec.roles (charts/pg-operator/crds is older than deploy/crd)"
    )
    wait_serving(example, NS, NAME, 3, 300)
    example.kubectl("apply", "-f", "-", input=user_secret("carol-first-password"))
    patch_spec(example, {"roles": ROLES, "databases": DATABASES})
    try:
        yield example
    finally:
        # Everything this module added goes: the policy drops what leaves the spec, then is reset.
        patch_spec(example, {"removalPolicy": {"roles": "delete", "databases": "delete"}})
        patch_spec(example, {"roles": None, "databases": None})
        on_primary(example, "DROP ROLE IF EXISTS e2e_temp")  # retained by the removal test, if it ran
        wait_until("the declared roles and databases to be dropped",
                   lambda: on_primary(example, "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'e2e\\_%'")
                   == "0" and not status(example, NS, NAME).get("roles"), REPAIR_TIMEOUT, 2)  # fmt: skip
        patch_spec(example, {"removalPolicy": None})
        example.kubectl("delete", "secret", USER_SECRET, f"{NAME}-e2e-temp", "-n", NS, "--ignore-not-found")
        wait_serving(example, NS, NAME, 3, 120)


def test_each_generated_role_secret_lets_an_application_connect(declared: Kube, tmp_path: Path) -> None:
    started = time.monotonic()
    st = wait_until("every declared role and database applied", lambda: all_applied(declared), 240, 2)
    print(
        json.dumps(
            {"measure": "roles_declared_to_applied_seconds", "seconds": round(time.monotonic() - started, 1)}
        )
    )
    conditions = {c["type"]: c for c in st["conditions"]}
    assert (
        conditions["RolesApplied"]["status"] == "True" and conditions["DatabasesApplied"]["status"] == "True"
    )
    for role in GENERATED:
        values = secret(declared, NS, f"{NAME}-{role.replace('_', '-')}")
        body = get_json(declared, "secret", f"{NAME}-{role.replace('_', '-')}", "-n", NS)
        assert body["metadata"]["labels"]["db.example.com/cluster"] == NAME
        assert body["metadata"]["ownerReferences"][0]["kind"] == "PostgresCluster"
        app_keys = set(secret(declared, NS, f"{NAME}-app"))
        assert app_keys <= set(values), app_keys - set(values)
        assert "sslmode=verify-full" in values["uri"] and len(values["password"]) >= 40
        with connect_with(declared, tmp_path, values) as conn:
            assert conn.execute("SELECT current_user, current_database()").fetchone() == (
                role,
                values["dbname"],
            )
            assert conn.info.pgconn.ssl_in_use
    # The database: owned by its role, with the extension and the schema owned by the declared group.
    orders = secret(declared, NS, f"{NAME}-e2e-orders")
    assert orders["dbname"] == "e2e_shop"
    with connect_with(declared, tmp_path, orders) as conn:
        row = conn.execute(
            "SELECT pg_get_userbyid(d.datdba), (SELECT extversion IS NOT NULL FROM pg_extension WHERE "
            "extname = 'pg_trgm'), "
            "(SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'sales'), "
            "pg_has_role('e2e_readers', 'MEMBER') FROM pg_database d WHERE datname = current_database()"
        ).fetchone()
        assert row == ("e2e_orders", True, "e2e_readers", True)
        assert conn.execute("SELECT similarity('orders', 'order')").fetchone()[0] > 0.5  # type: ignore[index]
        conn.execute("CREATE TABLE sales.entries (id int)")  # e2e_orders is a member of the schema's owner
    report = secret(declared, NS, f"{NAME}-e2e-report")
    with connect_with(declared, tmp_path, report, dbname="e2e_shop") as conn:
        assert conn.execute("SELECT count(*) FROM sales.entries").fetchone() == (0,)  # pg_read_all_data
        assert conn.execute("SELECT rolconnlimit FROM pg_roles WHERE rolname = current_user").fetchone() == (
            5,
        )
    # The user-managed password: no Secret generated for it, and its own password works.
    assert get_or_none(declared, "secret", f"{NAME}-e2e-carol", "-n", NS) is None
    carol = orders | {"username": "e2e_carol", "dbname": "app"}
    with connect_with(declared, tmp_path, carol, password="carol-first-password") as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("e2e_carol",)


def test_a_steady_cluster_is_not_checked_on_every_pass(declared: Kube) -> None:
    """Passes woken by changes that concern no role (here: an annotation on the cluster, five times)
    neither exec into the primary nor write: the check runs at most once per CHECK_SECONDS."""
    wait_until("every declared role and database applied", lambda: all_applied(declared), 240, 2)
    audit = Audit(user=f"system:serviceaccount:{OPERATOR_NAMESPACE}:{RELEASE}")
    mark = audit.settled(namespace=NS, timeout=120)
    started = time.monotonic()
    for i in range(5):
        declared.kubectl("annotate", "pgc", NAME, "-n", NS, f"e2e.example.com/poke={i}", "--overwrite")
    # The five passes are done once the operator has seen the last annotation and written nothing since:
    # settled() waits for 3 s without a write by the operator.
    audit.settled(namespace=NS, timeout=60)
    requests = audit.requests_since(mark, namespace=NS)
    execs = sum(n for (_, resource), n in requests.items() if resource == "pods/exec")
    writes = {k: n for k, n in audit.writes_since(mark, namespace=NS).items() if k[1] != "pods/exec"}
    print(json.dumps({"measure": "roles_steady_execs", "passes": 5, "execs": execs,
                      "window_seconds": round(time.monotonic() - started, 1)}))  # fmt: skip
    declared.kubectl("annotate", "pgc", NAME, "-n", NS, "e2e.example.com/poke-")
    # One check may fall into the window (the periodic one); five passes must not make five.
    assert execs <= 2, requests
    assert not writes, writes


def test_a_role_altered_and_one_dropped_by_hand_are_put_back(declared: Kube, tmp_path: Path) -> None:
    wait_until("every declared role and database applied", lambda: all_applied(declared), 240, 2)
    on_primary(declared, "ALTER ROLE e2e_report NOLOGIN SUPERUSER")
    on_primary(declared, "DROP ROLE e2e_temp")
    started = time.monotonic()

    def repaired() -> bool:
        row = on_primary(declared, "SELECT rolcanlogin, rolsuper FROM pg_roles WHERE rolname = 'e2e_report'")
        return (
            row == "t|f"
            and on_primary(declared, "SELECT count(*) FROM pg_roles WHERE rolname = 'e2e_temp'") == "1"
        )

    wait_until("the altered and the dropped role to be put back", repaired, REPAIR_TIMEOUT, 2)
    print(
        json.dumps(
            {"measure": "roles_drift_repaired_seconds", "seconds": round(time.monotonic() - started, 1)}
        )
    )
    # The dropped role came back with the password its Secret holds.
    with connect_with(declared, tmp_path, secret(declared, NS, f"{NAME}-e2e-temp")) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("e2e_temp",)
    reasons = [e["reason"] for e in get_json(declared, "events", "-n", NS, "--field-selector",
                                             "reason=RolesConverged")["items"]]  # fmt: skip
    assert reasons, "no RolesConverged Event"


def test_a_user_managed_password_rotated_in_its_secret_is_applied(declared: Kube, tmp_path: Path) -> None:
    wait_until("every declared role and database applied", lambda: all_applied(declared), 240, 2)
    base = secret(declared, NS, f"{NAME}-e2e-orders") | {"username": "e2e_carol", "dbname": "app"}
    declared.kubectl("apply", "-f", "-", input=user_secret("carol-second-password"))
    started = time.monotonic()

    def new_accepted() -> bool:
        try:
            with connect_with(declared, tmp_path, base, password="carol-second-password"):
                return True
        except psycopg.OperationalError:
            return False

    wait_until("the rotated password to be accepted", new_accepted, 120, 1)
    print(
        json.dumps(
            {"measure": "roles_rotation_applied_seconds", "seconds": round(time.monotonic() - started, 1)}
        )
    )
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        connect_with(declared, tmp_path, base, password="carol-first-password").close()
    # The user's Secret is read, never written.
    body = get_json(declared, "secret", USER_SECRET, "-n", NS)
    assert not (body["metadata"].get("annotations") or {}).keys() - {
        "kubectl.kubernetes.io/last-applied-configuration"
    }
    assert not body["metadata"].get("ownerReferences")


def test_removal_retains_by_default_and_drops_with_delete(declared: Kube) -> None:
    wait_until("every declared role and database applied", lambda: all_applied(declared), 240, 2)
    kept = [r for r in ROLES if r["name"] != "e2e_temp"]
    patch_spec(declared, {"roles": kept})

    def released() -> bool:
        listed = {r["name"] for r in status(declared, NS, NAME).get("roles") or ()}
        return (
            "e2e_temp" not in listed
            and on_primary(
                declared,
                "SELECT shobj_description(oid, 'pg_authid') IS NULL FROM pg_roles WHERE rolname = 'e2e_temp'",
            )
            == "t"
        )

    wait_until("e2e_temp released (retain)", released, REPAIR_TIMEOUT, 2)
    assert on_primary(declared, "SELECT rolcanlogin FROM pg_roles WHERE rolname = 'e2e_temp'") == "t"

    # Its Secret is handed over with it: still there, no longer owned by the cluster nor labelled.
    def handed_over() -> dict[str, Any] | None:
        body = get_json(declared, "secret", f"{NAME}-e2e-temp", "-n", NS)
        return None if body["metadata"].get("ownerReferences") else body

    handed = wait_until("e2e_temp's Secret handed over", handed_over, 60, 1)
    assert "db.example.com/cluster" not in (handed["metadata"].get("labels") or {})
    patch_spec(
        declared,
        {"removalPolicy": {"roles": "delete"}, "roles": [r for r in kept if r["name"] != "e2e_gone"]},
    )
    count = "SELECT count(*) FROM pg_roles WHERE rolname = "
    wait_until("e2e_gone dropped (delete)",
               lambda: on_primary(declared, count + "'e2e_gone'") == "0", REPAIR_TIMEOUT, 2)  # fmt: skip
    gone_secret = f"{NAME}-e2e-gone"
    wait_until("its generated Secret deleted",
               lambda: get_or_none(declared, "secret", gone_secret, "-n", NS) is None, 60, 1)  # fmt: skip
    assert on_primary(declared, count + "'e2e_temp'") == "1"  # retained
    patch_spec(declared, {"removalPolicy": {"roles": "retain"}})


def test_what_only_the_database_refuses_is_reported_not_applied(declared: Kube) -> None:
    """An extension the image does not ship and a membership in a role that does not exist: the entries
    say why, the conditions are False, one Warning Event; the rest stays applied."""
    spec = get_json(declared, "pgc", NAME, "-n", NS)["spec"]
    roles = [*spec["roles"], {"name": "e2e_lonely", "inRoles": ["e2e_nobody"]}]
    databases = [
        *spec["databases"],
        {"name": "e2e_bad", "owner": "e2e_orders", "extensions": ["no_such_ext"]},
    ]
    patch_spec(declared, {"roles": roles, "databases": databases})

    def reported() -> dict[str, Any] | None:
        st = status(declared, NS, NAME)
        entries = {e["name"]: e for e in [*(st.get("roles") or ()), *(st.get("databases") or ())]}
        lonely = entries.get("e2e_lonely", {}).get("reason")
        ok = (
            "e2e_bad" in entries
            and not entries["e2e_bad"]["applied"]
            and lonely == "membership in role e2e_nobody: no such role"
        )
        return st if ok else None

    st = wait_until("the refusals reported", reported, 120, 1)
    entries = {e["name"]: e for e in [*st["roles"], *st["databases"]]}
    assert entries["e2e_bad"]["reason"] == "extension no_such_ext is not available in the image"
    assert entries["e2e_lonely"]["reason"] == "membership in role e2e_nobody: no such role"
    assert entries["e2e_orders"]["applied"] and entries["e2e_shop"]["applied"]
    conditions = {c["type"]: c for c in st["conditions"]}
    assert (
        conditions["DatabasesApplied"]["status"] == "False"
        and conditions["RolesApplied"]["status"] == "False"
    )
    assert "no_such_ext" in conditions["DatabasesApplied"]["message"]
    # The database and the role themselves exist: only what the database refused is missing.
    assert on_primary(declared, "SELECT count(*) FROM pg_database WHERE datname = 'e2e_bad'") == "1"
    warnings = get_json(declared, "events", "-n", NS, "--field-selector", "reason=RolesNotApplied")["items"]
    assert any("no_such_ext" in w["message"] and "e2e_nobody" in w["message"] for w in warnings), warnings
