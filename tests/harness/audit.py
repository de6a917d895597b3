"""What one user wrote, counted from the API server's audit log (JSON lines, stage ResponseComplete)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.operator_process import OPERATOR_USER
from harness.paths import STATE

AUDIT_LOG = Path(os.environ.get("PGOP_TEST_AUDIT_LOG") or STATE / "logs" / "audit.log")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclasses.dataclass(frozen=True)
class AuditMark:
    stamp: str  # UTC, as the audit log writes requestReceivedTimestamp
    inode: int
    size: int


class Audit:
    """Counts what one user wrote, from the API server's audit log (JSON lines, ResponseComplete)."""

    def __init__(self, path: Path = AUDIT_LOG, user: str = OPERATOR_USER) -> None:
        self.path = path
        self.user = user

    def mark(self) -> AuditMark:
        try:
            st = self.path.stat()
            inode, size = st.st_ino, st.st_size
        except FileNotFoundError:
            inode, size = 0, 0
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
        return AuditMark(stamp, inode, size)

    def _lines_since(self, mark: AuditMark) -> Iterator[bytes]:
        st = self.path.stat()
        if st.st_ino == mark.inode and st.st_size >= mark.size:
            with self.path.open("rb") as f:
                f.seek(mark.size)
                yield from f
            return
        # The API server rotated the log since the mark: read the rotated files written since, then the
        # current one, and keep what was received after the mark.
        rotated = sorted(
            p
            for p in self.path.parent.glob(f"{self.path.stem}-*{self.path.suffix}")
            if p.stat().st_mtime >= st.st_mtime - 86400
        )
        for path in [*rotated, self.path]:
            with path.open("rb") as f:
                yield from f

    def events_since(self, mark: AuditMark) -> Iterator[dict[str, Any]]:
        needle = self.user.encode()
        for raw in self._lines_since(mark):
            if needle not in raw:
                continue
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if (
                event.get("stage") == "ResponseComplete"
                and (event.get("user") or {}).get("username") == self.user
                and str(event.get("requestReceivedTimestamp", "")) >= mark.stamp
            ):
                yield event

    def requests_since(
        self, mark: AuditMark, *, include_leases: bool = False, namespace: str | None = None
    ) -> Counter[tuple[str, str]]:
        """(verb, resource[/subresource]) → count; the leader Lease's renewals are left out unless asked;
        with `namespace`, only requests about objects in it."""
        out: Counter[tuple[str, str]] = Counter()
        for event in self.events_since(mark):
            ref = event.get("objectRef") or {}
            if namespace is not None and ref.get("namespace") != namespace:
                continue
            resource = str(ref.get("resource") or event.get("requestURI"))
            if resource == "leases" and not include_leases:
                continue
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            out[(str(event.get("verb")), resource)] += 1
        return out

    def writes_since(self, mark: AuditMark, namespace: str | None = None) -> Counter[tuple[str, str]]:
        requests = self.requests_since(mark, namespace=namespace)
        return Counter({k: v for k, v in requests.items() if k[0] in WRITE_VERBS})

    def settled(self, quiet: float = 3.0, timeout: float = 60.0, namespace: str | None = None) -> AuditMark:
        """A mark taken once the user has written nothing for `quiet` seconds: the start of a steady
        state. The follow-up writes of a change (a status write, an Event) land within moments on a quiet
        machine and later on a loaded one; a user that never stops writing fails here, naming what."""
        deadline = time.monotonic() + timeout
        while True:
            mark = self.mark()
            time.sleep(quiet)
            writes = self.writes_since(mark, namespace)
            if not writes:
                return mark
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.user} kept writing for {timeout:.0f} s: {dict(writes)}")
