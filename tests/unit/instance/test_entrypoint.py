"""The entrypoint's shell on real files in a temporary directory (no Patroni, no PostgreSQL)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from pg_operator.api.instance_config import InstanceConfig
from pg_operator.instance import main
from pg_operator.tls_files import LOADED_TAG, TLS_FILES
from pg_operator.tls_files import digest as tls_digest

PASSWORDS = {
    "superuser": "su-pw-0123456789",
    "replication": "repl-pw-0123456789",
    "app": "app-pw-0123456789",
    "patroni-api": "api-pw-0123456789",
}
USERS = {"superuser": "postgres", "replication": "replicator", "app": "app", "patroni-api": "patroni"}


def pod_files(tmp_path: Path) -> dict[str, str]:
    settings = InstanceConfig.model_validate(
        {
            "cluster": "orders-db",
            "namespace": "shop",
            "pgMajor": "16",
            "postgresql": {"parameters": {"work_mem": "8MB"}, "allowedCIDRs": ["10.244.0.0/16"]},
            "bootstrap": {"database": "app", "owner": "app"},
            "synchronous": {"number": 0, "dataDurability": "required"},
            "patroni": {"ttl": 20, "loopWait": 2, "retryTimeout": 5},
        }
    )
    (tmp_path / "instance.yaml").write_text(settings.to_yaml())
    for role, password in PASSWORDS.items():
        (tmp_path / "secrets" / role).mkdir(parents=True)
        (tmp_path / "secrets" / role / "username").write_text(USERS[role])
        (tmp_path / "secrets" / role / "password").write_text(password + "\n")
    (tmp_path / "tls").mkdir()
    for name, content in (
        ("tls.crt", "CERT"),
        ("tls.key", "KEY"),
        ("ca.crt", "CA"),
        ("replication.crt", "CLIENT"),
        ("replication.key", "CLIENTKEY"),
        ("replication-ca.crt", "REPLCA"),
    ):
        (tmp_path / "tls" / name).write_text(content)
    return {
        "PGOP_TLS_DIR": str(tmp_path / "tls"),
        "PGOP_CLUSTER_NAME": "orders-db",
        "PGOP_NAMESPACE": "shop",
        "PGOP_POD_NAME": "orders-db-0",
        "PGOP_POD_IP": "10.244.0.9",
        "PGOP_PG_MAJOR": "16",
        "PGDATA": "/var/lib/postgresql/data/pgdata",
        "PGOP_CONFIG_FILE": str(tmp_path / "instance.yaml"),
        "PGOP_SECRETS_DIR": str(tmp_path / "secrets"),
        "PGOP_RUN_DIR": str(tmp_path / "run"),
    }


def test_render_prints_the_config_without_passwords(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in pod_files(tmp_path).items():
        monkeypatch.setenv(key, value)
    assert main.main(["render"]) == 0
    out = capsys.readouterr().out
    config = yaml.safe_load(out)
    assert config["scope"] == "orders-db"
    assert config["bootstrap"]["dcs"]["postgresql"]["parameters"]["work_mem"] == "8MB"
    assert config["postgresql"]["authentication"]["superuser"]["password"] == "<redacted>"
    for password in PASSWORDS.values():
        assert password not in out


def test_build_config_reads_secrets_and_trims_the_newline(tmp_path: Path) -> None:
    _, config = main.build_config(pod_files(tmp_path))
    assert config["postgresql"]["authentication"]["replication"] == {
        "username": "replicator",
        "password": PASSWORDS["replication"],
        "sslmode": "verify-full",
        "sslrootcert": f"{tmp_path}/run/tls/ca.crt",
        "sslcert": f"{tmp_path}/run/tls/replication.crt",
        "sslkey": f"{tmp_path}/run/tls/replication.key",
    }
    assert config["bootstrap"]["post_bootstrap"].endswith("-m pg_operator.instance post-bootstrap")


def test_errors_name_the_input_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = pod_files(tmp_path)
    (tmp_path / "secrets" / "app" / "password").unlink()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main.main(["render"]) == 2
    err = capsys.readouterr().err
    assert "secret app: cannot read" in err
    for password in PASSWORDS.values():
        assert password not in err


def test_bad_instance_yaml_names_the_field(tmp_path: Path) -> None:
    env = pod_files(tmp_path)
    text = (tmp_path / "instance.yaml").read_text().replace("ttl: 20", "ttl: 15")
    (tmp_path / "instance.yaml").write_text(text)
    with pytest.raises(ValueError, match=r"patroni\.ttl=15 is below the minimum 20"):
        main.build_config(env)
    (tmp_path / "instance.yaml").write_text("cluster: [")
    with pytest.raises(ValueError, match=r"instance\.yaml"):
        main.build_config(env)


def test_config_file_is_private_and_replaced_atomically(tmp_path: Path) -> None:
    path = tmp_path / "run" / "patroni.yml"
    main.write_private(path, "a: 1\n")
    main.write_private(path, "a: 2\n")
    assert path.read_text() == "a: 2\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert os.listdir(path.parent) == ["patroni.yml"]


def test_wrong_major_in_the_image_is_refused(tmp_path: Path) -> None:
    env = pod_files(tmp_path)
    fake = tmp_path / "bin" / "postgres"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'postgres (PostgreSQL) 15.19'\n")
    fake.chmod(0o755)
    pod, _ = main.build_config({**env, "PGOP_PG_BIN_DIR": str(fake.parent)})
    with pytest.raises(ValueError, match="this image holds PostgreSQL 15, but PGOP_PG_MAJOR=16"):
        main.check_server_major(pod)


def test_secrets_digests_change_with_a_rotated_password_and_hold_no_password(tmp_path: Path) -> None:
    env = pod_files(tmp_path)
    dirs = (env["PGOP_SECRETS_DIR"], env["PGOP_TLS_DIR"])
    before = main.secrets_digests(*dirs)
    assert set(before) == {*PASSWORDS, "tls"} and main.secrets_digests(*dirs) == before
    assert not any(p in d for p in PASSWORDS.values() for d in before.values())
    (tmp_path / "secrets" / "replication" / "password").write_text("rotated-0123456789")
    after = main.secrets_digests(*dirs)
    assert [role for role in after if after[role] != before[role]] == ["replication"]
    (tmp_path / "secrets" / "app" / "password").unlink()  # mid-rewrite by the kubelet: a change, no error
    assert main.secrets_digests(*dirs)["app"] != after["app"]
    (tmp_path / "tls" / "tls.crt").write_text("renewed")
    assert main.secrets_digests(*dirs)["tls"] != after["tls"]


def test_the_key_is_copied_private_and_a_missing_file_is_named(tmp_path: Path) -> None:
    env = pod_files(tmp_path)
    pod = main.pod_environment(env)
    loaded = main.install_tls(pod)
    # The digest names exactly the installed files, as the operator computes it from the Secret's keys.
    assert loaded == tls_digest([b"CERT", b"KEY", b"CA", b"CLIENT", b"CLIENTKEY", b"REPLCA"])
    (tmp_path / "tls" / "ca.crt").write_text("CA-BUNDLE")
    assert main.install_tls(pod) != loaded
    _, config = main.build_config(env, loaded)
    assert config["tags"][LOADED_TAG] == loaded
    # Each version of the files has its own path in the config (so Patroni re-reads the REST API's
    # certificate on the reload that publishes it); the two newest versions are kept.
    assert config["restapi"]["certfile"] == f"{tmp_path}/run/tls/{loaded}/tls.crt"
    # PostgreSQL accepts client certificates from the replication CA only; peers are verified with ca.crt.
    parameters = config["postgresql"]["parameters"]
    assert parameters["ssl_ca_file"] == f"{tmp_path}/run/tls/{loaded}/replication-ca.crt"
    assert config["restapi"]["cafile"] == f"{tmp_path}/run/tls/{loaded}/ca.crt"
    (tmp_path / "tls" / "ca.crt").write_text("CA-BUNDLE-2")
    newest = main.install_tls(pod)
    versions = sorted(d.name for d in (tmp_path / "run" / "tls").iterdir() if d.is_dir())
    assert newest in versions and loaded not in versions and len(versions) == 2
    assert (tmp_path / "run" / "tls" / "ca.crt").read_text() == "CA-BUNDLE-2"  # the stable copy
    for name, content in (("tls.key", "KEY"), ("replication.key", "CLIENTKEY")):
        key = tmp_path / "run" / "tls" / name
        assert key.read_text() == content and stat.S_IMODE(key.stat().st_mode) == 0o600
    (tmp_path / "tls" / "ca.crt").unlink()
    with pytest.raises(ValueError, match=r"TLS: cannot read .*/tls/ca.crt \(Secret <cluster>-server-tls\)"):
        main.install_tls(pod)


def test_the_tls_files_are_read_from_one_version_of_the_secret_volume(tmp_path: Path) -> None:
    env = pod_files(tmp_path)
    pod = main.pod_environment(env)
    tls = tmp_path / "tls"
    # The kubelet's layout: a directory per version, `..data` pointing at the current one, and the
    # names at the top linking through `..data`.
    for version, key in (("..v1", "KEY"), ("..v2", "KEY-2")):
        (tls / version).mkdir()
        for name in TLS_FILES:
            (tls / version / name).write_text((tls / name).read_text())
        (tls / version / "tls.key").write_text(key)
    (tls / "..data").symlink_to("..v1")
    for name in TLS_FILES:
        (tls / name).unlink()
        (tls / name).symlink_to(Path("..data") / name)
    assert main.volume_version(str(tls)) == (tls / "..v1").resolve()
    assert main.install_tls(pod) == tls_digest([b"CERT", b"KEY", b"CA", b"CLIENT", b"CLIENTKEY", b"REPLCA"])
    (tls / "..data").unlink()
    (tls / "..data").symlink_to("..v2")  # the swap
    assert main.install_tls(pod) == tls_digest([b"CERT", b"KEY-2", b"CA", b"CLIENT", b"CLIENTKEY", b"REPLCA"])
    assert main.volume_version(str(tmp_path / "run")) == tmp_path / "run"  # not a Secret volume


def test_only_a_running_primary_counts_as_serving(tmp_path: Path) -> None:
    assert not main.serving_as_primary(str(tmp_path))  # PostgreSQL stopped (a major upgrade stops it)
    (tmp_path / "postmaster.pid").write_text("42\n")
    assert main.serving_as_primary(str(tmp_path))
    (tmp_path / "standby.signal").write_text("")
    assert not main.serving_as_primary(str(tmp_path))  # a replica is in no read-write Service


def test_the_container_outlives_patroni_only_after_a_completed_requested_stop() -> None:
    # Deleted primary, Patroni handed over and exited cleanly: keep the address answering with resets.
    assert main.linger_seconds(True, 0) == main.STOP_LINGER_SECONDS > 0
    # Patroni crashed (no stop asked), or a replica or a stopped PostgreSQL was asked to stop: at once.
    assert main.linger_seconds(False, 0) == 0
    assert main.linger_seconds(False, 1) == 0
    # A stop that failed: nothing was handed over, nothing to wait for.
    assert main.linger_seconds(True, 1) == 0
    # The grace period leaves room for Patroni's own shutdown after the linger.
    from pg_operator.specs.statefulset import TERMINATION_GRACE_SECONDS

    assert main.STOP_LINGER_SECONDS <= TERMINATION_GRACE_SECONDS / 4
