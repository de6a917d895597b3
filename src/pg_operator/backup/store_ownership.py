"""Who owns a place in the object store (pure decisions; the controller does the reads and the write).

A cluster's prefix `<path>/<cluster name>/` does not carry the namespace, so two clusters can name the
same one: same-named clusters in two namespaces on one bucket and path, or a new cluster reusing the name
of one deleted with `onDelete: keep`. Sharing a prefix is never safe (retention and `onDelete: delete` of
one would remove the other's backups, WAL of one timeline would overwrite), so a prefix has one owner,
written down in a marker object inside it: the owning PostgresCluster's namespace, name and uid, written
once (a conditional create).

Before a cluster archives WAL or takes a base backup it must own its prefix: the marker names it (uid),
or the prefix is empty and it writes the marker, or (clusters that archived there before markers
existed) the prefix holds objects that the cluster's own records prove are its own and it adopts the
prefix. Anything else is refused: a marker of another cluster, or objects and no marker. Retention and
the store finalizer only ever touch a prefix whose marker names this cluster.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pg_operator import objects
from pg_operator.backup.barman import ObjectStore

# The marker's name inside the prefix. barman-cloud reads only `base/` and `wals/` below a server's
# prefix, so it never sees it.
MARKER_NAME = "pg-operator-owner.json"
MARKER_KIND = "PostgresClusterStorePrefix"


@dataclass(frozen=True)
class Owner:
    namespace: str
    name: str
    uid: str

    def describe(self) -> str:
        return f"PostgresCluster {self.namespace}/{self.name} (uid {self.uid})"


def owner_of(cluster: Mapping[str, Any]) -> Owner:
    meta = objects.meta(cluster)
    return Owner(objects.namespace(cluster), objects.name(cluster), str(meta.get("uid") or ""))


def marker_key(store: ObjectStore) -> str:
    return store.prefix + MARKER_NAME


def prefix_url(store: ObjectStore) -> str:
    """The prefix as users see it: s3://bucket/path/cluster/."""
    return f"s3://{store.bucket}/{store.prefix}"


def marker_body(owner: Owner, *, how: Literal["claimed", "adopted"], now: dt.datetime) -> bytes:
    return json.dumps(
        {
            "kind": MARKER_KIND,
            "namespace": owner.namespace,
            "name": owner.name,
            "uid": owner.uid,
            "how": how,
            "writtenAt": now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        sort_keys=True,
    ).encode()


class UnreadableMarker(ValueError):
    """A marker object that is not ours to read: it still means the prefix is taken."""


def parse_marker(data: bytes) -> Owner:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise UnreadableMarker("the marker is not JSON") from None
    if not isinstance(doc, dict) or doc.get("kind") != MARKER_KIND:
        raise UnreadableMarker(f"the marker's kind is not {MARKER_KIND}")
    fields = [doc.get(k) for k in ("namespace", "name", "uid")]
    if not all(isinstance(f, str) and f for f in fields):
        raise UnreadableMarker("the marker lacks namespace, name or uid")
    return Owner(*(str(f) for f in fields))


# --- proof from a cluster's own records (clusters that archived before markers existed) ---------------


@dataclass(frozen=True)
class Evidence:
    """A key prefix that, if the store has anything under it, proves the cluster wrote there."""

    key_prefix: str
    what: str


def _created(body: Mapping[str, Any]) -> str:
    return str(objects.meta(body).get("creationTimestamp") or "")


def _wal_key_prefix(store: ObjectStore, wal: str) -> str | None:
    # barman keeps segment <24 hex> under wals/<its first 16 hex>/, with a compression suffix.
    if len(wal) != 24 or any(c not in "0123456789ABCDEF" for c in wal):
        return None
    return f"{store.prefix}wals/{wal[:16]}/{wal}"


def adoption_evidence(
    cluster: Mapping[str, Any], backups: Sequence[Mapping[str, Any]], store: ObjectStore
) -> list[Evidence]:
    """What in the store would prove that this very cluster object (not an earlier one of its name) has
    been writing to `store`'s prefix:
    - a Completed Backup of the cluster, created after the cluster, that recorded this store
      (`status.serverName`, `status.destinationPath`): its base backup's directory;
    - the last archived segment the cluster's own status recorded (`status.backup.archiving`), if its
      status has no ownership verdict of its own yet (such figures are only from before markers).
    A status is per object, so a cluster recreated under the same name starts with none of this."""
    out: list[Evidence] = []
    created = _created(cluster)
    name = objects.name(cluster)
    for b in backups:
        st = objects.status(b)
        if (
            objects.spec(b).get("cluster") == name
            and st.get("phase") == "Completed"
            and st.get("backupID")
            and st.get("serverName") == store.server_name
            and st.get("destinationPath") == store.destination_url
            and _created(b) >= created
        ):
            out.append(Evidence(f"{store.prefix}base/{st['backupID']}/", f"Backup {objects.name(b)}"))
    archiving = (objects.status(cluster).get("backup") or {}).get("archiving") or {}
    wal = str(archiving.get("lastArchivedWAL") or "")
    key = _wal_key_prefix(store, wal)
    if key is not None:
        out.append(Evidence(key, f"WAL segment {wal} that this cluster archived"))
    return out


# --- the verdict ----------------------------------------------------------------------------------------

Kind = Literal["owned", "claim", "adopt", "owned-elsewhere", "not-empty"]
REASON_OWNED_ELSEWHERE = "StorePrefixOwnedElsewhere"
REASON_NOT_EMPTY = "StorePrefixNotEmpty"


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    reason: str
    message: str
    owner: Owner | None = None  # the owner found (for owned-elsewhere)

    @property
    def ours(self) -> bool:
        """This cluster may write (and delete) under the prefix (after writing the marker for claim and
        adopt)."""
        return self.kind in ("owned", "claim", "adopt")


def decide(
    me: Owner,
    store: ObjectStore,
    *,
    marker: Owner | None,
    marker_problem: str | None = None,
    has_objects: bool,
    proof: str | None = None,
) -> Verdict:
    """From what the store holds: the marker (parsed, or why it could not be), whether anything else is
    under the prefix, and the first piece of adoption evidence found there (None: none)."""
    where = prefix_url(store)
    if marker_problem is not None:
        return Verdict(
            "owned-elsewhere",
            REASON_OWNED_ELSEWHERE,
            f"store prefix {where} holds an ownership marker this cluster cannot read ({marker_problem}); "
            "not archiving there and taking no base backup",
        )
    if marker is not None:
        if marker.uid == me.uid:
            return Verdict("owned", "StorePrefixOwned", f"store prefix {where} is owned by this cluster")
        earlier = marker.namespace == me.namespace and marker.name == me.name
        whose = (
            f"an earlier cluster of the same name ({marker.describe()}), deleted with onDelete: keep"
            if earlier
            else marker.describe()
        )
        return Verdict(
            "owned-elsewhere",
            REASON_OWNED_ELSEWHERE,
            f"store prefix {where} is owned by {whose}; not archiving there and taking no base backup. "
            "Set a spec.backup.s3.path of this cluster's own (for example one that includes its namespace)",
            owner=marker,
        )
    if not has_objects:
        return Verdict(
            "claim", "StorePrefixClaimed", f"store prefix {where} was empty: claimed by this cluster"
        )
    if proof is not None:
        return Verdict(
            "adopt",
            "StorePrefixAdopted",
            f"store prefix {where} had objects and no ownership marker; adopted: {proof} is there",
        )
    return Verdict(
        "not-empty",
        REASON_NOT_EMPTY,
        f"store prefix {where} holds objects but no ownership marker, and nothing in this cluster's "
        "records shows it wrote them; not archiving there and taking no base backup. Set a "
        "spec.backup.s3.path of this cluster's own, or move those objects away",
    )


@dataclass(frozen=True)
class Deletion:
    kind: Literal["delete", "nothing", "leave"]
    reason: str
    message: str


def decide_deletion(
    me: Owner, store: ObjectStore, *, marker: Owner | None, marker_problem: str | None, has_objects: bool
) -> Deletion:
    """The store finalizer (`onDelete: delete`) and retention touch only a prefix whose marker names this
    cluster by uid; anything else is left as it is (reported), and the finalizer still lets the cluster
    go."""
    where = prefix_url(store)
    if marker_problem is None and marker is not None and marker.uid == me.uid:
        return Deletion("delete", "StorePrefixOwned", f"store prefix {where} is owned by this cluster")
    if marker_problem is None and marker is None and not has_objects:
        return Deletion("nothing", "StorePrefixEmpty", f"store prefix {where} is empty")
    if marker_problem is not None:
        found = f"an ownership marker this cluster cannot read ({marker_problem})"
    elif marker is not None:
        found = f"the ownership marker of {marker.describe()}"
    else:
        found = "objects but no ownership marker"
    return Deletion(
        "leave",
        "StorePrefixNotOurs",
        f"store prefix {where} holds {found}: its objects are not this cluster's and are left as they are",
    )
