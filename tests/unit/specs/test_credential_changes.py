"""Which credential Secrets still need applying, the SQL that applies them, and what marks them applied."""

from __future__ import annotations

import base64
import copy
from typing import Any

from harness.objects import cluster_model as cluster
from pg_operator.scram import scram_sha256_verifier
from pg_operator.specs import ClusterPasswords, build_secrets
from pg_operator.specs.credential_changes import (
    APPLIED_ANNOTATION,
    Change,
    applied_patch,
    fingerprint,
    plan,
    role_sql,
    stale_app_keys,
    without_verifiers,
)

PASSWORDS = ClusterPasswords(superuser="su-pw", replication="repl-pw", app="app-pw", patroni_api="api-pw")


def stored(uids: str = "u") -> dict[str, dict[str, Any]]:
    """The four Secrets as the API server holds them (a uid and a resourceVersion each)."""
    out = {}
    for i, secret in enumerate(build_secrets(cluster(), PASSWORDS)):
        secret["metadata"].update({"uid": f"{uids}{i}", "resourceVersion": str(10 + i)})
        out[secret["metadata"]["name"]] = secret
    return out


def marked(secrets: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The same Secrets once every change was applied."""
    out = copy.deepcopy(secrets)
    for change in plan(cluster(), secrets).changes:
        out[change.slot.secret]["metadata"]["annotations"] = {APPLIED_ANNOTATION: change.fingerprint}
    return out


def set_key(secret: dict[str, Any], key: str, value: str) -> None:
    secret["data"][key] = base64.b64encode(value.encode()).decode()


def test_new_secrets_are_all_unapplied_and_applied_ones_are_quiet() -> None:
    secrets = stored()
    changes = plan(cluster(), secrets).changes
    assert [(c.slot.kind, c.slot.username, c.slot.has_role) for c in changes] == [
        ("superuser", "postgres", True),
        ("replication", "replicator", True),
        ("app", "app", True),
        ("patroni-api", "patroni", False),
    ]
    assert [c.resource_version for c in changes] == ["10", "11", "12", "13"]
    assert plan(cluster(), marked(secrets)).changes == []


def test_an_edited_password_a_recreated_secret_and_a_missing_one() -> None:
    secrets = marked(stored())
    set_key(secrets["orders-db-app"], "password", "rotated")
    recreated = stored(uids="new")["orders-db-replication"]  # same password, new uid, no annotation
    secrets["orders-db-replication"] = recreated
    del secrets["orders-db-superuser"]  # the create path makes it; nothing to apply yet
    assert [c.slot.kind for c in plan(cluster(), secrets).changes] == ["replication", "app"]


def test_the_fingerprint_is_salted_by_uid_and_hides_the_password() -> None:
    a, b = fingerprint("uid-a", "app", "pw"), fingerprint("uid-b", "app", "pw")
    assert a != b and a.startswith("sha256:") and "pw" not in a.removeprefix("sha256:")
    assert fingerprint("uid-a", "app", "pw2") != a


def test_a_trailing_newline_is_forgiven_as_the_instance_does() -> None:
    secrets = marked(stored())
    set_key(secrets["orders-db-app"], "password", "app-pw\n")  # `echo pw | kubectl create secret ...`
    assert plan(cluster(), secrets).changes == []  # the same password: nothing to apply
    set_key(secrets["orders-db-app"], "password", "new-pw\n")
    (change,) = plan(cluster(), secrets).changes
    assert change.password == "new-pw"  # what the instance reads from its mount too


def test_refusals_name_the_secret_and_key_and_never_the_password() -> None:
    secrets = marked(stored())
    set_key(secrets["orders-db-app"], "username", "mallory")
    set_key(secrets["orders-db-superuser"], "password", "")
    set_key(secrets["orders-db-replication"], "password", "two\nlines")
    secrets["orders-db-patroni-api"]["data"]["password"] = "%%% not base64"
    result = plan(cluster(), secrets)
    assert result.changes == []
    assert result.refused == [
        "Secret orders-db-superuser: key password is missing, empty or not UTF-8",
        "Secret orders-db-replication: key password contains a newline or NUL byte",
        "Secret orders-db-app: key username is 'mallory', but it must be 'app' (a role's name does not "
        "change through its Secret)",
        "Secret orders-db-patroni-api: key password is missing, empty or not UTF-8",
    ]
    assert "two" not in " ".join(result.refused)


def test_role_sql_sends_verifiers_only_and_quiets_the_log() -> None:
    changes = plan(cluster(), stored()).changes
    sql = role_sql(changes, salt=b"0123456789abcdef")
    for password in ("su-pw", "repl-pw", "app-pw", "api-pw"):
        assert password not in sql
    lines = sql.splitlines()
    assert lines[:7] == [
        "SET ROLE NONE;",
        "SET search_path = pg_catalog, pg_temp;",
        "SET default_transaction_read_only = off;",
        "SET standard_conforming_strings = on;",
        "SET log_statement = 'none';",
        "SET log_min_duration_statement = -1;",
        "SET log_min_error_statement = 'panic';",
    ]
    verifier = scram_sha256_verifier("app-pw", salt=b"0123456789abcdef")
    assert lines[7:] == [
        f"ALTER ROLE \"postgres\" PASSWORD '{scram_sha256_verifier('su-pw', salt=b'0123456789abcdef')}';",
        f"ALTER ROLE \"replicator\" PASSWORD '{scram_sha256_verifier('repl-pw', salt=b'0123456789abcdef')}';",
        f"ALTER ROLE \"app\" PASSWORD '{verifier}';",
    ]  # the Patroni API user is no database role


def test_applied_patch_is_conditional_and_rewrites_the_app_keys_that_derive_from_the_password() -> None:
    secrets = marked(stored())
    app = secrets["orders-db-app"]
    set_key(app, "password", "rotated")
    (change,) = plan(cluster(), secrets).changes
    patch = applied_patch(cluster(), change, app)
    mark = {APPLIED_ANNOTATION: change.fingerprint}
    assert patch["metadata"] == {"resourceVersion": "12", "annotations": mark}
    derived = {k: base64.b64decode(v).decode() for k, v in patch["data"].items()}
    assert set(derived) == {"uri", "jdbc-uri", "pgpass", "fqdn-uri", "fqdn-jdbc-uri"}
    assert all("rotated" in v for v in derived.values())
    # Other Secrets get the mark only.
    other = Change(plan(cluster(), stored()).changes[0].slot, "10", "sha256:x", "pw")
    assert set(applied_patch(cluster(), other, {})) == {"metadata"}


def test_no_password_in_a_repr_and_no_verifier_in_a_message() -> None:
    (change, *_) = plan(cluster(), stored()).changes
    assert "su-pw" not in repr(change)
    assert change.describe() == "the password of role postgres (Secret orders-db-superuser)"
    out = (
        'psql:<stdin>:4: ERROR:  role "x" does not exist\n'
        "LINE 1: ALTER ROLE x PASSWORD 'SCRAM-SHA-256$4096:abc'"
    )
    assert without_verifiers(out) == 'psql:<stdin>:4: ERROR:  role "x" does not exist'


def test_an_applied_app_secret_with_old_style_uris_gets_them_rewritten_and_nothing_else() -> None:
    secrets = marked(stored())
    app = secrets["orders-db-app"]
    assert stale_app_keys(cluster(), app) is None  # as built: nothing to do
    set_key(app, "uri", "postgresql://app:app-pw@orders-db-rw.shop.svc:5432/app")  # before TLS
    patch = stale_app_keys(cluster(), app)
    assert patch is not None and set(patch["data"]) == {"uri"}
    assert patch["metadata"] == {"resourceVersion": "12"}
    assert base64.b64decode(patch["data"]["uri"]).decode().endswith("&target_session_attrs=read-write")
    set_key(app, "password", "not-applied-yet")  # the applying pass rewrites the keys itself
    assert stale_app_keys(cluster(), app) is None
