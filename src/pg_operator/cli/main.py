"""`pg-operator`: run the operator, or generate/check the manifests."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from pg_operator import images
from pg_operator.api.image_policy import AllowedRepositories
from pg_operator.cli.arguments import duration_between
from pg_operator.specs.network_policy import DEFAULT_MONITORING_NAMESPACE


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(fmt: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # One line per HTTP request from the client library: debug only.
    for name in ("httpx", "httpx2", "httpcore", "aiohttp.access"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))


def _port(value: str) -> int:
    port = int(value)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"port out of range: {value}")
    return port


_duration = duration_between(1, 7 * 86400)  # 1 s to 7 days


def _allowed_repositories(value: str) -> AllowedRepositories:
    try:
        return AllowedRepositories.parse(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _checked(check: Callable[[str, str], Any], flag: str) -> Callable[[str], Any]:
    """An argparse type from a checker of pg_operator.images: its ValueError becomes the flag's error."""

    def parse(value: str) -> Any:
        try:
            return check(value, flag)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


# Environment variables the image flags fall back to (a Deployment may set either).
ENV_POSTGRES_REPOSITORY = "PG_OPERATOR_POSTGRES_IMAGE_REPOSITORY"
ENV_POOLER_REPOSITORY = "PG_OPERATOR_POOLER_IMAGE_REPOSITORY"
ENV_POOLER_TAG = "PG_OPERATOR_POOLER_IMAGE_TAG"
ENV_PULL_SECRETS = "PG_OPERATOR_IMAGE_PULL_SECRETS"


def _add_image_flags(run: argparse.ArgumentParser) -> None:
    """Where the pods' images come from (pg_operator/images.py, docs/install.md)."""
    run.add_argument(
        "--postgres-image-repository",
        type=_checked(images.check_repository, "--postgres-image-repository"),
        default=os.environ.get(ENV_POSTGRES_REPOSITORY) or images.DEFAULT_POSTGRES_REPOSITORY,
        metavar="REPO",
        help="repository of the PostgreSQL images, tagged with the exact PostgreSQL version "
        f"(<REPO>:16.15); a cluster without spec.image runs these, and major upgrades move to them "
        f"(env {ENV_POSTGRES_REPOSITORY}; default {images.DEFAULT_POSTGRES_REPOSITORY})",
    )
    run.add_argument(
        "--pooler-image-repository",
        type=_checked(images.check_repository, "--pooler-image-repository"),
        default=os.environ.get(ENV_POOLER_REPOSITORY) or images.DEFAULT_POOLER_REPOSITORY,
        metavar="REPO",
        help="repository of the pooler's image, the operator's own image, which holds PgBouncer "
        f"(env {ENV_POOLER_REPOSITORY}; default {images.DEFAULT_POOLER_REPOSITORY})",
    )
    run.add_argument(
        "--pooler-image-tag",
        type=_checked(images.check_tag, "--pooler-image-tag"),
        default=os.environ.get(ENV_POOLER_TAG) or images.DEFAULT_POOLER_TAG,
        metavar="TAG",
        help=f"tag of the pooler's image (env {ENV_POOLER_TAG}; default {images.DEFAULT_POOLER_TAG}, "
        "this operator's version)",
    )
    run.add_argument(
        "--image-pull-secrets",
        type=_checked(images.parse_pull_secrets, "--image-pull-secrets"),
        default=os.environ.get(ENV_PULL_SECRETS, ""),  # a string default goes through `type` too
        metavar="NAMES",
        help="comma-separated names of Secrets (kubernetes.io/dockerconfigjson) put in the "
        "imagePullSecrets of every pod the operator makes; each must exist in every cluster's namespace "
        f"(env {ENV_PULL_SECRETS}; default none)",
    )


def image_options(args: argparse.Namespace) -> tuple[images.ImageSettings, AllowedRepositories]:
    """The image settings of `run`'s flags, and what spec.image may name: the flag's list, else the
    install's own PostgreSQL repository (so pinning one of its versions is never refused)."""
    settings = images.ImageSettings(
        postgres_repository=args.postgres_image_repository,
        pooler_repository=args.pooler_image_repository,
        pooler_tag=args.pooler_image_tag,
        pull_secrets=args.image_pull_secrets,
    )
    allowed = args.allowed_image_repositories or AllowedRepositories((settings.postgres_repository,))
    return settings, allowed


NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _namespace_or_none(value: str) -> str:
    """A namespace's name (a DNS label), or "" for none."""
    if value and not NAMESPACE_NAME.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"not a namespace name (lowercase letters, digits and '-', at most 63): {value!r}"
        )
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pg-operator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator (leader-elected)")
    run.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        dest="namespaces",
        metavar="NS",
        help="watch this namespace (repeatable); default: all namespaces",
    )
    run.add_argument(
        "--lease-namespace",
        default=None,
        help="namespace of the leader Lease (default: the pod's namespace, else pg-operator-system)",
    )
    run.add_argument("--lease-name", default="pg-operator-leader")
    run.add_argument("--lease-duration", type=int, default=15, help="seconds (default 15)")
    run.add_argument("--identity", default=None, help="leader identity (default: $POD_NAME, else host-pid)")
    run.add_argument("--bind-address", default="127.0.0.1", help="address of the HTTP endpoints")
    run.add_argument("--health-port", type=_port, default=8080, help="/healthz and /readyz")
    run.add_argument("--metrics-port", type=_port, default=8081, help="/metrics (Prometheus)")
    run.add_argument("--workers", type=int, default=16, help="clusters reconciled concurrently")
    run.add_argument(
        "--resync-seconds", type=float, default=300.0, help="periodic resync interval (jittered)"
    )
    run.add_argument(
        "--backup-retention-retry",
        type=_duration,
        default=600.0,
        metavar="DURATION",
        help="how long a cluster's failed backup retention waits before it is tried again (retention "
        "otherwise runs only when its outcome can change): seconds, or a number with s/m/h (default 10m)",
    )
    run.add_argument(
        "--ca-trust-period",
        type=_duration,
        default=90.0,
        metavar="DURATION",
        help="during a CA rotation, how long instances and clients trust both CAs before the new CA's "
        "certificates are served (applications reading ca.crt from a mounted Secret need the kubelet's "
        "delivery time): seconds, or a number with s/m/h (default 90s)",
    )
    # Calls to tenants' object stores (backup/store_policy.py StoreLimits).
    run.add_argument(
        "--store-call-timeout", type=_duration, default=30.0, metavar="DURATION",
        help="overall deadline of one call to a cluster's object store, every request of it included "
        "(a store that answers slowly is cut off there): seconds, or a number with s/m/h (default 30s)",
    )  # fmt: skip
    run.add_argument(
        "--store-listing-timeout", type=_duration, default=120.0, metavar="DURATION",
        help="overall deadline of one listing of a cluster's object store (default 2m)",
    )  # fmt: skip
    run.add_argument(
        "--store-listing-pages", type=int, default=100, metavar="N",
        help="pages of up to 1000 keys one listing reads before it stops for the pass (default 100)",
    )  # fmt: skip
    run.add_argument(
        "--allow-insecure-object-stores", action="store_true",
        help="let spec.backup endpoints be plain http:// (tests, on-premises stores); by default only "
        "https:// endpoints are called or given to the instances",
    )  # fmt: skip
    _add_image_flags(run)
    run.add_argument(
        "--allowed-image-repositories",
        type=_allowed_repositories,
        default=None,
        metavar="REPOS",
        help="comma-separated image repositories a cluster's spec.image may name; an entry ending in '/' "
        "admits every repository under it; a cluster naming another is refused (default: the "
        "--postgres-image-repository, the operator's own PostgreSQL images)",
    )
    run.add_argument(
        "--monitoring-namespace",
        type=_namespace_or_none,
        default=DEFAULT_MONITORING_NAMESPACE,
        metavar="NS",
        help="the namespace whose pods (a Prometheus) may scrape the instances' and poolers' metrics when a "
        "cluster's spec.networkPolicy.metricsFrom is unset; empty: only the operator and the cluster's own "
        f"pods (default: {DEFAULT_MONITORING_NAMESPACE})",
    )
    run.add_argument("--log-format", choices=("json", "text"), default="text")
    run.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")

    manifests = sub.add_parser("manifests", help="write the generated manifests (CRD) under deploy/")
    manifests.add_argument("--check", action="store_true", help="fail if the committed manifests differ")
    return parser


# `run` exits with this when a first contact finds nothing to wait for (the Lease's namespace missing).
EXIT_SETUP = 2


def _run(args: argparse.Namespace) -> int:
    from pg_operator.backup.store_policy import StoreLimits
    from pg_operator.controller.lease import LeaseNamespaceMissing
    from pg_operator.controller.operator import Options, default_identity, default_lease_namespace, run

    if args.store_listing_pages < 1:
        raise SystemExit("--store-listing-pages must be at least 1")
    if args.workers < 1:
        raise SystemExit("--workers must be at least 1")
    if not 2 <= args.lease_duration <= 15:
        raise SystemExit("--lease-duration must be between 2 and 15 seconds")
    setup_logging(args.log_format, args.log_level)
    image_settings, allowed = image_options(args)
    opts = Options(
        namespaces=list(dict.fromkeys(args.namespaces)),
        lease_namespace=args.lease_namespace or default_lease_namespace(),
        lease_name=args.lease_name,
        lease_duration=args.lease_duration,
        identity=args.identity or default_identity(),
        bind_address=args.bind_address,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        workers=args.workers,
        resync_seconds=args.resync_seconds,
        backup_retention_seconds=args.backup_retention_retry,
        allowed_image_repositories=allowed,
        images=image_settings,
        ca_trust_period_seconds=args.ca_trust_period,
        monitoring_namespace=args.monitoring_namespace,
        store_limits=StoreLimits(
            call_seconds=args.store_call_timeout,
            listing_seconds=args.store_listing_timeout,
            listing_pages=args.store_listing_pages,
            allow_insecure=args.allow_insecure_object_stores,
        ),
    )
    try:
        return asyncio.run(run(opts))
    except LeaseNamespaceMissing as exc:
        logging.getLogger("pg_operator").error("cannot start: %s", exc)
        return EXIT_SETUP


def _manifests(args: argparse.Namespace) -> int:
    from pg_operator.api.manifests import main as manifests_main

    return int(manifests_main(check=args.check) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    return _manifests(args)


if __name__ == "__main__":
    sys.exit(main())
