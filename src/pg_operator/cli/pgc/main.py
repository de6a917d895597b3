"""kubectl pgc: day-2 commands for PostgresClusters (status, switchover, restart, reload, backup, psql,
logs, certs). Run as `kubectl pgc COMMAND NAME [options]`; -n/--namespace, --context and --kubeconfig
work as in kubectl, before or after the command. Exit codes: 0 done, 1 failed (API error, unreachable),
2 bad arguments, 3 not found, 4 not ready / nothing to act on (status: the cluster is not Ready),
5 refused by the operator or timed out waiting."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pg_operator.cli.arguments import duration_between
from pg_operator.cli.pgc.errors import FAILED, PgcError

EPILOG = (
    "exit codes: 0 done; 1 failed (API error, unreachable); 2 bad arguments; 3 not found; "
    "4 not ready or nothing to act on; 5 refused by the operator, or --wait timed out"
)


# Seconds, or a number with s, m or h; positive.
duration = duration_between(0)


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return number


def _connection_flags() -> argparse.ArgumentParser:
    # SUPPRESS: a flag given before the command is not reset by the command's parser.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-n",
        "--namespace",
        default=argparse.SUPPRESS,
        help="namespace of the cluster (default: the context's, else default)",
    )
    common.add_argument("--context", default=argparse.SUPPRESS, help="kubeconfig context to use")
    common.add_argument(
        "--kubeconfig",
        default=argparse.SUPPRESS,
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _connection_flags()
    parser = argparse.ArgumentParser(prog="kubectl pgc", description=__doc__, parents=[common], epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_, parents=[common], epilog=EPILOG)
        p.add_argument("cluster", metavar="NAME", help="the PostgresCluster")
        return p

    status = command(
        "status",
        "one screen: instances, roles, lag, timeline, archiving, last backup, "
        "pending restarts and requests, conditions (exit 4 when not Ready)",
    )
    status.add_argument("-o", "--output", choices=("text", "json"), default="text")

    wait_help = "wait until the operator has answered (progress on stderr)"
    switchover = command("switchover", "ask the operator for a planned switchover to a replica")
    switchover.add_argument(
        "--to",
        default="auto",
        metavar="INSTANCE",
        help="the replica to promote (default: auto, the healthiest replica)",
    )
    switchover.add_argument("--wait", action="store_true", help=wait_help)
    switchover.add_argument("--timeout", type=duration, default=120.0, help="for --wait (default 120s)")

    restart = command(
        "restart",
        "ask the operator for a rolling restart of PostgreSQL: replicas one at a "
        "time, then the primary in place",
    )
    restart.add_argument("--wait", action="store_true", help=wait_help)
    restart.add_argument("--timeout", type=duration, default=600.0, help="for --wait (default 600s)")

    command("reload", "every running instance re-reads its configuration (pg_reload_conf)")

    backup = command("backup", "take a base backup now (creates a Backup resource)")
    backup.add_argument("--name", help="the Backup's name (default: NAME-<UTC time>)")
    backup.add_argument("--wait", action="store_true", help="wait until it is Completed or Failed (exit 5)")
    backup.add_argument("--timeout", type=duration, default=1800.0, help="for --wait (default 30m)")

    psql = command(
        "psql",
        "psql in an instance as the superuser over the local socket (no password "
        "leaves the pod); arguments after -- go to psql",
    )
    target = psql.add_mutually_exclusive_group()
    target.add_argument("--replica", action="store_true", help="the ready replica with the least lag")
    target.add_argument("--instance", metavar="POD", help="this instance, whatever its role")
    psql.add_argument("-d", "--dbname", default="postgres", help="database (default postgres)")

    logs = command("logs", "the database container's log of every instance, merged by time")
    logs.add_argument("-f", "--follow", action="store_true", help="keep streaming")
    logs.add_argument("--since", type=duration, help="only newer lines (e.g. 10m)")
    logs.add_argument("--tail", type=_positive, help="last lines of each instance")
    logs.add_argument("--instance", metavar="POD", help="one instance only")
    logs.add_argument("--timestamps", action="store_true", help="prefix each line with its timestamp")

    certs = command(
        "certs",
        "the cluster's CA and server certificates with their expiry (exit 4 when one expired or is missing)",
    )
    certs.add_argument("-o", "--output", choices=("text", "json"), default="text")
    return parser


def dispatch(args: argparse.Namespace, passed: Sequence[str] = ()) -> int:
    from pg_operator.cli.pgc import backup, certs, logs, requests, sql, status
    from pg_operator.cli.pgc.connection import connect

    conn = connect(
        getattr(args, "kubeconfig", None), getattr(args, "context", None), getattr(args, "namespace", None)
    )
    name = args.cluster
    if args.command == "status":
        return status.run(conn, name, args.output)
    if args.command == "switchover":
        return requests.switchover(conn, name, args.to, args.wait, args.timeout)
    if args.command == "restart":
        return requests.restart(conn, name, args.wait, args.timeout)
    if args.command == "reload":
        return sql.reload(conn, name)
    if args.command == "backup":
        return backup.run(conn, name, args.name, args.wait, args.timeout)
    if args.command == "psql":
        return sql.psql(
            conn, name, replica=args.replica, instance=args.instance, dbname=args.dbname, extra=passed
        )
    if args.command == "logs":
        return logs.run(
            conn,
            name,
            follow=args.follow,
            since=int(args.since) if args.since else None,
            tail=args.tail,
            instance=args.instance,
            timestamps=args.timestamps,
        )
    return certs.run(conn, name, args.output)


def split_passed(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Our arguments, and those after the first `--` (psql's)."""
    args = list(argv)
    if "--" not in args:
        return args, []
    at = args.index("--")
    return args[:at], args[at + 1 :]


def main(argv: Sequence[str] | None = None) -> int:
    ours, passed = split_passed(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(ours)
    if passed and args.command != "psql":
        parser.error(f"arguments after -- are for psql only: {' '.join(passed)}")
    try:
        return dispatch(args, passed)
    except PgcError as exc:
        print(f"kubectl pgc {args.command}: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # unreachable API server, TLS trouble, ...: one line, not a traceback
        print(f"kubectl pgc {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return FAILED


if __name__ == "__main__":
    sys.exit(main())
