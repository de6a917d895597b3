"""The files of Secret `<name>-server-tls` as an instance holds them, and the digest that names one version
of them. An instance publishes the digest of the files it loaded (a Patroni tag, which Patroni puts in the
pod's `status` annotation); the operator computes it from the Secret and so knows which instances run
which certificates and trusted authorities (a CA rotation waits on it). A leaf: the operator and the pod
share it, and it imports nothing of the package.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

# The server certificate and key, the CA certificates servers are verified with (one, or two during a CA
# rotation), the replication role's client certificate and key, and the only CAs whose client
# certificates PostgreSQL accepts (the cluster's replication CA).
TLS_FILES = ("tls.crt", "tls.key", "ca.crt", "replication.crt", "replication.key", "replication-ca.crt")
# The Patroni tag an instance publishes the digest of its loaded TLS files under.
LOADED_TAG = "pgop_tls"


def digest(contents: Iterable[bytes | None]) -> str:
    """A short digest of the files' contents in TLS_FILES order (None = missing)."""
    h = hashlib.sha256()
    for content in contents:
        h.update(b"\0missing" if content is None else content)
        h.update(b"\0")
    return h.hexdigest()[:16]
