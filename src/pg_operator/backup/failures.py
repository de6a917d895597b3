"""A failed barman-cloud call, turned into a (reason, message) pair fit for a condition or an Event.

barman-cloud exits non-zero (1-4) and logs one ERROR line naming the S3 error code or the connection
failure; the line is kept (without its timestamp and pid) so the user sees the store's own words, and
any secret value passed in is masked in case a tool ever echoes one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

MAX_MESSAGE = 512

# (reason, substrings of barman-cloud's output that mean it), checked in order.
_KNOWN: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "InvalidCredentials",
        ("SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied", "ExpiredToken",
         "InvalidToken", "Unable to locate credentials", "Forbidden"),
        "the object store refused the credentials (check the Secret's access key and secret key)",
    ),
    (
        "BucketNotFound",
        ("NoSuchBucket", "bucket does not exist"),
        "the bucket does not exist",
    ),
    (
        "EndpointUnreachable",
        ("Could not connect to the endpoint URL", "EndpointConnectionError", "Connect timeout",
         "Read timeout", "Name or service not known", "Connection refused"),
        "the object store endpoint cannot be reached",
    ),
    (
        "ArchiveNotEmpty",
        ("Expected empty archive", "WAL archive check failed"),
        "the destination already holds WAL of another cluster with this name; use another path",
    ),
    (
        "BackupNotFound",
        # barman's own wording, typo included: "Backup X for server Y does not exists".
        ("Cannot find any candidate backup", "Unknown backup", "does not exists"),
        "no base backup matches the recovery target",
    ),
)  # fmt: skip

_LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ \[\d+\] (ERROR|CRITICAL|WARNING): ")


@dataclass(frozen=True)
class Failure:
    reason: str  # CamelCase, for a condition's reason
    message: str  # one line, no secrets
    exit_status: int


def _error_lines(output: str) -> list[str]:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if " ERROR: " in ln or " CRITICAL: " in ln]
    return [_LOG_PREFIX.sub("", ln) for ln in (errors or lines[-1:])]


def mask(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<redacted>")
    return text


def classify(exit_status: int, output: str, *, secrets: Iterable[str] = ()) -> Failure:
    """What went wrong, from the exit status and the combined stdout/stderr of a barman-cloud call."""
    secrets = tuple(secrets)
    detail = mask(" | ".join(_error_lines(output)), secrets)
    reason, summary = next(
        ((r, text) for r, needles, text in _KNOWN if any(n in output for n in needles)),
        ("CommandFailed", "barman-cloud failed"),
    )
    message = f"{summary} (exit status {exit_status})"
    if detail:
        message += f": {detail}"
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    return Failure(reason=reason, message=message, exit_status=exit_status)
