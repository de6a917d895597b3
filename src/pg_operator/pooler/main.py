"""`pg-operator-pooler`: the pooler pod's entrypoint and the commands the operator execs in it.

    run               render pgbouncer.ini, run PgBouncer, serve /metrics, resume a pause past its deadline
    point HOST [--resume]
                      send server connections to HOST from now on (rewrite, RELOAD, RECONNECT), then
                      RESUME if asked
    pause [SECONDS]   PAUSE: wait for running transactions, hold new ones; resumed by the watchdog after
                      SECONDS (default 30) whatever happens to the caller
    resume            RESUME (a pooler that is not paused is fine)
    show              the host pointed at and whether paused

Each command prints one line and exits 0, or prints why on stderr and exits 1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence

from pg_operator.pooler import metrics
from pg_operator.pooler.config import (
    AUTH_FILE,
    INI_FILE,
    PAUSE_DEADLINE_FILE,
    TARGET_FILE,
    ConfigError,
    Settings,
    check_target,
    render_auth_file,
    render_ini,
    settings_from_env,
)
from pg_operator.pooler.console import Console, ConsoleError
from pg_operator.pooler_contract import POOLER_METRICS_PORT
from pg_operator.tls_server import BoundedHttpsServer, Response

PGBOUNCER = os.environ.get("POOLER_PGBOUNCER", "/usr/sbin/pgbouncer")  # another path in tests only
DEFAULT_PAUSE_SECONDS = 30.0
MAX_PAUSE_SECONDS = 300.0
WATCH_SECONDS = 0.5
RELOAD_CHECK_SECONDS = 10.0


def _log(message: str) -> None:
    print(f"pg-operator-pooler: {message}", file=sys.stderr, flush=True)


def _write(path: str, text: str, mode: int = 0o600) -> None:
    """Atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def current_target(s: Settings) -> str:
    return (_read(s.path(TARGET_FILE)) or "").strip() or s.target


def _password(s: Settings) -> str:
    raw = _read(s.auth_password_file) if s.auth_password_file else None
    if raw is None:
        raise ConfigError(f"no password for {s.auth_user} in {s.auth_password_file or '(unset)'}")
    return raw[:-1] if raw.endswith("\n") else raw


def write_config(s: Settings, target: str) -> None:
    _write(s.path(AUTH_FILE), render_auth_file(s.auth_user, _password(s)))
    _write(s.path(INI_FILE), render_ini(s, target))


# --- the commands the operator execs --------------------------------------------------------------------


def point(s: Settings, host: str, *, then_resume: bool = False) -> str:
    host = check_target(host)
    write_config(s, host)
    _write(s.path(TARGET_FILE), host + "\n", 0o644)
    with Console(s.socket) as console:
        console.run("RELOAD")
        # Server connections to the previous host close as soon as they are released (all of them,
        # while paused); RECONNECT is PgBouncer's own word for it.
        console.run("RECONNECT")
        if then_resume:  # one exec after a switchover: the held queries go to the new primary at once
            result = console.query("RESUME")
            if result.error and "not paused" not in result.error:
                raise ConsoleError(f"RESUME: {result.error}")
    if then_resume:
        _unlink(s.path(PAUSE_DEADLINE_FILE))
        return f"pointed at {host}, resumed"
    return f"pointed at {host}"


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def pause(s: Settings, seconds: float) -> str:
    seconds = max(1.0, min(seconds, MAX_PAUSE_SECONDS))
    # The deadline first: if this process, the exec or the operator dies, the watchdog still resumes.
    _write(s.path(PAUSE_DEADLINE_FILE), f"{time.time() + seconds:.3f}\n", 0o644)
    started = time.monotonic()
    try:
        with Console(s.socket, timeout=seconds) as console:
            result = console.query("PAUSE")
            if result.error and "already" not in result.error:
                raise ConsoleError(f"PAUSE: {result.error}")
    except ConsoleError:
        _resume_quietly(s)
        raise
    return f"paused in {time.monotonic() - started:.3f}s"


def _resume_quietly(s: Settings) -> None:
    try:
        resume(s)
    except ConsoleError as exc:
        _log(f"resume after a failed pause: {exc}")


def resume(s: Settings) -> str:
    with Console(s.socket) as console:
        result = console.query("RESUME")
    _unlink(s.path(PAUSE_DEADLINE_FILE))
    if result.error and "not paused" not in result.error and "not suspended" not in result.error:
        raise ConsoleError(f"RESUME: {result.error}")
    return "resumed"


def show(s: Settings) -> str:
    with Console(s.socket) as console:
        console.run("SHOW VERSION")  # reachable
    return f"target={current_target(s)} paused={int(is_paused(s))}"


def is_paused(s: Settings) -> bool:
    """A global PAUSE shows nowhere in PgBouncer 1.18's console (no SHOW STATE): the deadline file the
    pause wrote, until a resume removes it, says so."""
    return os.path.exists(s.path(PAUSE_DEADLINE_FILE))


# --- run ------------------------------------------------------------------------------------------------


def scrape(s: Settings) -> str:
    try:
        with Console(s.socket, timeout=5) as console:
            pools = console.run("SHOW POOLS")
            stats = console.run("SHOW STATS")
    except ConsoleError:
        return metrics.render(up=False, target=current_target(s))
    return metrics.render(up=True, pools=pools, stats=stats, paused=is_paused(s), target=current_target(s))


def serve_metrics(s: Settings, port: int = POOLER_METRICS_PORT) -> BoundedHttpsServer:
    """/metrics over HTTPS from a daemon thread, connections capped and given deadlines
    (pg_operator.tls_server); the server is returned (its server_address holds the port)."""
    server = BoundedHttpsServer(("", port), lambda path: _metrics_answer(s, path), _MetricsTls(s))
    server.start("metrics")
    return server


def _metrics_answer(s: Settings, path: str) -> Response:
    if path.split("?")[0] != "/metrics":
        return Response(404, "text/plain; charset=utf-8", b"not found: the endpoint is /metrics\n")
    return Response(200, "text/plain; version=0.0.4; charset=utf-8", scrape(s).encode())


class _MetricsTls:
    """TLS (>= 1.2) with the certificate PgBouncer serves its clients (the mounted server Secret); a
    renewed one is taken up for the next connection (the kubelet swaps the volume's `..data`)."""

    def __init__(self, s: Settings) -> None:
        self.settings = s
        self._context: tuple[str, ssl.SSLContext] | None = None

    def __call__(self) -> ssl.SSLContext:
        version = _tls_version(self.settings)
        if self._context is None or self._context[0] != version:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            tls = self.settings.tls_dir
            context.load_cert_chain(os.path.join(tls, "tls.crt"), os.path.join(tls, "tls.key"))
            self._context = (version, context)
        return self._context[1]


def deadline_passed(text: str | None, now: float) -> bool:
    if text is None:
        return False
    try:
        return now >= float(text.strip())
    except ValueError:
        return True  # unreadable: never let it hold a pause


def _tls_version(s: Settings) -> str:
    try:
        return os.readlink(os.path.join(s.tls_dir, "..data"))
    except OSError:
        return ""


def run(s: Settings) -> int:
    os.makedirs(s.run_dir, exist_ok=True)
    write_config(s, current_target(s))
    child = subprocess.Popen([PGBOUNCER, s.path(INI_FILE)])
    _log(f"PgBouncer {child.pid} started, {s.side} side, pointing at {current_target(s)}")

    def stop(signum: int, _: object) -> None:
        # SIGINT is PgBouncer's safe shutdown: running transactions finish first.
        if child.poll() is None:
            child.send_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    serve_metrics(s)
    tls, password = _tls_version(s), _read(s.auth_password_file)
    checked = time.monotonic()
    while child.poll() is None:
        time.sleep(WATCH_SECONDS)
        if deadline_passed(_read(s.path(PAUSE_DEADLINE_FILE)), time.time()):
            _log("a pause outlived its deadline: resuming")
            _resume_quietly(s)
        if time.monotonic() - checked >= RELOAD_CHECK_SECONDS:
            checked = time.monotonic()
            now_tls, now_password = _tls_version(s), _read(s.auth_password_file)
            if (now_tls, now_password) != (tls, password):
                tls, password = now_tls, now_password
                try:
                    write_config(s, current_target(s))
                    with Console(s.socket) as console:
                        console.run("RELOAD")
                    _log("certificates or the auth password changed: reloaded")
                except (ConsoleError, ConfigError) as exc:
                    _log(f"reload failed: {exc}")
    _log(f"PgBouncer exited with {child.returncode}")
    return child.returncode or 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("run", "point", "pause", "resume", "show"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        s = settings_from_env(os.environ)
        command = args[0]
        if command == "run":
            return run(s)
        if command == "point":
            resume_too = "--resume" in args
            hosts = [a for a in args[1:] if a != "--resume"]
            if len(hosts) != 1:
                raise ConfigError("point takes one host (and --resume)")
            print(point(s, hosts[0], then_resume=resume_too), flush=True)
        elif command == "pause":
            print(pause(s, float(args[1]) if len(args) > 1 else DEFAULT_PAUSE_SECONDS), flush=True)
        elif command == "resume":
            print(resume(s), flush=True)
        else:
            print(show(s), flush=True)
    except (ConfigError, ConsoleError, ValueError, OSError) as exc:
        _log(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
