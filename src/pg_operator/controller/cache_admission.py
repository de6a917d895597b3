"""What the watch cache keeps of the objects carrying a cluster's label: what reconciling reads, no more.

The informers select Secrets, ConfigMaps, Pods and PVCs by the cluster label key, and a tenant may put
that label on anything it creates in its namespace. Kept as it came, 200 labelled Secrets of 512 KiB of
random data would stay in the operator's memory for as long as they exist. So each labelled object is
judged by what a reconcile of its cluster reads:

- Secrets: held whole only under a name the cluster's reconcile reads: the operator's own (credentials,
  TLS, the pooler's, the declared roles' generated ones) and those the spec names (password Secrets,
  `spec.tls` Secrets, the backup credentials, a restore's source credentials). A name is unique in a
  namespace, so this is bounded by the spec. Any other Secret the cluster controls (a removed role's,
  say) is held as a stub of its identity, enough to hand it over or delete it; anything else is dropped.
- ConfigMaps: the instance ConfigMap and Patroni's four DCS ConfigMaps by name; others as for Secrets.
- PVCs: the data volumes of the StatefulSet's members by name.
- Pods: only those a StatefulSet controls under a member's name (orchestration/instance_pods.py decides,
  in each snapshot, which of them the cluster's own StatefulSet controls).

A stub costs a few hundred bytes whatever the object held; what is dropped costs nothing once the event
that brought it is handled.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pg_operator import objects
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.cluster_sections import MAX_REPLICAS
from pg_operator.api.constants import DATA_VOLUME, GROUP
from pg_operator.controller.keys import ClusterKey, owning_cluster_name
from pg_operator.orchestration.instance_pods import controller_reference, foreign_pod_message, may_be_instance
from pg_operator.orchestration.patroni_settings import config_configmap_name
from pg_operator.specs.pooler import auth_secret_name
from pg_operator.specs.roles import declared_roles, generates_secret, role_secret_name
from pg_operator.specs.secrets import secret_names
from pg_operator.specs.tls import tls_secret_names

log = logging.getLogger(__name__)


class Holding(enum.Enum):
    """How much of one watched object the cache keeps."""

    WHOLE = "whole"
    STUB = "stub"  # its identity only: name, uid, version, controller, the operator's labels
    DROPPED = "dropped"


@dataclass(frozen=True)
class SecretReads:
    """The Secrets one cluster's reconcile reads, by name, as of one generation of its spec."""

    generation: int
    names: frozenset[str]


def secret_reads(cluster_body: Mapping[str, Any]) -> SecretReads:
    """The names of the Secrets a reconcile of this cluster reads. A spec that does not parse reads none:
    the reconcile refuses it before it reads a Secret, and its Secrets are read again once it parses."""
    generation = objects.generation(cluster_body)
    try:
        cluster = PostgresCluster.from_obj(cluster_body)
    except ValueError:
        return SecretReads(generation, frozenset())
    wanted = {*secret_names(cluster), *tls_secret_names(cluster), auth_secret_name(cluster)}
    tls = cluster.spec.tls
    wanted.update(name for name in (tls.ca_secret, tls.server_secret) if name)
    for role in declared_roles(cluster):
        if role.password_secret is not None:
            wanted.add(role.password_secret.name)
        elif generates_secret(role):
            wanted.add(role_secret_name(cluster, role.name))
    if cluster.spec.backup is not None:
        wanted.add(cluster.spec.backup.s3.credentials.secret_name)
    recovery = cluster.spec.bootstrap.recovery
    if recovery is not None:  # the source's store, which a restore reads
        wanted.add(recovery.source.s3.credentials.secret_name)
    imported = cluster.spec.bootstrap.import_
    if imported is not None:  # the import's source password: its label is checked before the Job is made
        wanted.add(imported.source.password_secret.name)
    return SecretReads(generation, frozenset(wanted))


# Patroni's DCS ConfigMaps beside `<scope>-config` (orchestration/failover.py reads -leader and -sync).
_DCS_SUFFIXES = ("leader", "failover", "sync")


def configmap_reads(cluster_name: str) -> frozenset[str]:
    """The ConfigMaps a reconcile reads: the instance ConfigMap and Patroni's DCS ConfigMaps."""
    dcs = [config_configmap_name(cluster_name), *(f"{cluster_name}-{s}" for s in _DCS_SUFFIXES)]
    return frozenset({f"{cluster_name}-instance", *dcs})


def data_volume_names(cluster_name: str) -> frozenset[str]:
    """The PVCs of the StatefulSet's members (`<volume>-<pod>`), every ordinal a cluster may have."""
    return frozenset(f"{DATA_VOLUME}-{cluster_name}-{ordinal}" for ordinal in range(MAX_REPLICAS))


def _controlled_by_cluster(body: Mapping[str, Any], key: ClusterKey) -> bool:
    return owning_cluster_name(body) == key[1]


def holding(body: Mapping[str, Any], key: ClusterKey, reads: SecretReads | None) -> Holding:
    """How much of a labelled object filed under `key` the cache keeps. `reads`: what the cluster's
    reconcile reads of Secrets (None while the cluster is not in the cache: nothing is read)."""
    kind = body.get("kind")
    name = objects.name(body)
    if kind == "Pod":
        return Holding.WHOLE if may_be_instance(body, key[1]) else Holding.DROPPED
    if kind == "Secret":
        read = reads is not None and name in reads.names
    elif kind == "ConfigMap":
        read = name in configmap_reads(key[1])
    elif kind == "PersistentVolumeClaim":
        read = name in data_volume_names(key[1])
    else:
        return Holding.WHOLE  # the other kinds are the cluster's children, selected by name when read
    if read:
        return Holding.WHOLE
    return Holding.STUB if _controlled_by_cluster(body, key) else Holding.DROPPED


# Labels a stub keeps: the operator's own (the cluster's, a role Secret's), at most this many.
_STUB_LABEL_PREFIXES = (f"{GROUP}/", "app.kubernetes.io/")
_STUB_LABELS = 8


def stub(body: Mapping[str, Any]) -> dict[str, Any]:
    """An object's identity, without its data and without the rest of its metadata: what deleting it or
    handing it over takes (name, uid, version, controller reference, the operator's labels)."""
    meta = objects.meta(body)
    identity = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp", "generation")
    kept: dict[str, Any] = {k: meta[k] for k in identity if k in meta}
    ref = controller_reference(body)
    if ref is not None:
        kept["ownerReferences"] = [{k: ref[k] for k in ("apiVersion", "kind", "name", "uid", "controller")
                                    if k in ref}]  # fmt: skip
    labels = [(k, v) for k, v in objects.labels(body).items() if k.startswith(_STUB_LABEL_PREFIXES)]
    kept["labels"] = dict(sorted(labels)[:_STUB_LABELS])
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "metadata": kept}


# Per cluster, at most this many names of dropped Secrets and of foreign pods are remembered: beyond it a
# newly read Secret is read by name whether or not one was dropped (a GET that may find nothing), and
# further foreign pods are only logged.
MAX_DROPPED_NAMES = 64
MAX_FOREIGN_PODS = 16
# Foreign pods logged once each; the memory of having logged them is emptied when it reaches this size.
MAX_WARNED = 4096


class Admissions:
    """The cache's judgement of the labelled objects, with what it needs to remember: per cluster, the
    Secrets its reconcile reads (as of its spec's generation), which Secrets were dropped or stubbed (to
    read them by name once the spec comes to read them), and the look-alike pods left out (for a
    Warning). Every set is bounded per cluster."""

    def __init__(self) -> None:
        self.reads: dict[ClusterKey, SecretReads] = {}
        self.stubs: set[str] = set()  # uids of the objects held as stubs
        self._dropped: dict[ClusterKey, set[str]] = {}
        self._overflowed: set[ClusterKey] = set()
        self._foreign: dict[ClusterKey, dict[str, str]] = {}  # uid -> pod name
        self._warned: set[str] = set()
        self._unread: dict[ClusterKey, set[str]] = {}

    def judge(self, body: Mapping[str, Any], key: ClusterKey) -> Holding:
        """How much of `body` (filed under `key`) to keep; a dropped one is remembered by name."""
        held = holding(body, key, self.reads.get(key))
        uid = objects.uid(body)
        if held is Holding.STUB:
            self.stubs.add(uid)
        else:
            self.stubs.discard(uid)
        if held is Holding.DROPPED:
            self._remember_dropped(body, key)
        return held

    def _remember_dropped(self, body: Mapping[str, Any], key: ClusterKey) -> None:
        kind, name, uid = body.get("kind"), objects.name(body), objects.uid(body)
        if kind == "Secret":
            dropped = self._dropped.setdefault(key, set())
            if name in dropped or len(dropped) < MAX_DROPPED_NAMES:
                dropped.add(name)
            else:
                self._overflowed.add(key)
        elif kind == "Pod":
            foreign = self._foreign.setdefault(key, {})
            if uid in foreign or len(foreign) < MAX_FOREIGN_PODS:
                foreign[uid] = name
            if uid not in self._warned:
                if len(self._warned) >= MAX_WARNED:
                    self._warned.clear()
                self._warned.add(uid)
                log.warning("%s/%s: %s", key[0], key[1], foreign_pod_message(name, key[1]))

    def forget(self, body: Mapping[str, Any], key: ClusterKey | None) -> None:
        """The object is gone (deleted, or no longer labelled for `key`)."""
        uid = objects.uid(body)
        self.stubs.discard(uid)
        if key is None:
            return
        if body.get("kind") == "Secret":
            self._dropped.get(key, set()).discard(objects.name(body))
        elif body.get("kind") == "Pod":
            self._foreign.get(key, {}).pop(uid, None)

    def foreign_pods(self, key: ClusterKey) -> set[str]:
        return set(self._foreign.get(key, {}).values())

    def cluster_seen(self, body: Mapping[str, Any], key: ClusterKey) -> SecretReads | None:
        """A cluster's new version: its Secret reads when they changed (the cache then files its Secrets
        again), else None. Parsed again only when the spec's generation moved."""
        before = self.reads.get(key)
        if before is not None and before.generation == objects.generation(body):
            return None
        after = secret_reads(body)
        self.reads[key] = after
        return after if before is None or after.names != before.names else None

    def cluster_gone(self, key: ClusterKey) -> None:
        for table in (self.reads, self._dropped, self._foreign, self._unread):
            table.pop(key, None)
        self._overflowed.discard(key)

    def secrets_refiled(
        self, key: ClusterKey, reads: SecretReads, whole: set[str], stubbed: set[str]
    ) -> None:
        """After a change of what the cluster reads: the Secrets it now reads but the cache does not hold
        whole, where one was left out (or may have been, past the remembered names), are to be read."""
        left_out = set(self._dropped.get(key, set())) | stubbed
        wanted = reads.names - whole
        unread = wanted if key in self._overflowed else wanted & left_out
        if unread:
            self._unread.setdefault(key, set()).update(unread)

    def take_unread(self, key: ClusterKey) -> frozenset[str]:
        """The Secrets to read by name for this cluster, once."""
        return frozenset(self._unread.pop(key, set()))
