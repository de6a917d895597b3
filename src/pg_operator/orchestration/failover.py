"""Fast failover where the primary's death is certain.

Patroni alone waits out the leader key's ttl after an unclean death, because a missed heartbeat could
be a slow primary. The kubelet knows better: when it reports the primary's database container as not
running, nothing can still write through it, so the operator may release the dead holder's leader key
and let the healthiest replica take over on Patroni's next loop instead of after the ttl.

Patroni's Kubernetes DCS (ConfigMaps mode) keeps the key as the `leader` annotation of the
`<scope>-leader` ConfigMap; replicas judge its validity by when they last saw it change, so removing
the annotation (with the observed resourceVersion as precondition, so a holder that renewed in the
meantime wins) is what makes them race for it at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pg_operator import objects
from pg_operator.orchestration.instances import Instance

LEADER_ANNOTATION = "leader"


def leader_configmap_name(scope: str) -> str:
    return f"{scope}-leader"


def leader_holder(configmap: Mapping[str, Any] | None) -> str | None:
    return objects.annotation(configmap, LEADER_ANNOTATION) or None


@dataclass(frozen=True)
class LockRelease:
    holder: str
    resource_version: str
    reason: str

    def patch(self) -> dict[str, Any]:
        """A merge patch that removes the key only if nobody touched the ConfigMap since we looked."""
        return {"metadata": {"resourceVersion": self.resource_version,
                             "annotations": {LEADER_ANNOTATION: None}}}


def sync_configmap_name(scope: str) -> str:
    return f"{scope}-sync"


def sync_standbys(sync_configmap: Mapping[str, Any] | None, leader: str) -> frozenset[str] | None:
    """The synchronous standbys Patroni recorded for `leader` in its `<scope>-sync` key: None when the
    key does not name this leader (asynchronous replication), an empty set when synchronous mode is
    active for it but no standby is recorded yet (right after bootstrap: then Patroni promotes nobody)."""
    annotations = objects.annotations(sync_configmap)
    if annotations.get("leader") != leader:
        return None
    return frozenset(n.strip() for n in str(annotations.get("sync_standby") or "").split(",") if n.strip())


def plan_lock_release(configmap: Mapping[str, Any] | None,
                      instances: Sequence[Instance],
                      sync_configmap: Mapping[str, Any] | None = None) -> LockRelease | None:
    """Release the leader key only when (1) its holder's database container is reported not running by
    the kubelet, and (2) a running replica that Patroni would promote can take over: with synchronous
    replication, only a recorded synchronous standby (Patroni promotes no other, so releasing for
    anyone else would only end the holder's own recovery early). Anything less certain is left to
    Patroni."""
    holder = leader_holder(configmap)
    if holder is None:
        return None
    owner = next((i for i in instances if i.name == holder), None)
    if owner is None or not owner.container_down or owner.terminating:
        # Gone from the API (maybe force-deleted while still running) or shutting down gracefully
        # (Patroni releases the key itself): not certain, so not ours to decide.
        return None
    allowed = sync_standbys(sync_configmap, holder)
    if not any(i.viable_replica and i.name != holder and (allowed is None or i.name in allowed)
               for i in instances):
        return None
    version = objects.resource_version(configmap)
    if not version:
        return None
    return LockRelease(holder=holder, resource_version=version,
                       reason=f"the kubelet reports {holder}'s database container as not running")
