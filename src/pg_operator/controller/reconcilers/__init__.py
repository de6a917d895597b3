"""The cluster reconciler's sub-reconcilers: one per capability.

A sub-reconciler owns one capability of a PostgresCluster (instances, credentials, storage, high
availability; TLS, the pooler, declared roles and major upgrades add theirs). Its types live in `api/`,
its pure builders of desired state in `specs/`, `orchestration/` or a package of its own; its module here
holds what it does during one reconcile (data-plane steps, create-only writes, follow-up writes) and what
it reports (a problem for the status and a Warning Event). The cluster reconciler
(`controller/reconcile.py`) runs every sub-reconciler through the same steps, in the order of its list,
and knows no capability by name beyond that list.

May import: `pg_operator.api`, `specs`, `orchestration`, `patroni`, `objects`, and the controller's
plumbing (`cache`, `kube_api`, `events`, `writes`, `cluster_memory` …). Never `controller.reconcile`,
`controller.operator` or the backup reconcilers (tests/unit/test_import_layers.py).

A sub-reconciler writes the cluster's objects only through `controller.writes` with the context's
`claims`: the snapshot it reads holds, at the cluster's names, only the cluster's own objects
(specs/ownership.py); a foreign object there is a conflict the reconcile reports, never written, adopted
or deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pg_operator import objects
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import CLUSTER_LABEL, ROLE_PRIMARY
from pg_operator.controller.cache import Snapshot
from pg_operator.controller.cluster_memory import ClusterKey, RemembersClusters
from pg_operator.controller.writes import Claims
from pg_operator.orchestration.instances import instances_from_pods, patroni_state

# (reason, message): what keeps the cluster from its desired state, for the status and a Warning Event.
Problem = tuple[str, str]
ObjectId = tuple[str, str, str]  # (apiVersion, kind, name)


@dataclass
class ReconcileContext:
    """What one reconcile over one cluster knows and has done so far; every sub-reconciler reads and adds to
    it."""

    body: dict[str, Any]  # the PostgresCluster as the cache holds it
    cluster: PostgresCluster  # its parsed, validated form
    snapshot: Snapshot  # the cluster's children and pods in the cache
    statefulset: Mapping[str, Any] | None
    # What the reconcile may write, and the foreign objects it met at the cluster's names (reconcile.py sets
    # them aside from the snapshot); by default none met yet.
    claims: Claims = field(default_factory=lambda: Claims("", ""))
    writes: int = 0
    problem: Problem | None = None  # the first one found is the one reported
    replicas: int | None = None  # a StatefulSet size to apply now instead of spec.replicas
    wanted: set[ObjectId] = field(default_factory=set)  # children the reconcile keeps; the rest is deleted
    # Come back after this many seconds even if nothing changes (a step waits on something no watch
    # event announces, e.g. an instance reloading a rotated password).
    requeue_after: float | None = None
    # Set first, by the lifecycle sub-reconciler: the instances told to stop PostgreSQL (fenced, or for a
    # hibernation) and whether a hibernation or a wake is under way or done. The other sub-reconcilers
    # stand aside on a hibernating cluster (no rollout, upgrade, replacement or stuck-pod report), and no
    # rollout or restart waits on an instance that is stopped on purpose.
    fenced: frozenset[str] = frozenset()
    hibernating: bool = False
    pooler_stopped: bool = False  # the pooler's Deployment is scaled to 0

    def __post_init__(self) -> None:
        if not self.claims.owner_uid:
            self.claims = Claims(self.cluster.namespace, self.cluster.uid)

    @property
    def namespace(self) -> str:
        return self.cluster.namespace

    @property
    def name(self) -> str:
        return self.cluster.name

    @property
    def key(self) -> ClusterKey:
        return (self.cluster.namespace, self.cluster.name)

    def again_in(self, seconds: float) -> None:
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)

    def report(self, problem: Problem | None) -> None:
        if problem is not None and self.problem is None:
            self.problem = problem

    def running_primary(self) -> str | None:
        """The primary as Patroni says it runs (its member data on the pod), ready and not going: the one
        pod a data-plane step may exec SQL on."""
        pods = [p for p in self.snapshot.of_kind("v1", "Pod") if objects.label(p, CLUSTER_LABEL) == self.name]
        by_name = {objects.name(pod): pod for pod in pods}
        for instance in instances_from_pods(pods):
            state = patroni_state(objects.meta(by_name[instance.name]))
            if (instance.role == ROLE_PRIMARY and instance.ready and not instance.terminating
                    and state.get("state") == "running"):  # fmt: skip
                return instance.name
        return None


class SubReconciler(RemembersClusters):
    """One capability's part of the cluster reconcile. Each hook is optional; a sub-reconciler overrides
    the ones it uses. The reconcile calls them in this order: `act`, `create`, `children` (then the
    writes, with `postpone` and `applied`), `follow_up`, `status`.

    What it remembers of a cluster between reconciles it holds in `ClusterMemory` attributes (or in helpers
    that are `RemembersClusters`): the cluster reconciler drops all of it when the cluster is gone
    (`forget`, controller/cluster_memory.py); a sub-reconciler never forgets by hand."""

    async def act(self, ctx: ReconcileContext) -> None:
        """Data-plane steps on the running cluster, before any child is written."""

    def children(self, ctx: ReconcileContext) -> list[dict[str, Any]]:
        """Desired child objects, server-side applied where they differ."""
        return []

    async def applied(
        self, ctx: ReconcileContext, desired: Mapping[str, Any], observed: Mapping[str, Any] | None
    ) -> int:
        """After one of this sub-reconciler's children was written: follow-up writes (Events) made."""
        return 0

    def postpone(
        self, ctx: ReconcileContext, desired: Mapping[str, Any], observed: Mapping[str, Any] | None
    ) -> bool:
        """Whether a child must wait (not be written) this reconcile."""
        return False

    async def create(self, ctx: ReconcileContext) -> int:
        """Create-only children, sent with the first wave of writes; returns the writes made."""
        return 0

    async def follow_up(self, ctx: ReconcileContext) -> int:
        """Writes that follow the children (e.g. growing volumes); returns the writes made."""
        return 0

    def status(self, ctx: ReconcileContext, status: dict[str, Any]) -> None:
        """The sub-reconciler's own fields and conditions, added to the status the reconcile computed."""
