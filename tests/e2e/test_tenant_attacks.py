"""Attacks a tenant can make from inside a database it owns, each as the tenant would make it, on the shared
example cluster (orders-db in shop). The tenant acts through a ServiceAccount of its namespace that may
only read and change PostgresClusters and read Secrets there (its spec edits and Secret reads below go
through it), and in the database as a declared role that owns a declared database, logging in with its
generated Secret; every test asserts the secure outcome and that the cluster keeps serving. What the
module adds is removed at its end. (A user's CA shared with others is attacked in test_cluster_basics'
server-certificate test, which has that certificate in place.)

The operator's converging SQL runs as the superuser inside databases the tenant owns, and so did its
read-back on images before the read role was admitted there (it now reads as `pgop_monitor`:
tests/integration/test_role_read_sessions.py). A tenant owns `public` there (PostgreSQL 15+) and may
`ALTER DATABASE … SET search_path`, so any name such a session resolves through the tenant's search path
runs the tenant's code with the session's rights."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness.deployed_operator import EXAMPLE, EXAMPLE_NAMESPACE
from harness.e2e_backup import superuser_sql
from harness.kube import get_json
from harness.local_cluster import Kube
from harness.pgcluster import service_ip, status, wait_serving
from harness.waiting import wait_until

pytestmark = pytest.mark.e2e

NS, NAME = EXAMPLE_NAMESPACE, EXAMPLE
TENANT, TENANT_DB = "e2e_alice", "e2e_alicedb"
HELPER = "e2e_alice_helper"
# What the attacks would create if any of them worked.
ESCALATED = "e2e_evil"
CHECK_TIMEOUT = 180  # a roles check runs on a spec change, and at most 60 s apart otherwise

ROLES: list[dict[str, Any]] = [{"name": TENANT}]
DATABASES: list[dict[str, Any]] = [{"name": TENANT_DB, "owner": TENANT, "schemas": [{"name": "app"}]}]

# The tenant's trap: the first time any function or view below runs as a superuser, it records the
# session user and creates a superuser role. Planted in the tenant's own `public`, which a search path set
# on the database puts before pg_catalog.
TRAP = f"""
CREATE TABLE public.calls (who name, super bool, at timestamptz DEFAULT now());
CREATE FUNCTION public.escalate() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.calls (who, super)
    SELECT current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
  IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
    EXECUTE 'CREATE ROLE {ESCALATED} SUPERUSER LOGIN';
  END IF;
  RETURN true;
EXCEPTION WHEN OTHERS THEN
  RETURN true;
END $$;
CREATE FUNCTION public.pg_get_userbyid(oid) RETURNS name LANGUAGE sql
  AS $$ SELECT CASE WHEN public.escalate() THEN pg_catalog.pg_get_userbyid($1) END $$;
CREATE VIEW public.pg_extension AS SELECT * FROM pg_catalog.pg_extension WHERE public.escalate();
CREATE VIEW public.pg_namespace AS SELECT * FROM pg_catalog.pg_namespace WHERE public.escalate();
ALTER DATABASE {TENANT_DB} SET search_path = public, pg_catalog;
"""  # noqa: S608 (the test's own constants)


# The test's own superuser queries in the tenant's database name everything by its schema (the trap is
# in the tenant's search path there).
TENANT_ROLES = "SELECT count(*) FROM pg_catalog.pg_roles WHERE rolname LIKE 'e2e\\_alice%'"
REPORTS_SCHEMA = "SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspname = 'reports'"
CALLS = "SELECT pg_catalog.string_agg(who::text || ':' || super::text, ',') FROM public.calls"
_EXTENSION = (
    "FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace "
    "WHERE e.extname = '{}'"
)
EXTENSION_OWNER = "SELECT pg_catalog.pg_get_userbyid(e.extowner) || '|' || n.nspname " + _EXTENSION
EXTENSION_SCHEMA = "SELECT n.nspname || '|' || pg_catalog.pg_get_userbyid(n.nspowner) " + _EXTENSION


TENANT_ACCOUNT = f"system:serviceaccount:{NS}:e2e-tenant"
# What a tenant team is given: its own clusters and Secrets, nothing else.
TENANT_RBAC = [
    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "e2e-tenant", "namespace": NS}},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
     "metadata": {"name": "e2e-tenant", "namespace": NS},
     "rules": [{"apiGroups": ["db.example.com"], "resources": ["postgresclusters"],
                "verbs": ["get", "list", "watch", "create", "patch", "update"]},
               {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
     "metadata": {"name": "e2e-tenant", "namespace": NS},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "e2e-tenant"},
     "subjects": [{"kind": "ServiceAccount", "name": "e2e-tenant", "namespace": NS}]},
]  # fmt: skip


def as_tenant(kube: Kube, *args: str) -> Any:
    return kube.kubectl(f"--as={TENANT_ACCOUNT}", *args)


def patch_spec(kube: Kube, spec: dict[str, Any]) -> None:
    as_tenant(kube, "patch", "pgc", NAME, "-n", NS, "--type=merge", "-p", json.dumps({"spec": spec}))


def tenant_secret(kube: Kube, name: str) -> dict[str, str]:
    data = json.loads(as_tenant(kube, "get", "secret", name, "-n", NS, "-o", "json").stdout)["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def on_primary(kube: Kube, query: str, database: str = "postgres") -> str:
    primary = str(status(kube, NS, NAME)["currentPrimary"])
    return str(superuser_sql(kube, NS, primary, query, database))


def entries(kube: Kube) -> dict[str, dict[str, Any]]:
    st = status(kube, NS, NAME)
    return {e["name"]: e for e in [*(st.get("roles") or ()), *(st.get("databases") or ())]}


def tenant_connection(kube: Kube, tmp_path: Path) -> psycopg.Connection[Any]:
    """What the tenant has: its generated Secret, verify-full through -rw, into the database it owns."""
    values = tenant_secret(kube, f"{NAME}-{TENANT.replace('_', '-')}")
    ca = tmp_path / "tenant-ca.crt"
    ca.write_text(values["ca.crt"])
    return psycopg.connect(host=values["host"], hostaddr=service_ip(kube, NS, f"{NAME}-rw"),
                           port=int(values["port"]), user=values["username"], password=values["password"],
                           dbname=TENANT_DB, sslmode="verify-full", sslrootcert=str(ca), connect_timeout=5,
                           autocommit=True)  # fmt: skip


def superusers(kube: Kube) -> set[str]:
    return set(on_primary(kube, "SELECT rolname FROM pg_roles WHERE rolsuper").split())


@pytest.fixture(scope="module")
def tenant(example: Kube) -> Iterator[Kube]:
    """A tenant role owning a tenant database on the example cluster; removed (dropped) at the end."""
    wait_serving(example, NS, NAME, 3, 300)
    rbac = {"apiVersion": "v1", "kind": "List", "items": TENANT_RBAC}
    example.kubectl("apply", "-f", "-", input=json.dumps(rbac))
    # The account is a tenant's, no more: it may not exec into pods.
    denied = example.kubectl(f"--as={TENANT_ACCOUNT}", "auth", "can-i", "create", "pods/exec", "-n", NS,
                             check=False)  # fmt: skip
    assert denied.stdout.strip() == "no", denied.stdout
    patch_spec(example, {"roles": ROLES, "databases": DATABASES})
    wait_until("the tenant's role and database applied",
               lambda: all(entries(example).get(n, {}).get("applied") for n in (TENANT, TENANT_DB)),
               CHECK_TIMEOUT, 2)  # fmt: skip
    try:
        yield example
    finally:
        patch_spec(example, {"removalPolicy": {"roles": "delete", "databases": "delete"}})
        patch_spec(example, {"roles": None, "databases": None})
        on_primary(example, f"DROP ROLE IF EXISTS {ESCALATED}")
        on_primary(example, f"DROP ROLE IF EXISTS {HELPER}")
        wait_until("the tenant's role and database dropped",
                   lambda: on_primary(example, TENANT_ROLES) == "0"
                   and not status(example, NS, NAME).get("roles"), CHECK_TIMEOUT, 2)  # fmt: skip
        patch_spec(example, {"removalPolicy": None})
        example.kubectl("delete", "rolebinding,role,serviceaccount", "e2e-tenant", "-n", NS,
                        "--ignore-not-found")  # fmt: skip
        wait_serving(example, NS, NAME, 3, 120)


def test_a_search_path_the_tenant_sets_never_runs_its_code_as_the_superuser(
    tenant: Kube, tmp_path: Path
) -> None:
    before = superusers(tenant)
    with tenant_connection(tenant, tmp_path) as conn:
        conn.execute(TRAP)
        # The trap works: a session that resolves names through the database's search path runs it.
        with tenant_connection(tenant, tmp_path) as probe:
            probe.execute("SELECT count(*) FROM pg_extension")
        assert conn.execute("SELECT count(*), bool_or(super) FROM public.calls").fetchone() == (1, False)
        conn.execute("TRUNCATE public.calls")
    # A spec change makes the operator read the database back and converge it: a new schema, an
    # extension (trusted: created as the database's owner) and a new owner for the declared schema.
    databases = [{"name": TENANT_DB, "owner": TENANT, "extensions": ["pg_trgm"],
                  "schemas": [{"name": "app"}, {"name": "reports"}]}]  # fmt: skip
    patch_spec(tenant, {"databases": databases})
    wait_until("the new schema and the extension created in the tenant's database",
               lambda: on_primary(tenant, REPORTS_SCHEMA, TENANT_DB) == "1"
               and entries(tenant).get(TENANT_DB, {}).get("applied"), CHECK_TIMEOUT, 2)  # fmt: skip
    # One more periodic read-back, after the converging one.
    patch_spec(tenant, {"databases": [{**databases[0], "schemas": [{"name": "app"}]}]})
    wait_until(
        "a further check of the tenant's database",
        lambda: entries(tenant).get(TENANT_DB, {}).get("applied"),
        CHECK_TIMEOUT,
        2,
    )
    calls = on_primary(tenant, CALLS, TENANT_DB)
    assert "true" not in calls, f"the tenant's code ran as a superuser: {calls}"
    assert superusers(tenant) == before
    # The extension is the tenant's own (created as the owner, in the schema named), not the superuser's.
    row = on_primary(tenant, EXTENSION_OWNER.format("pg_trgm"), TENANT_DB)
    assert row == f"{TENANT}|public", row
    wait_serving(tenant, NS, NAME, 3, 120)


def test_an_untrusted_extension_goes_into_a_schema_the_tenant_cannot_write(
    tenant: Kube, tmp_path: Path
) -> None:
    """pg_buffercache is not trusted: only the superuser can create it, so its script runs as the superuser
    with the target schema first in its search path. Installed into the tenant's `public`, anything the
    tenant planted there would run; it goes into `extensions`, owned by the superuser, instead."""
    databases = [{"name": TENANT_DB, "owner": TENANT, "extensions": ["pg_buffercache"],
                  "schemas": [{"name": "app"}]}]  # fmt: skip
    patch_spec(tenant, {"databases": databases})
    wait_until("pg_buffercache created",
               lambda: on_primary(tenant, EXTENSION_SCHEMA.format("pg_buffercache"), TENANT_DB) != "",
               CHECK_TIMEOUT, 2)  # fmt: skip
    row = on_primary(tenant, EXTENSION_SCHEMA.format("pg_buffercache"), TENANT_DB)
    assert row == "extensions|postgres", row
    with tenant_connection(tenant, tmp_path) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("CREATE FUNCTION extensions.planted() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$")


def test_a_membership_that_reaches_server_programs_is_refused(tenant: Kube) -> None:
    """A role that can run server programs (as a CREATEROLE role on PostgreSQL 15 could make one): declaring
    a membership in it is refused, reported, and never granted, whatever the path to the predefined role."""
    on_primary(tenant, f"CREATE ROLE {HELPER} NOLOGIN")
    on_primary(tenant, f"GRANT pg_execute_server_program TO {HELPER}")
    patch_spec(tenant, {"roles": [{"name": TENANT, "inRoles": [HELPER]}]})

    def refused() -> dict[str, Any] | None:
        entry = entries(tenant).get(TENANT, {})
        return entry if entry.get("applied") is False and HELPER in entry.get("reason", "") else None

    entry = wait_until("the membership refused", refused, CHECK_TIMEOUT, 2)
    assert "pg_execute_server_program" in entry["reason"], entry
    assert on_primary(tenant, f"SELECT pg_has_role('{TENANT}', 'pg_execute_server_program', 'MEMBER')") == "f"
    warnings = get_json(tenant, "events", "-n", NS, "--field-selector", "reason=RolesNotApplied")["items"]
    assert any(HELPER in w["message"] for w in warnings), warnings
    patch_spec(tenant, {"roles": ROLES})
