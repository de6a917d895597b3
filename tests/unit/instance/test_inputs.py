"""The pod's environment, Secret files, version output and SCRAM verifiers."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from pg_operator.instance import inputs
from pg_operator.scram import scram_sha256_verifier

ENV = {
    "PGOP_CLUSTER_NAME": "orders-db",
    "PGOP_NAMESPACE": "shop",
    "PGOP_POD_NAME": "orders-db-0",
    "PGOP_POD_IP": "10.244.0.5",
    "PGOP_PG_MAJOR": "16",
    "PGDATA": "/var/lib/postgresql/data/pgdata",
}


def test_pod_environment_defaults_to_the_pod_contract_paths() -> None:
    pod = inputs.pod_environment(ENV)
    assert (pod.cluster, pod.namespace, pod.pod_name, pod.pod_ip) == (
        "orders-db",
        "shop",
        "orders-db-0",
        "10.244.0.5",
    )
    assert pod.config_file == "/etc/pg-operator/config/instance.yaml"
    assert pod.secrets_dir == "/etc/pg-operator/secrets"
    assert pod.run_dir == "/var/run/postgresql"


def test_paths_can_be_moved_for_tests() -> None:
    pod = inputs.pod_environment({**ENV, "PGOP_CONFIG_FILE": "/t/i.yaml", "PGOP_RUN_DIR": "/t/run"})
    assert (pod.config_file, pod.run_dir) == ("/t/i.yaml", "/t/run")


@pytest.mark.parametrize(
    "name", ["PGOP_CLUSTER_NAME", "PGOP_NAMESPACE", "PGOP_POD_NAME", "PGOP_POD_IP", "PGDATA"]
)
def test_missing_variable_is_named(name: str) -> None:
    env = {k: v for k, v in ENV.items() if k != name}
    with pytest.raises(ValueError, match=f"environment variable {name} is required"):
        inputs.pod_environment(env)


def test_bad_values_are_named() -> None:
    with pytest.raises(ValueError, match=r"PGOP_PG_MAJOR='16\.2'"):
        inputs.pod_environment({**ENV, "PGOP_PG_MAJOR": "16.2"})
    with pytest.raises(ValueError, match="PGOP_POD_NAME='Orders_0' is not a DNS label"):
        inputs.pod_environment({**ENV, "PGOP_POD_NAME": "Orders_0"})
    with pytest.raises(ValueError, match="PGDATA='data' must be an absolute path"):
        inputs.pod_environment({**ENV, "PGDATA": "data"})


def test_credentials_from_secret_files() -> None:
    creds = inputs.credentials_from_files("app", {"username": "app\n", "password": "s3cret-value\n"})
    assert (creds.username, creds.password) == ("app", "s3cret-value")
    assert "s3cret-value" not in repr(creds)
    assert "s3cret-value" not in str(creds)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"password": "x"}, "secret app: key 'username' is missing"),
        ({"username": "app"}, "secret app: key 'password' is missing"),
        ({"username": "app", "password": "a\nb"}, "contains a newline"),
    ],
)
def test_bad_secret_files_are_named_without_the_password(files: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        inputs.credentials_from_files("app", files)
    assert "a\nb" not in str(info.value)


def test_server_major() -> None:
    assert inputs.server_major("postgres (PostgreSQL) 16.15\n") == "16"
    assert inputs.server_major("postgres (PostgreSQL) 15.19 (Debian 15.19-1)") == "15"
    with pytest.raises(ValueError, match="cannot read a PostgreSQL version"):
        inputs.server_major("command not found")


def test_scram_verifier_format_and_proof() -> None:
    salt = bytes(range(16))
    verifier = scram_sha256_verifier("pencil", salt=salt, iterations=4096)
    method, rest = verifier.split("$", 1)
    iter_salt, keys = rest.split("$")
    iterations, salt_b64 = iter_salt.split(":")
    stored_b64, server_b64 = keys.split(":")
    assert (method, iterations) == ("SCRAM-SHA-256", "4096")
    assert base64.b64decode(salt_b64) == salt
    # Independent recomputation of StoredKey = H(HMAC(SaltedPassword, "Client Key")).
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", salt, 4096)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    assert base64.b64decode(stored_b64) == hashlib.sha256(client_key).digest()
    assert base64.b64decode(server_b64) == hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    assert "pencil" not in verifier


def test_scram_salts_differ() -> None:
    assert scram_sha256_verifier("pw") != scram_sha256_verifier("pw")
