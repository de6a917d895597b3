"""The roles sub-reconciler's pure parts: quoting, the observe script and its output, the converging SQL
(no-op,
drift, passwords, memberships, extensions, removal), generated Secrets and status entries."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from pg_operator.api.cluster import PostgresCluster
from pg_operator.scram import scram_sha256_verifier
from pg_operator.specs.role_changes import converge
from pg_operator.specs.role_reads import (
    ObservationError,
    Observed,
    ObservedDatabase,
    ObservedRole,
    observe_sql,
    parse_observed,
)
from pg_operator.specs.roles import (
    MARKER,
    Passwords,
    conditions,
    connection_keys,
    ident,
    literal,
    orphan_patch,
    passwords,
    released_secrets,
    role_secret,
    stale_keys,
    verifier_matches,
)
from pg_operator.specs.secrets import app_connection

SALT = b"0123456789abcdef"


def cluster(**spec: Any) -> PostgresCluster:
    body = {"replicas": 1, "version": "16", "storage": "1Gi"} | spec
    return PostgresCluster.from_obj(
        {"metadata": {"name": "db", "namespace": "ns", "uid": "u", "generation": 3}, "spec": body}
    )


DECLARED = cluster(
    roles=[{"name": "orders", "inRoles": ["readers"]}, {"name": "readers", "login": False}],
    databases=[
        {
            "name": "shop",
            "owner": "orders",
            "extensions": ["pg_trgm"],
            "schemas": [{"name": "sales", "owner": "readers"}],
        }
    ],
)


def role(name: str, **kw: Any) -> ObservedRole:
    base: dict[str, Any] = dict(
        name=name,
        login=True,
        createdb=False,
        createrole=False,
        inherit=True,
        superuser=False,
        replication=False,
        bypassrls=False,
        connection_limit=-1,
        valid_until=None,
        managed=True,
        member_of=frozenset(),
    )
    return ObservedRole(**(base | kw))


def converged(pw: str = "s3cret") -> Observed:
    """What the database holds once DECLARED is applied."""
    return Observed(
        roles={
            "orders": role(
                "orders", member_of=frozenset({"readers"}), verifier=scram_sha256_verifier(pw, salt=SALT)
            ),
            "readers": role("readers", login=False),
            "app": role("app", managed=False),
        },
        databases={
            "shop": ObservedDatabase(
                "shop",
                "orders",
                "UTF8",
                "C.UTF-8",
                True,
                True,
                frozenset({"plpgsql", "pg_trgm"}),
                {"sales": "readers"},
            ),
            "app": ObservedDatabase("app", "app", "UTF8", "C.UTF-8", True, False),
            "postgres": ObservedDatabase("postgres", "postgres", "UTF8", "C.UTF-8", True, False),
        },
        available_extensions=frozenset({"pg_trgm"}),
    )


PW = Passwords({"orders": "s3cret", "readers": None})


def test_quoting_survives_hostile_names() -> None:
    assert ident('x"; DROP ROLE postgres; --') == '"x""; DROP ROLE postgres; --"'
    assert literal("it's") == "'it''s'"
    assert literal("a\\'b") == "'a\\''b'"
    with pytest.raises(ValueError):
        ident("a\0b")
    with pytest.raises(ValueError):
        literal("a\0b")


def test_a_converged_database_needs_no_statement() -> None:
    plan = converge(DECLARED, converged(), PW)
    assert plan.script == [] and plan.changes == []
    assert all(e.applied for e in plan.roles + plan.databases)
    assert [e.name for e in plan.roles] == ["orders", "readers"] and [e.name for e in plan.databases] == [
        "shop"
    ]


def test_an_empty_database_gets_everything_in_order() -> None:
    empty = Observed({"app": role("app", managed=False)}, {}, frozenset({"pg_trgm"}))
    sql = converge(DECLARED, empty, PW, salt=SALT).sql
    order = [
        'CREATE ROLE "orders" WITH LOGIN',
        'CREATE ROLE "readers" WITH NOLOGIN',
        'GRANT "readers" TO "orders"',
        'CREATE DATABASE "shop" OWNER "orders"',
        "\\connect shop",
        'CREATE EXTENSION IF NOT EXISTS "pg_trgm"',
        'CREATE SCHEMA IF NOT EXISTS "sales" AUTHORIZATION "readers"',
    ]
    positions = [sql.index(s) for s in order]
    assert positions == sorted(positions)
    assert f"COMMENT ON ROLE \"orders\" IS '{MARKER}'" in sql
    assert "NOSUPERUSER NOREPLICATION NOBYPASSRLS" in sql
    assert scram_sha256_verifier("s3cret", salt=SALT) in sql and "s3cret'" not in sql
    assert sql.startswith("SET ROLE NONE;\nSET search_path = pg_catalog, pg_temp;\n")
    assert "SET log_statement = 'none'" in sql.split("CREATE ROLE")[0]
    # After each \connect (a database a tenant may own) the session is pinned again before anything runs.
    inside = sql.split("\\connect shop\n", 1)[1]
    assert inside.startswith("SET ROLE NONE;\nSET search_path = pg_catalog, pg_temp;\n")


def test_a_role_altered_or_dropped_by_hand_is_put_back() -> None:
    drifted = converged()
    roles = dict(drifted.roles)
    roles["orders"] = role(
        "orders",
        login=False,
        superuser=True,
        member_of=frozenset({"readers"}),
        verifier=roles["orders"].verifier,
    )
    del roles["readers"]
    plan = converge(DECLARED, Observed(roles, drifted.databases, drifted.available_extensions), PW)
    assert 'ALTER ROLE "orders" WITH LOGIN' in plan.sql and "NOSUPERUSER" in plan.sql
    assert 'CREATE ROLE "readers" WITH NOLOGIN' in plan.sql
    assert "PASSWORD" not in plan.sql.split('ALTER ROLE "orders"')[1].split(";")[0]


def test_a_password_is_set_only_when_the_verifier_does_not_match() -> None:
    assert verifier_matches("s3cret", scram_sha256_verifier("s3cret"))
    assert not verifier_matches("other", scram_sha256_verifier("s3cret"))
    assert not verifier_matches("s3cret", "md5abcdef")
    assert not verifier_matches("s3cret", None)
    plan = converge(DECLARED, converged("old"), PW, salt=SALT)
    assert plan.sql.count("PASSWORD") == 1
    assert f"ALTER ROLE \"orders\" PASSWORD '{scram_sha256_verifier('s3cret', salt=SALT)}'" in plan.sql
    assert plan.changes == ["set the password of role orders"]
    assert "s3cret" not in repr(plan) and "s3cret" not in repr(PW)


def test_memberships_missing_roles_and_undeclared_ones() -> None:
    c = cluster(roles=[{"name": "a", "inRoles": ["ghost", "pg_read_all_data"]}])
    seen = Observed(
        {
            "a": role("a", member_of=frozenset({"pg_monitor", "mine"}), admin_of=frozenset({"mine"})),
            "pg_read_all_data": role("pg_read_all_data", managed=False),
        },
        {},
        frozenset(),
    )
    plan = converge(c, seen, Passwords({"a": None}))
    assert plan.roles[0].applied is False and "membership in role ghost: no such role" in plan.roles[0].reason
    assert 'GRANT "pg_read_all_data" TO "a"' in plan.sql
    assert 'REVOKE "pg_monitor" FROM "a"' in plan.sql
    assert '"mine"' not in plan.sql  # held WITH ADMIN OPTION: a CREATEROLE role's own creation


def test_an_unavailable_extension_is_reported_not_applied() -> None:
    c = cluster(databases=[{"name": "d", "owner": "app", "extensions": ["nosuch", "pg_trgm"]}])
    seen = Observed(
        {},
        {"d": ObservedDatabase("d", "app", "UTF8", "C", True, True, frozenset(), {})},
        frozenset({"pg_trgm"}),
    )
    plan = converge(c, seen, Passwords())
    assert plan.databases[0].applied is False
    assert plan.databases[0].reason == "extension nosuch is not available in the image"
    assert '"nosuch"' not in plan.sql and 'CREATE EXTENSION IF NOT EXISTS "pg_trgm"' in plan.sql
    status = conditions(plan.roles, plan.databases)
    assert status[1][:3] == ("DatabasesApplied", False, "NotApplied")


def test_removal_retain_releases_and_delete_drops() -> None:
    seen = converged()
    roles = {**seen.roles, "gone": role("gone")}
    dbs = {**seen.databases, "old": ObservedDatabase("old", "orders", "UTF8", "C", True, True)}
    observed = Observed(roles, dbs, seen.available_extensions)
    retain = converge(DECLARED, observed, PW)
    assert (
        'COMMENT ON ROLE "gone" IS NULL' in retain.sql and 'COMMENT ON DATABASE "old" IS NULL' in retain.sql
    )
    assert "DROP" not in retain.sql
    spec = DECLARED.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    spec["removalPolicy"] = {"roles": "delete", "databases": "delete"}
    drop = converge(cluster(**spec), observed, PW).sql
    assert 'DROP DATABASE IF EXISTS "old" WITH (FORCE)' in drop
    assert 'REASSIGN OWNED BY "gone" TO "app"' in drop and 'DROP OWNED BY "gone"' in drop
    assert drop.index('DROP OWNED BY "gone"') < drop.index('DROP ROLE IF EXISTS "gone"')
    assert "\\connect shop" in drop and "\\connect old" not in drop.split("DROP DATABASE")[1]


def test_a_removed_role_that_owns_a_database_is_kept_and_reported() -> None:
    spec = {
        "roles": [{"name": "orders"}],
        "removalPolicy": {"roles": "delete"},
        "databases": [{"name": "shop", "owner": "orders"}],
    }
    seen = Observed(
        {"orders": role("orders"), "owner2": role("owner2")},
        {
            "shop": ObservedDatabase("shop", "orders", "UTF8", "C", True, True, frozenset(), {}),
            "kept": ObservedDatabase("kept", "owner2", "UTF8", "C", True, False),
        },
        frozenset(),
    )
    plan = converge(cluster(**spec), seen, Passwords({"orders": None}))
    assert "DROP ROLE" not in plan.sql
    assert next(e for e in plan.roles if e.name == "owner2").reason.startswith(
        "removed from spec.roles but kept"
    )


def test_observe_script_and_output() -> None:
    sql = observe_sql(DECLARED)
    assert (
        "ARRAY['orders', 'readers']::pg_catalog.text[]" in sql and "\\connect shop" in sql and "\\gset" in sql
    )
    # Inside the tenant's database as the read role; as the superuser only where pg_hba does not admit it.
    assert "\\if :pgop_admitted\n\\connect shop pgop_monitor\n" in sql
    assert "\\else\n\\connect shop\n" in sql
    lines = [
        json.dumps(
            {
                "part": "roles",
                "items": [
                    {
                        "name": "orders",
                        "login": True,
                        "createdb": False,
                        "createrole": False,
                        "inherit": True,
                        "superuser": False,
                        "replication": False,
                        "bypassrls": False,
                        "connectionLimit": -1,
                        "validUntil": None,
                        "managed": True,
                        "verifier": "SCRAM-SHA-256$4096:x$y:z",
                        "memberOf": ["readers"],
                        "adminOf": [],
                    }
                ],
            }
        ),
        json.dumps(
            {
                "part": "databases",
                "items": [
                    {
                        "name": "shop",
                        "owner": "orders",
                        "encoding": "UTF8",
                        "collate": "C",
                        "allowConnections": True,
                        "managed": True,
                    }
                ],
            }
        ),
        json.dumps({"part": "extensions", "available": ["pg_trgm"], "trusted": ["pg_trgm"]}),
        json.dumps(
            {
                "part": "reads",
                "as": "pgop_monitor",
                "databases": [{"name": "shop", "read": True, "reason": None}],
            }
        ),
        json.dumps(
            {
                "part": "database",
                "name": "shop",
                "readAs": "pgop_monitor",
                "extensions": ["plpgsql"],
                "schemas": {"sales": "x"},
                "extensionSchema": ["postgres", True],
            }
        ),
    ]
    seen = parse_observed("\n".join(lines))
    assert seen.roles["orders"].member_of == {"readers"} and "SCRAM" not in repr(seen.roles["orders"])
    assert seen.databases["shop"].schemas == {"sales": "x"} and seen.available_extensions == {"pg_trgm"}
    assert seen.trusted_extensions == {"pg_trgm"} and seen.roles["orders"].reaches == frozenset()
    assert seen.databases["shop"].extension_schema_owner == ("postgres", True)
    assert seen.databases["shop"].unread is None and seen.databases_read_as == "pgop_monitor"
    assert seen.stopped_at is None
    with pytest.raises(ObservationError) as err:
        parse_observed(lines[0])
    assert "SCRAM" not in str(err.value)
    with pytest.raises(ObservationError):
        parse_observed('{"part": "roles", "items": [{"name": "SCRAM-SHA-256$"}]}')


def secret(values: dict[str, str], rv: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"name": "s", "resourceVersion": rv, "uid": "x"},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()},
    }


def test_generated_secrets_have_the_app_secrets_keys() -> None:
    c = cluster()
    assert connection_keys(c, "app", "app", "p:w@") == app_connection(c, "p:w@")
    body = role_secret(DECLARED, "orders", "pw", "CA")
    assert body["metadata"]["name"] == "db-orders"
    assert body["metadata"]["labels"]["db.example.com/cluster"] == "db"
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u"
    data = {k: base64.b64decode(v).decode() for k, v in body["data"].items()}
    assert data["dbname"] == "shop" and data["ca.crt"] == "CA" and data["username"] == "orders"
    assert data["uri"].startswith("postgresql://orders:pw@db-rw.ns.svc:5432/shop?sslmode=verify-full&")
    assert role_secret(cluster(roles=[{"name": "a_b"}]), "a_b", "pw", None)["metadata"]["name"] == "db-a-b"


def test_derived_keys_follow_a_rotated_password() -> None:
    current = {
        k: base64.b64decode(v).decode()
        for k, v in role_secret(DECLARED, "orders", "pw", "CA")["data"].items()
    }
    assert stale_keys(DECLARED, "orders", secret(current), "CA") is None
    rotated = current | {"password": "new"}
    patch = stale_keys(DECLARED, "orders", secret(rotated, rv="7"), "CA")
    assert patch is not None and patch["metadata"] == {"resourceVersion": "7"}
    assert base64.b64decode(patch["data"]["uri"]).decode().startswith("postgresql://orders:new@")
    assert "password" not in patch["data"]
    assert stale_keys(DECLARED, "orders", secret(current), "CA2") is not None


def test_passwords_come_from_the_named_or_generated_secret() -> None:
    c = cluster(
        roles=[
            {"name": "gen"},
            {"name": "mine", "passwordSecret": {"name": "user-pw", "key": "pw"}},
            {"name": "group", "login": False},
            {"name": "lost", "passwordSecret": {"name": "nope"}},
        ]
    )
    found = passwords(c, {"db-gen": secret({"password": "g\n"}), "user-pw": secret({"pw": "u"})})
    assert found.by_role == {"gen": "g", "mine": "u", "group": None, "lost": None}
    assert (
        "Secret nope not found" in found.problems["lost"]
        and "db.example.com/cluster=db" in found.problems["lost"]
    )
    waiting = passwords(c, {"user-pw": secret({"pw": "two\nlines"})})
    assert waiting.waiting == {"gen"} and "newline" in waiting.problems["mine"]


def test_secrets_of_roles_no_longer_generating_one_are_released_without_owner_or_labels() -> None:
    labelled = [
        {"metadata": {"name": "db-orders", "labels": {"db.example.com/role": "orders"}}},
        {"metadata": {"name": "db-gone", "labels": {"db.example.com/role": "gone"}, "resourceVersion": "9"}},
        {"metadata": {"name": "db-app", "labels": {"db.example.com/cluster": "db"}}},
    ]
    assert released_secrets(DECLARED, labelled) == ["db-gone"]
    assert orphan_patch(labelled[1]) == {
        "metadata": {
            "resourceVersion": "9",
            "ownerReferences": None,
            "labels": {"db.example.com/cluster": None, "db.example.com/role": None},
        }
    }


def _unqualified_calls(sql: str) -> list[str]:
    """Function calls and relations in `sql` not named with their schema (keywords and psql's own
    variables aside)."""
    import re

    keywords = {
        "coalesce",
        "exists",
        "any",
        "array",
        "extract",
        "filter",
        "case",
        "select",
        "in",
        "and",
        "or",
        "not",
        "from",
        "where",
    }
    found = [
        m.group(1)
        for m in re.finditer(r"(?<![.\w:'])([a-z_][a-z0-9_]*)\s*\(", sql)
        if m.group(1) not in keywords
    ]
    for m in re.finditer(r"(?<!epoch )\b(?:FROM|JOIN)\s+([a-z_][a-z0-9_.]*)", sql):
        if not m.group(1).startswith("pg_catalog."):
            found.append(m.group(1))
    return found


def test_the_read_back_names_every_function_and_relation_with_its_schema() -> None:
    """A tenant owns the declared databases and may put its own schema first in their search path: the
    read-back pins the path at the start and after each \\connect, and names what it calls besides."""
    sql = observe_sql(DECLARED)
    assert _unqualified_calls(sql) == []
    assert sql.startswith("SET ROLE NONE;\nSET search_path = pg_catalog, pg_temp;\n")
    assert sql.split("\\connect shop\n", 1)[1].startswith("SET ROLE NONE;\nSET search_path = pg_catalog")


def test_a_trusted_extension_is_created_as_the_owner_and_an_untrusted_one_in_a_superuser_schema() -> None:
    db = cluster(
        roles=[{"name": "orders"}],
        databases=[{"name": "shop", "owner": "orders", "extensions": ["pg_trgm", "pg_buffercache"]}],
    )
    seen = converged()
    shop = ObservedDatabase("shop", "orders", "UTF8", "C", True, True, frozenset({"plpgsql"}), {})
    observed = Observed(
        {"orders": seen.roles["orders"]},
        {"shop": shop},
        frozenset({"pg_trgm", "pg_buffercache"}),
        frozenset({"pg_trgm"}),
    )
    sql = converge(db, observed, Passwords({"orders": "s3cret"}), salt=SALT).sql
    assert (
        'SET ROLE "orders";\nCREATE EXTENSION IF NOT EXISTS "pg_trgm" SCHEMA public;\nSET ROLE NONE;\n' in sql
    )
    # The schema is created without IF NOT EXISTS: one a tenant made meanwhile fails the script.
    created = 'CREATE SCHEMA "extensions" AUTHORIZATION CURRENT_USER;\n'
    assert created + 'GRANT USAGE ON SCHEMA "extensions" TO PUBLIC;' in sql
    assert sql.index('CREATE SCHEMA "extensions"') < sql.index(
        'CREATE EXTENSION IF NOT EXISTS "pg_buffercache" SCHEMA "extensions"'
    )
    # A schema of that name a tenant owns: refused and reported, nothing created in it.
    tenant_owned = ObservedDatabase(**{**shop.__dict__, "extension_schema_owner": ("orders", False)})
    plan = converge(
        db,
        Observed(
            observed.roles, {"shop": tenant_owned}, observed.available_extensions, observed.trusted_extensions
        ),
        Passwords({"orders": "s3cret"}),
        salt=SALT,
    )
    assert "pg_buffercache" not in plan.sql and 'CREATE SCHEMA "extensions"' not in plan.sql
    [entry] = plan.databases
    assert not entry.applied and "owned by orders, not a superuser" in entry.reason
    # One the superuser owns is used as it is.
    owned = ObservedDatabase(**{**shop.__dict__, "extension_schema_owner": ("postgres", True)})
    sql = converge(
        db,
        Observed(observed.roles, {"shop": owned}, observed.available_extensions, observed.trusted_extensions),
        Passwords({"orders": "s3cret"}),
        salt=SALT,
    ).sql
    assert 'CREATE SCHEMA "extensions"' not in sql and 'SCHEMA "extensions";' in sql


def test_a_membership_that_reaches_superuser_power_is_refused_and_revoked() -> None:
    db = cluster(
        roles=[{"name": "orders", "inRoles": ["helper", "readers"]}, {"name": "readers", "login": False}]
    )
    seen = converged()
    helper = role("helper", login=False, managed=False, reaches=frozenset({"pg_execute_server_program"}))
    orders = role(
        "orders", member_of=frozenset({"helper", "readers"}), verifier=seen.roles["orders"].verifier
    )
    observed = Observed(
        {"orders": orders, "readers": seen.roles["readers"], "helper": helper}, {}, frozenset()
    )
    plan = converge(db, observed, PW, salt=SALT)
    assert 'REVOKE "helper" FROM "orders"' in plan.sql and 'GRANT "helper"' not in plan.sql
    entry = next(e for e in plan.roles if e.name == "orders")
    assert not entry.applied
    assert entry.reason == (
        "membership in role helper: refused, it reaches pg_execute_server_program "
        "(superuser power or the server's files)"
    )
    # Not yet a member: never granted. A superuser role itself is refused the same way.
    boss = role("helper", login=False, managed=False, superuser=True)
    fresh = role("orders", member_of=frozenset({"readers"}), verifier=seen.roles["orders"].verifier)
    plan = converge(
        db,
        Observed({"orders": fresh, "readers": seen.roles["readers"], "helper": boss}, {}, frozenset()),
        PW,
        salt=SALT,
    )
    assert (
        "helper" not in plan.sql
        and "reaches helper" in next(e for e in plan.roles if e.name == "orders").reason
    )
