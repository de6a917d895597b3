"""A rolling restart asked for on the cluster (`kubectl pgc restart`), as pure decisions.

The request is the cluster annotation `db.example.com/restart-requested` holding a token (the plugin
writes the UTC time). An instance counts as restarted for it once its pod carries
`db.example.com/restarted-for` with the same token, which the operator writes after Patroni restarted
that member; the rest are treated as waiting for a restart, so the settings rollout
(rollout.plan_restart) restarts them: replicas one at a time, the primary last and in place. Once every
instance carries the token the request is answered (annotation cleared). A new token restarts all
again; a pod recreated meanwhile starts fresh and is restarted once more (harmless)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pg_operator import objects
from pg_operator.orchestration.instances import Instance

RESTART_ANNOTATION = "db.example.com/restart-requested"
RESTARTED_FOR_ANNOTATION = "db.example.com/restarted-for"
# What an instance waits for, as the rollout's messages name it ("restarting replica x to apply …").
REQUESTED = "the requested restart"


def _restarted(pods: Sequence[Mapping[str, Any]], token: str) -> set[str]:
    return {objects.name(p) for p in pods if objects.annotation(p, RESTARTED_FOR_ANNOTATION) == token}


def with_requested_restart(
    instances: Sequence[Instance], pods: Sequence[Mapping[str, Any]], token: str
) -> list[Instance]:
    """The instances, those not yet restarted for `token` marked as waiting for a restart (besides
    any settings Patroni already has them waiting for)."""
    done = _restarted(pods, token)
    return [
        i
        if i.name in done or i.terminating or REQUESTED in (i.pending_restart or ())
        else dataclasses.replace(i, pending_restart=(*(i.pending_restart or ()), REQUESTED))
        for i in instances
    ]


def restart_answered(instances: Sequence[Instance], pods: Sequence[Mapping[str, Any]], token: str) -> bool:
    """Every instance has been restarted for `token` (and there is at least one)."""
    live = [i for i in instances if not i.terminating]
    return bool(live) and {i.name for i in live} <= _restarted(pods, token)


def is_requested(instance: Instance) -> bool:
    """This instance's restart is the requested one (Patroni would refuse a restart_pending-only call
    when it has no setting waiting)."""
    return REQUESTED in (instance.pending_restart or ())


def restarted_patch(token: str) -> dict[str, Any]:
    """Merge patch of the pod once Patroni restarted it for `token`."""
    return {"metadata": {"annotations": {RESTARTED_FOR_ANNOTATION: token}}}
