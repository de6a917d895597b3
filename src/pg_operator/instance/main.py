"""The instance entrypoint's I/O shell: read the pod's inputs, render Patroni's config, exec Patroni.

    pg-operator-instance [run]            render <run dir>/patroni.yml (0600), run Patroni on it and reload
                                          it when the mounted Secrets change
    pg-operator-instance render           print the rendered config with passwords redacted
    pg-operator-instance post-bootstrap DSN   (Patroni calls this once after initdb or a restore)

Inputs (pod contract, docs/architecture.md): PGOP_CLUSTER_NAME, PGOP_NAMESPACE, PGOP_POD_NAME, PGOP_POD_IP,
PGOP_PG_MAJOR, PGDATA; /etc/pg-operator/config/instance.yaml (pg_operator.api.instance_config); the Secrets
in /etc/pg-operator/secrets/{superuser,replication,app,patroni-api}/{username,password}. For tests on one
host the paths move with PGOP_CONFIG_FILE, PGOP_SECRETS_DIR, PGOP_RUN_DIR (default /var/run/postgresql),
PGOP_PG_BIN_DIR (default /usr/lib/postgresql/current/bin), PGOP_BARMAN_BIN_DIR (default /opt/pg-operator/bin),
and PGOP_LISTEN_HOST binds PostgreSQL and the REST API to one address instead of all. barman-cloud's
credentials (AWS_*, PGOP_SOURCE_AWS_*) come from the pod's environment; Patroni and PostgreSQL inherit
them, and nothing here reads or logs them.

PID 1 is tini (images/postgres/recipe.sh): it forwards signals and reaps orphans. This process runs
Patroni as its child, passes every stopping signal on (Patroni stops PostgreSQL cleanly on SIGTERM) and
exits with Patroni's status.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from pg_operator.instance.fencing import Fence, stop_leftover_postgres
from pg_operator.instance.inputs import (
    SECRET_ROLES,
    Credentials,
    PodEnvironment,
    credentials_from_files,
    pod_environment,
    server_major,
    tls_files,
)
from pg_operator.instance.patroni_config import redacted, render_patroni_config
from pg_operator.tls_files import TLS_FILES
from pg_operator.tls_files import digest as tls_digest

PROG = "pg-operator-instance"
PATRONI_CONFIG_NAME = "patroni.yml"
# How often the mounted Secrets are compared (the kubelet itself refreshes them every sync period).
SECRETS_POLL_SECONDS = 2.0
# Signals that ask the pod to stop (the kubelet's SIGTERM on deletion), as opposed to SIGHUP (reload).
STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
# After a requested stop, how long the container outlives Patroni. Its Services keep routing to the pod
# for a moment after Patroni handed over (the EndpointSlice and kube-proxy follow the new primary's
# label within a second or two); while the container lives, the pod's address answers those
# connections with a reset, so clients fail at once and retry. Once the container exits, the kubelet
# removes the pod's network: the same connections then reach no host and hang until the client's
# connect timeout (measured: 2 s and 5 s stalls on a deleted primary, bench/results-failover.md).
STOP_LINGER_SECONDS = 5.0


def linger_seconds(stopped_as_primary: bool, exit_code: int) -> float:
    """How long to wait after Patroni exited before the container exits: only after a requested stop
    of a running primary that Patroni completed. A crash is restarted by the kubelet at once, a failed
    stop has nothing to hand over, and a replica or a stopped PostgreSQL (a major upgrade stops it before
    its pods are replaced) is in no read-write Service: lingering would only delay what follows."""
    return STOP_LINGER_SECONDS if stopped_as_primary and exit_code == 0 else 0.0


def serving_as_primary(pgdata: str) -> bool:
    """PostgreSQL runs here and not as a standby (Patroni writes standby.signal for every replica)."""
    data = Path(pgdata)
    try:
        return (data / "postmaster.pid").exists() and not (data / "standby.signal").exists()
    except OSError:  # asked in a signal handler: never keep the signal from reaching Patroni
        return False


def _log(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def read_instance_settings(path: str) -> dict[str, Any]:
    """instance.yaml, validated by the same model the operator writes it with."""
    from pg_operator.api.instance_config import InstanceConfig  # the one definition of its keys

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read the instance settings {path}: {e.strerror}") from None
    try:
        return InstanceConfig.from_yaml(text).model_dump(by_alias=True, mode="json")
    except (ValueError, yaml.YAMLError) as e:  # pydantic's ValidationError is a ValueError naming the field
        raise ValueError(f"{path}: {e}") from None


def read_credentials(secrets_dir: str) -> dict[str, Credentials]:
    result: dict[str, Credentials] = {}
    for role in SECRET_ROLES:
        files: dict[str, str] = {}
        for key in ("username", "password"):
            file = Path(secrets_dir, role, key)
            try:
                files[key] = file.read_text(encoding="utf-8")
            except OSError:
                raise ValueError(f"secret {role}: cannot read {file}") from None
        result[role] = credentials_from_files(role, files)
    return result


def check_server_major(pod: PodEnvironment) -> str:
    postgres = Path(pod.pg_bin_dir, "postgres")
    try:
        out = subprocess.run([str(postgres), "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise ValueError(f"cannot run {postgres} --version (PGOP_PG_BIN_DIR={pod.pg_bin_dir}): {e}") from None
    major = server_major(out)
    if major != pod.pg_major:
        raise ValueError(f"this image holds PostgreSQL {major}, but PGOP_PG_MAJOR={pod.pg_major}")
    return out.strip()


def os_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        raise ValueError(f"uid {os.getuid()} has no /etc/passwd entry (the image defines uid 999)") from None


def build_config(env: Mapping[str, str], tls_loaded: str = "") -> tuple[PodEnvironment, dict[str, Any]]:
    """`tls_loaded`: the digest of the TLS files installed for PostgreSQL, published as a Patroni tag."""
    pod = pod_environment(env)
    config = render_patroni_config(
        pod=pod,
        instance=read_instance_settings(pod.config_file),
        credentials=read_credentials(pod.secrets_dir),
        os_user=os_user(),
        post_bootstrap=f"{shlex.quote(sys.executable)} -m pg_operator.instance post-bootstrap",
        tls=tls_files(pod.run_dir, tls_loaded),
        tls_loaded=tls_loaded,
    )
    return pod, config


def volume_version(directory: str) -> Path:
    """Where a Secret volume's files are for one version of the Secret. The kubelet writes each version
    into a directory of its own and then swaps the `..data` link to it; reading the files through the
    names at the top could mix two versions (a new certificate with the old key) when the swap comes
    between two reads, and that mix would be installed for good."""
    data = Path(directory, "..data")
    return data.resolve() if data.is_symlink() else Path(directory)


def install_tls(pod: PodEnvironment) -> str:
    """Copy the mounted certificates, keys and CA bundle to where PostgreSQL reads them, private to this
    user (PostgreSQL refuses a key file that others may read; a Secret volume's files belong to root).
    Returns the digest of what was installed (tls_files.digest), read once so it names exactly that."""
    contents: list[str] = []
    version_dir = volume_version(pod.tls_dir)
    for name in TLS_FILES:
        source = version_dir / name
        try:
            contents.append(source.read_text(encoding="ascii"))
        except (OSError, UnicodeDecodeError):
            raise ValueError(f"TLS: cannot read {source} (Secret <cluster>-server-tls)") from None
    version = tls_digest(c.encode("ascii") for c in contents)
    for target in (tls_files(pod.run_dir), tls_files(pod.run_dir, version)):
        for dest, content in zip(target.paths(), contents, strict=True):
            write_private(Path(dest), content)
    # Keep this version and the one before it (a reload may still be reading it); drop older ones.
    tls_root = Path(pod.run_dir, "tls")
    versions = sorted((d for d in tls_root.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    for old in versions[:-2]:
        if old.name != version:
            shutil.rmtree(old, ignore_errors=True)
    return version


def write_private(path: Path, text: str) -> None:
    """Write atomically, readable by this user only (the file holds passwords)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for file in files:
        try:
            h.update(file.read_bytes())
        except OSError:
            h.update(b"\0missing")
        h.update(b"\0")
    return h.hexdigest()


def secrets_digests(secrets_dir: str, tls_dir: str) -> dict[str, str]:
    """A digest of each mounted Secret (never the values), to notice a change: the credentials by role,
    the server certificate as `tls`."""
    digests = {role: _digest([Path(secrets_dir, role, key) for key in ("username", "password")])
               for role in SECRET_ROLES}  # fmt: skip
    digests["tls"] = _digest([Path(tls_dir, name) for name in TLS_FILES])
    return digests


def run(env: Mapping[str, str]) -> int:
    """Render the config, run Patroni, and while it runs follow the mounted Secrets: the kubelet rewrites
    them when a Secret changes, and Patroni reloads a re-rendered config on SIGHUP (new replication,
    superuser and REST API passwords, a renewed certificate: no restart). While instance.yaml fences this
    instance, Patroni is stopped and the container stays (instance/fencing.py). Returns Patroni's exit
    status."""
    loaded = install_tls(pod_environment(env))
    pod, config = build_config(env, loaded)
    version = check_server_major(pod)
    path = Path(pod.run_dir, PATRONI_CONFIG_NAME)
    write_private(path, yaml.safe_dump(config, sort_keys=False))
    _log(f"{version}; member {pod.pod_name} of {pod.namespace}/{pod.cluster}; starting Patroni with {path}")
    start_monitor_role_keeper(pod)
    start_metrics(pod, env)
    start_archive_report(pod, env)
    fence = Fence(pod, env, int(read_instance_settings(pod.config_file)["patroni"]["port"]))
    patroni: list[subprocess.Popen[bytes]] = []  # the running Patroni, none while fenced
    stopping: list[bool] = []  # per stop signal: whether a primary was running when it came
    stop_asked = threading.Event()

    def forward(signum: int, _frame: object) -> None:
        if signum in STOPPING_SIGNALS:
            stopping.append(serving_as_primary(pod.pgdata))
            stop_asked.set()
        for child in patroni:
            child.send_signal(signum)

    for sig in (*STOPPING_SIGNALS, signal.SIGHUP):
        signal.signal(sig, forward)
    if fence.wanted:
        fence.stopped()
    else:
        fence.report.set(stopped=False)  # a report left by this pod's previous container
        patroni.append(subprocess.Popen([sys.executable, "-m", "patroni", str(path)]))
    seen = secrets_digests(pod.secrets_dir, pod.tls_dir)
    while True:
        if not patroni:  # fenced: only a stop signal or the end of the fencing changes anything
            if stop_asked.wait(SECRETS_POLL_SECONDS):
                fence.close()
                return 0
            if not fence.read():
                _log("unfenced: starting Patroni, which rejoins the cluster")
                fence.unfenced()
                loaded = install_tls(pod)
                _, config = build_config(env, loaded)
                write_private(path, yaml.safe_dump(config, sort_keys=False))
                seen = secrets_digests(pod.secrets_dir, pod.tls_dir)
                patroni.append(subprocess.Popen([sys.executable, "-m", "patroni", str(path)]))
            continue
        try:
            code = patroni[0].wait(timeout=SECRETS_POLL_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        else:
            patroni.clear()
            if fence.stopping and not stop_asked.is_set():
                stop_leftover_postgres(pod)
                fence.stopped()
                continue
            code = code if code >= 0 else 128 - code
            linger = linger_seconds(any(stopping), code)
            if linger:
                _log(
                    f"Patroni stopped; the pod's address keeps refusing connections for {linger:g} s "
                    "while its Services move on"
                )
                time.sleep(linger)
            return code
        if fence.read() and not fence.stopping:
            _log("fenced: stopping Patroni and PostgreSQL; the pod keeps running")
            fence.stopping = True
            patroni[0].send_signal(signal.SIGTERM)
            continue
        seen, loaded = follow_secrets(env, pod, path, patroni[0], seen, loaded)


def follow_secrets(env: Mapping[str, str], pod: PodEnvironment, path: Path, patroni: subprocess.Popen[bytes],
                   seen: dict[str, str], loaded: str) -> tuple[dict[str, str], str]:  # fmt: skip
    """When a mounted Secret changed: re-render the config and make Patroni reload it. Returns the digests
    and the TLS version now installed."""
    now = secrets_digests(pod.secrets_dir, pod.tls_dir)
    if now == seen:
        return seen, loaded
    changed = ", ".join(role for role in now if now[role] != seen[role])
    try:
        if now["tls"] != seen["tls"]:
            # Patroni's reload makes PostgreSQL read the new files, and publishes their digest.
            loaded = install_tls(pod)
        _, config = build_config(env, loaded)
    except ValueError as e:  # a half-written or broken Secret: keep what runs, try on the next change
        _log(f"the mounted Secrets changed ({changed}) but cannot be used: {e}")
    else:
        write_private(path, yaml.safe_dump(config, sort_keys=False))
        patroni.send_signal(signal.SIGHUP)
        _log(f"the mounted Secrets changed ({changed}): Patroni reloads its configuration")
    return now, loaded


def start_metrics(pod: PodEnvironment, env: Mapping[str, str]) -> None:
    """/metrics on PGOP_METRICS_PORT (default 9187, 0 = off), HTTPS with the server certificate."""
    from pg_operator.api.constants import (
        CUSTOM_QUERIES_FILE,
        CUSTOM_QUERIES_MOUNT,
        METRICS_PORT,
        MONITOR_ROLE,
    )
    from pg_operator.instance import metrics_server

    port = int(env.get("PGOP_METRICS_PORT") or METRICS_PORT)
    if port:
        tls = tls_files(pod.run_dir)
        pg_port = int(read_instance_settings(pod.config_file)["postgresql"]["port"])
        # The tenant's queries: their volume is there only when spec.monitoring.customQueries is set.
        mount = env.get("PGOP_CUSTOM_QUERIES_DIR") or CUSTOM_QUERIES_MOUNT
        custom_file = os.path.join(mount, CUSTOM_QUERIES_FILE) if os.path.isdir(mount) else None
        # Its own role, through its own peer map (patroni_config.pg_hba), never the superuser.
        metrics_server.start(
            socket_dir=pod.run_dir, pg_port=pg_port, login_user=MONITOR_ROLE,
            listen_host=pod.listen_host, port=port, cert=tls.cert, key=tls.key, custom_file=custom_file,
        )  # fmt: skip


def start_archive_report(pod: PodEnvironment, env: Mapping[str, str]) -> None:
    """The primary's archiving report in its pod's annotation (instance/archive_reporter.py); only in a
    pod (a service account and the API server's address), and not when PGOP_ARCHIVE_REPORT=0."""
    if not env.get("KUBERNETES_SERVICE_HOST") or env.get("PGOP_ARCHIVE_REPORT") == "0":
        return
    from pg_operator.instance import archive_reporter

    pg_port = int(read_instance_settings(pod.config_file)["postgresql"]["port"])
    archive_reporter.start(socket_dir=pod.run_dir, pg_port=pg_port, namespace=pod.namespace, pod=pod.pod_name)


def start_monitor_role_keeper(pod: PodEnvironment) -> None:
    """The monitoring role the archive reporter and /metrics log in as, created on the primary of a
    cluster bootstrapped before it existed (post_bootstrap creates it on new ones); a thread that ends
    once the role is there (instance/session_roles.py)."""
    from pg_operator.instance import session_roles

    pg_port = int(read_instance_settings(pod.config_file)["postgresql"]["port"])
    superuser = read_credentials(pod.secrets_dir)["superuser"].username  # the socket's peer map's role
    session_roles.start_keeper(socket_dir=pod.run_dir, pg_port=pg_port, superuser=superuser)


def post_bootstrap(env: Mapping[str, str], dsn: str) -> None:
    from pg_operator.instance.post_bootstrap import create_app_owner_and_database

    pod = pod_environment(env)
    settings = read_instance_settings(pod.config_file)
    app = read_credentials(pod.secrets_dir)["app"]
    database = str(settings["bootstrap"]["database"])
    # A restored cluster's catalog came with the source's roles and databases (docs/backups.md).
    restored = bool((settings.get("backup") or {}).get("recovery"))
    outcome = create_app_owner_and_database(dsn, app, database, restored=restored)
    _log(outcome.describe(app.username, database) + (" (restored from a backup)" if restored else ""))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="Render Patroni's configuration and run Patroni.")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("run", help="render the configuration and exec Patroni (the default)")
    sub.add_parser("render", help="print the configuration with passwords redacted")
    pb = sub.add_parser("post-bootstrap", help="create the application owner and database (Patroni runs it)")
    pb.add_argument("dsn", help="superuser connection string, appended by Patroni")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    try:
        if args.command == "render":
            _, config = build_config(env)
            print(yaml.safe_dump(redacted(config), sort_keys=False), end="")
        elif args.command == "post-bootstrap":
            post_bootstrap(env, args.dsn)
        else:
            return run(env)
    except ValueError as e:
        _log(f"error: {e}")
        return 2
    return 0
