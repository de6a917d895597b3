"""Who owns a cluster's store prefix, asked of the store from the operator process (boto3, the user's
credentials read for the call), decided by backup.store_ownership: the marker is read, an empty prefix
is claimed (conditional create) and a prefix the cluster's records prove it wrote is adopted.

Shared by the cluster's backup pass (archiving and retention) and the Backup reconciler (a base backup).
A verdict of "ours" is kept, per cluster uid, store and `spec.backup`, until something gives a reason to
doubt it, so a steady cluster costs no request at all (bench/results-backup-steady.md). It is asked again:
- when a base backup starts (the Backup reconciler asks with `fresh=True`): a scheduled cluster has its
  marker read once per backup, right before it writes to the prefix;
- when `spec.backup` changes (another store, path or credentials);
- when the cluster's archiving starts failing (`forget`): another cluster's WAL in the prefix makes
  barman-cloud-wal-archive refuse our segments;
A verdict is also recorded in the cluster's status (`status.backup.storeOwnership`: a digest of what it
holds for, the verdict, when), so a restarted operator trusts a recorded "owned" for an unchanged
`spec.backup` instead of asking every store at once. A marker taken away by hand is noticed at the
next of these. Any verdict other than "ours" is asked again on the next reconcile."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any

from pg_operator import objects
from pg_operator.api.backup import BackupConfiguration
from pg_operator.backup.barman import ObjectStore
from pg_operator.backup.scheduling import rfc3339
from pg_operator.backup.store_ownership import (
    Deletion,
    Owner,
    UnreadableMarker,
    Verdict,
    adoption_evidence,
    decide,
    decide_deletion,
    marker_body,
    marker_key,
    owner_of,
    parse_marker,
)
from pg_operator.backup.store_policy import (
    OwnershipRecord,
    OwnershipVerdict,
    recorded_ownership,
    store_identity,
    trusts_record,
)
from pg_operator.controller.cache import Cache
from pg_operator.controller.keys import ClusterKey
from pg_operator.controller.kube_api import Api
from pg_operator.controller.store_client import (
    StoreError,
    inspect_prefix,
    put_if_absent,
    store_access,
)

log = logging.getLogger(__name__)


def _read_marker(data: bytes | None) -> tuple[Owner | None, str | None]:
    if data is None:
        return None, None
    try:
        return parse_marker(data), None
    except UnreadableMarker as exc:
        return None, str(exc)


def _identity(cluster: Mapping[str, Any], store: ObjectStore) -> str:
    """What a verdict holds for: the cluster's uid, the store, and its `spec.backup` as written."""
    return store_identity(str(objects.meta(cluster).get("uid") or ""), store.endpoint_url, store.bucket,
                          store.prefix, objects.spec(cluster).get("backup"))  # fmt: skip


class StoreOwnership:
    def __init__(self, api: Api, cache: Cache, clock: Callable[[], dt.datetime]) -> None:
        self.api = api
        self.cache = cache
        self.clock = clock
        self._records: dict[ClusterKey, OwnershipRecord] = {}  # the last verdict asked, per cluster
        # Clusters whose recorded verdict an event put in doubt: asked again however it reads.
        self._doubted: set[ClusterKey] = set()

    def forget(self, key: ClusterKey) -> None:
        """The cluster's next check asks the store again (its recorded verdict is not trusted)."""
        self._records.pop(key, None)
        self._doubted.add(key)

    def drop(self, key: ClusterKey) -> None:
        """The cluster is gone."""
        self._records.pop(key, None)
        self._doubted.discard(key)

    def record(
        self, key: ClusterKey, cluster: Mapping[str, Any], store: ObjectStore
    ) -> OwnershipRecord | None:
        """The verdict to keep in `status.backup.storeOwnership`: the last one asked, else the one
        recorded, while it holds for the cluster's current store and `spec.backup`."""
        identity = _identity(cluster, store)
        record = self._records.get(key) or recorded_ownership(objects.status(cluster))
        return record if record is not None and record.identity == identity else None

    def _trusted(self, key: ClusterKey, cluster: Mapping[str, Any], identity: str) -> bool:
        if key in self._doubted:
            return False
        return trusts_record(self._records.get(key) or recorded_ownership(objects.status(cluster)), identity)

    async def check(
        self,
        cluster: Mapping[str, Any],
        config: BackupConfiguration,
        store: ObjectStore,
        *,
        fresh: bool = False,
    ) -> Verdict:
        """The verdict for archiving and base backups; a claim or adoption is written before it returns.
        `fresh` asks the store even when an owned verdict is kept. Raises StoreError when the store (or
        the credentials Secret) cannot answer."""
        key = (objects.namespace(cluster), objects.name(cluster))
        me = owner_of(cluster)
        identity = _identity(cluster, store)
        if not fresh and self._trusted(key, cluster, identity):
            return Verdict("owned", "StorePrefixOwned", "store prefix owned by this cluster (checked before)")
        if not me.uid:
            raise StoreError("the cluster has no uid yet")
        access = await store_access(self.api, me.namespace, config, store, cluster=me.name)
        evidence = adoption_evidence(cluster, self.cache.backups(key), store)
        contents = await inspect_prefix(access, marker_key(store), tuple(e.key_prefix for e in evidence))
        marker, problem = _read_marker(contents.marker)
        proof = evidence[contents.evidence_found].what if contents.evidence_found is not None else None
        verdict = decide(me, store, marker=marker, marker_problem=problem,
                         has_objects=contents.has_objects, proof=proof)  # fmt: skip
        if verdict.kind in ("claim", "adopt"):
            body = marker_body(me, how="claimed" if verdict.kind == "claim" else "adopted", now=self.clock())
            put = await put_if_absent(access, marker_key(store), body)
            if not put.conditional:
                log.warning(
                    "store of %s/%s refused a conditional create; wrote the marker after reading it "
                    "(read-check-write)", me.namespace, me.name,
                )  # fmt: skip
            marker, problem = _read_marker(put.read_back)
            if marker is None or marker.uid != me.uid:
                # Someone else's marker won the race (or the store lost ours): decide on what is there.
                verdict = decide(me, store, marker=marker, marker_problem=problem or (
                    None if marker is not None else "the marker vanished right after it was written"),
                    has_objects=True)  # fmt: skip
        said: OwnershipVerdict = "owned" if verdict.ours else "notOwned"
        self._records[key] = OwnershipRecord(identity, said, verdict.reason, rfc3339(self.clock()))
        self._doubted.discard(key)
        return verdict

    async def deletion(
        self, cluster: Mapping[str, Any], config: BackupConfiguration, store: ObjectStore
    ) -> Deletion:
        """For the store finalizer: always read afresh (never from the cache). Raises StoreError."""
        me = owner_of(cluster)
        access = await store_access(self.api, me.namespace, config, store, cluster=me.name)
        contents = await inspect_prefix(access, marker_key(store), ())
        marker, problem = _read_marker(contents.marker)
        return decide_deletion(me, store, marker=marker, marker_problem=problem,
                               has_objects=contents.has_objects or contents.marker is not None)  # fmt: skip
