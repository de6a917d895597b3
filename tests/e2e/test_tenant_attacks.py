"""Attacks a tenant can make from inside a database it owns, each as the tenant would make it, on the shared
example cluster (orders-db in shop). The tenant acts through a ServiceAccount of its namespace that may
only manage PostgresClusters and read and create Secrets there, with a kubeconfig holding that account's
token alone (harness/tenant.py: its spec edits, Secret reads and clusters below go through it), and in
the database as a declared role that owns a declared database, logging in with its generated Secret;
every test asserts the secure outcome and that the cluster keeps serving. What the module adds is
removed at its end. (A user's CA shared with others is attacked in test_cluster_basics'
server-certificate test, which has that certificate in place; the attacks through the Kubernetes API
alone are test_tenant_attacks_objects.)

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
from harness.objects import cluster
from harness.pgcluster import SMALL, service_ip, status, wait_serving
from harness.tenant import Tenant, grant, parked, revoke
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


def patch_spec(account: Tenant, spec: dict[str, Any]) -> None:
    account.kubectl("patch", "pgc", NAME, "--type=merge", "-p", json.dumps({"spec": spec}))


def tenant_secret(account: Tenant, name: str) -> dict[str, str]:
    data = json.loads(account.kubectl("get", "secret", name, "-o", "json").stdout)["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def on_primary(kube: Kube, query: str, database: str = "postgres") -> str:
    primary = str(status(kube, NS, NAME)["currentPrimary"])
    return str(superuser_sql(kube, NS, primary, query, database))


def entries(kube: Kube) -> dict[str, dict[str, Any]]:
    st = status(kube, NS, NAME)
    return {e["name"]: e for e in [*(st.get("roles") or ()), *(st.get("databases") or ())]}


def tenant_connection(kube: Kube, account: Tenant, tmp_path: Path) -> psycopg.Connection[Any]:
    """What the tenant has: its generated Secret, verify-full through -rw, into the database it owns."""
    values = tenant_secret(account, f"{NAME}-{TENANT.replace('_', '-')}")
    ca = tmp_path / "tenant-ca.crt"
    ca.write_text(values["ca.crt"])
    return psycopg.connect(host=values["host"], hostaddr=service_ip(kube, NS, f"{NAME}-rw"),
                           port=int(values["port"]), user=values["username"], password=values["password"],
                           dbname=TENANT_DB, sslmode="verify-full", sslrootcert=str(ca), connect_timeout=5,
                           autocommit=True)  # fmt: skip


def superusers(kube: Kube) -> set[str]:
    return set(on_primary(kube, "SELECT rolname FROM pg_roles WHERE rolsuper").split())


@pytest.fixture(scope="module")
def account(example: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenant]:
    """The tenant's ServiceAccount in the example's namespace and a kubeconfig with its token alone: every
    spec edit, Secret read and cluster the tenant creates below goes through it."""
    wait_serving(example, NS, NAME, 3, 300)
    try:
        yield grant(example, NS, tmp_path_factory.mktemp("tenant"))
    finally:
        revoke(example, NS)


@pytest.fixture(scope="module")
def tenant(example: Kube, account: Tenant) -> Iterator[Kube]:
    """A tenant role owning a tenant database on the example cluster; removed (dropped) at the end."""
    patch_spec(account, {"roles": ROLES, "databases": DATABASES})
    wait_until("the tenant's role and database applied",
               lambda: all(entries(example).get(n, {}).get("applied") for n in (TENANT, TENANT_DB)),
               CHECK_TIMEOUT, 2)  # fmt: skip
    try:
        yield example
    finally:
        patch_spec(account, {"removalPolicy": {"roles": "delete", "databases": "delete"}})
        patch_spec(account, {"roles": None, "databases": None})
        on_primary(example, f"DROP ROLE IF EXISTS {ESCALATED}")
        on_primary(example, f"DROP ROLE IF EXISTS {HELPER}")
        wait_until("the tenant's role and database dropped",
                   lambda: on_primary(example, TENANT_ROLES) == "0"
                   and not status(example, NS, NAME).get("roles"), CHECK_TIMEOUT, 2)  # fmt: skip
        patch_spec(account, {"removalPolicy": None})
        wait_serving(example, NS, NAME, 3, 120)


def test_a_search_path_the_tenant_sets_never_runs_its_code_as_the_superuser(
    tenant: Kube, account: Tenant, tmp_path: Path
) -> None:
    before = superusers(tenant)
    with tenant_connection(tenant, account, tmp_path) as conn:
        conn.execute(TRAP)
        # The trap works: a session that resolves names through the database's search path runs it.
        with tenant_connection(tenant, account, tmp_path) as probe:
            probe.execute("SELECT count(*) FROM pg_extension")
        assert conn.execute("SELECT count(*), bool_or(super) FROM public.calls").fetchone() == (1, False)
        conn.execute("TRUNCATE public.calls")
    # A spec change makes the operator read the database back and converge it: a new schema, an
    # extension (trusted: created as the database's owner) and a new owner for the declared schema.
    databases = [{"name": TENANT_DB, "owner": TENANT, "extensions": ["pg_trgm"],
                  "schemas": [{"name": "app"}, {"name": "reports"}]}]  # fmt: skip
    patch_spec(account, {"databases": databases})
    wait_until("the new schema and the extension created in the tenant's database",
               lambda: on_primary(tenant, REPORTS_SCHEMA, TENANT_DB) == "1"
               and entries(tenant).get(TENANT_DB, {}).get("applied"), CHECK_TIMEOUT, 2)  # fmt: skip
    # One more periodic read-back, after the converging one.
    patch_spec(account, {"databases": [{**databases[0], "schemas": [{"name": "app"}]}]})
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
    tenant: Kube, account: Tenant, tmp_path: Path
) -> None:
    """pg_buffercache is not trusted: only the superuser can create it, so its script runs as the superuser
    with the target schema first in its search path. Installed into the tenant's `public`, anything the
    tenant planted there would run; it goes into `extensions`, owned by the superuser, instead."""
    databases = [{"name": TENANT_DB, "owner": TENANT, "extensions": ["pg_buffercache"],
                  "schemas": [{"name": "app"}]}]  # fmt: skip
    patch_spec(account, {"databases": databases})
    wait_until("pg_buffercache created",
               lambda: on_primary(tenant, EXTENSION_SCHEMA.format("pg_buffercache"), TENANT_DB) != "",
               CHECK_TIMEOUT, 2)  # fmt: skip
    row = on_primary(tenant, EXTENSION_SCHEMA.format("pg_buffercache"), TENANT_DB)
    assert row == "extensions|postgres", row
    with (
        tenant_connection(tenant, account, tmp_path) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("CREATE FUNCTION extensions.planted() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$")


def test_a_membership_that_reaches_server_programs_is_refused(tenant: Kube, account: Tenant) -> None:
    """A role that can run server programs (as a CREATEROLE role on PostgreSQL 15 could make one): declaring
    a membership in it is refused, reported, and never granted, whatever the path to the predefined role."""
    on_primary(tenant, f"CREATE ROLE {HELPER} NOLOGIN")
    on_primary(tenant, f"GRANT pg_execute_server_program TO {HELPER}")
    patch_spec(account, {"roles": [{"name": TENANT, "inRoles": [HELPER]}]})

    def refused() -> dict[str, Any] | None:
        entry = entries(tenant).get(TENANT, {})
        return entry if entry.get("applied") is False and HELPER in entry.get("reason", "") else None

    entry = wait_until("the membership refused", refused, CHECK_TIMEOUT, 2)
    assert "pg_execute_server_program" in entry["reason"], entry
    assert on_primary(tenant, f"SELECT pg_has_role('{TENANT}', 'pg_execute_server_program', 'MEMBER')") == "f"
    warnings = get_json(tenant, "events", "-n", NS, "--field-selector", "reason=RolesNotApplied")["items"]
    assert any(HELPER in w["message"] for w in warnings), warnings
    patch_spec(account, {"roles": ROLES})


# --- replication certificates -------------------------------------------------------------------------

FORGER = "e2e-forger"


def replication_attempt(host: str, cert: Path, key: Path, database: str | None) -> str:
    """Log in as the replication role with a client certificate: a replication connection (database
    None: IDENTIFY_SYSTEM) or a session in `database` (what pg_rewind opens). What the server said."""
    extra: dict[str, Any] = {"replication": "database"} if database is None else {}
    try:
        with psycopg.connect(host=host, port=5432, user="replicator", dbname=database or "postgres",
                             sslmode="require", sslcert=str(cert), sslkey=str(key), connect_timeout=5,
                             autocommit=True, **extra) as conn:  # fmt: skip
            if database is None:
                result = conn.pgconn.exec_(b"IDENTIFY_SYSTEM")
                answer = psycopg.pq.ExecStatus(result.status).name
                return f"accepted: {answer} {result.error_message.decode()}".strip()
            return f"accepted: {conn.execute('SELECT current_user').fetchone()}"
    except psycopg.OperationalError as exc:
        return f"refused: {exc}"


def test_another_clusters_replication_certificate_is_refused_by_this_clusters_primary(
    example: Kube, account: Tenant, tmp_path: Path
) -> None:
    """Every cluster's replication certificate says CN=replicator, and the tenant may read each one in its
    namespace. It creates a second cluster there (one whose pods have no node to run on: its certificates
    are made all the same) and presents that cluster's replication certificate to the example's primary:
    refused, for replication and for the `postgres` database alike, while the example's own is taken.
    (A certificate from a user's issuer shared by many clusters is test_cluster_basics' server-certificate
    test.)"""
    account.create(cluster(FORGER, NS, replicas=1, resources=SMALL, **parked()))
    try:
        forged = wait_until("the second cluster's replication certificate",
                            lambda: tenant_secret(account, f"{FORGER}-server-tls"), 60, 1)  # fmt: skip
        own = tenant_secret(account, f"{NAME}-server-tls")
        assert forged["replication.crt"] != own["replication.crt"]
        primary = str(status(example, NS, NAME)["currentPrimary"])
        host = str(get_json(example, "pod", primary, "-n", NS)["status"]["podIP"])
        outcome: dict[str, str] = {}
        for who, values in (("other cluster's", forged), ("own", own)):
            cert, key = tmp_path / f"{len(outcome)}.crt", tmp_path / f"{len(outcome)}.key"
            cert.write_text(values["replication.crt"])
            key.write_text(values["replication.key"])
            key.chmod(0o600)
            outcome[f"{who} certificate, replication"] = replication_attempt(host, cert, key, None)
            outcome[f"{who} certificate, postgres"] = replication_attempt(host, cert, key, "postgres")
        print(json.dumps(outcome, indent=1), flush=True)
        assert outcome["own certificate, replication"].startswith("accepted: TUPLES_OK"), outcome
        assert outcome["own certificate, postgres"] == "accepted: ('replicator',)", outcome
        assert outcome["other cluster's certificate, replication"].startswith("refused"), outcome
        assert outcome["other cluster's certificate, postgres"].startswith("refused"), outcome
    finally:
        account.kubectl("delete", "pgc", FORGER, "--ignore-not-found")
