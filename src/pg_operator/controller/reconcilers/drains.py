"""The drains and placement sub-reconciler: what the operator reports about the nodes its instances run on.

- Too few nodes: with a required anti-affinity (specs/placement.py) and fewer nodes admitting the
  instances than spec.replicas, Degraded `TooFewNodes`, naming how many nodes match, instead of a silent
  Pending pod. It says why for want of nodes; a pod stuck for any other reason the scheduler gives is the
  stuck-pod report's.
- A one-instance cluster whose node is being drained with spec.disruption.singleInstance: Block:
  Degraded `DrainBlocked`, saying what lets the drain go on.

The switchover away from a primary whose node is being drained is the high-availability
sub-reconciler's step (orchestration/drains.py decides it), so it shares the pooler's pause and Patroni's
view with every other switchover.

Without the grant to read Nodes (controller/nodes.py) the snapshot's nodes are None, the instances keep
one budget of minAvailable 1 (specs/pdb.py) and drains are not handled: a drain may then evict the
primary (a failover).
"""

from __future__ import annotations

from pg_operator import objects
from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.controller.reconcilers import ReconcileContext, SubReconciler
from pg_operator.orchestration.drains import draining_primary_node
from pg_operator.orchestration.instances import instances_from_pods
from pg_operator.specs import names
from pg_operator.specs.placement import too_few_nodes

TOO_FEW_NODES = "TooFewNodes"
DRAIN_BLOCKED = "DrainBlocked"


class DrainsReconciler(SubReconciler):
    async def act(self, ctx: ReconcileContext) -> None:
        nodes = ctx.snapshot.nodes
        if nodes is None:
            return
        short = too_few_nodes(ctx.cluster, ctx.statefulset, nodes)
        if short is not None:
            ctx.report((TOO_FEW_NODES, short))
        if ctx.cluster.spec.replicas == 1 and ctx.cluster.spec.disruption.single_instance == "Block":
            pods = [
                p for p in ctx.snapshot.of_kind("v1", "Pod") if objects.label(p, CLUSTER_LABEL) == ctx.name
            ]
            node = draining_primary_node(instances_from_pods(pods), pods, nodes)
            if node is not None:
                ctx.report(
                    (
                        DRAIN_BLOCKED,
                        f"node {node.name} is being drained and this one-instance cluster's budget "
                        f"{names.primary_pdb(ctx.cluster)} refuses the eviction "
                        "(spec.disruption.singleInstance: Block): scale up to switch over, set it to Evict, "
                        "or delete the pod to let the drain go on",
                    )
                )
