"""spec.hibernation and spec.fencedInstances: taking a whole cluster, or some of its instances, out of
service without losing anything (docs/lifecycle.md).

- `hibernation: true` stops PostgreSQL cleanly (replicas first, the primary last, so no failover is ever
  triggered), then every pod of the cluster and of its pooler; volumes, Secrets, Services and backups
  stay. Set back to false, the instance that was primary starts first and leads again.
- `fencedInstances` lists instances (or `*` for all) whose PostgreSQL must not run while their pods stay
  for inspection. A name must be an instance of this cluster (`<cluster>-<ordinal>`, ordinal below
  spec.replicas): the rule needs the cluster's name, so it sits at the CRD's root (FENCING_ROOT_RULES)
  and, for a bypassed schema, in the parsed cluster (`fencing_problems`).

A plain boolean for hibernation rather than an object: GitOps tools and `kubectl patch` flip one field,
and nothing about a hibernation needs tuning (what stops, and in which order, is the operator's call).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated

from pydantic import StringConstraints

from pg_operator.api.schema import rule

# Fence every instance of the cluster, whatever their number.
FENCE_ALL = "*"
# The most names the list holds: one per instance (api.cluster_sections.MAX_REPLICAS).
MAX_FENCED = 5
ORDINAL_PATTERN = r"^(0|[1-9][0-9]*)$"

FencedName = Annotated[str, StringConstraints(min_length=1, max_length=63)]

HIBERNATION_DESCRIPTION = (
    "Stop the cluster: PostgreSQL is shut down cleanly (replicas first, the primary last, no failover), "
    "then every pod of the cluster and its pooler is removed. Volumes, Secrets, Services and backups "
    "stay; scheduled backups pause. Set back to false, the same primary starts first and the replicas "
    "rejoin it (docs/lifecycle.md)."
)
FENCED_DESCRIPTION = (
    "Instances (pod names, or '*' for all) whose PostgreSQL is stopped while their pods keep running for "
    "inspection: kubectl exec works, the data directory is untouched, the pod is not ready. A fenced "
    "primary hands over to a healthy replica first; with none, writes stop until it is unfenced "
    "(docs/lifecycle.md)."
)

_NAMES = "self.spec.fencedInstances"
_SUFFIX = "n.substring(self.metadata.name.size() + 1)"
FENCING_ROOT_RULES: tuple[dict[str, str], ...] = (
    rule(
        f"!has({_NAMES}) || {_NAMES}.all(n, n == '{FENCE_ALL}' ? {_NAMES}.size() == 1 : "
        f"(n.startsWith(self.metadata.name + '-') && {_SUFFIX}.matches('{ORDINAL_PATTERN}') && "
        f"int({_SUFFIX}) < self.spec.replicas))",
        "spec.fencedInstances: each entry must be an instance of this cluster (<name>-<ordinal>, the ordinal "
        "below spec.replicas), or '*' alone for every instance",
        fieldPath=".spec.fencedInstances",
    ),
    rule(
        f"!has({_NAMES}) || {_NAMES}.all(n, {_NAMES}.exists_one(m, m == n))",
        "spec.fencedInstances: an instance is listed twice",
        fieldPath=".spec.fencedInstances",
    ),
)


def fencing_problems(cluster: str, replicas: int, fenced: Sequence[str]) -> list[str]:
    """What is wrong with spec.fencedInstances for a cluster of this name and size (the CEL rules' test)."""
    problems = []
    if FENCE_ALL in fenced and len(fenced) > 1:
        problems.append(f"spec.fencedInstances: '{FENCE_ALL}' fences every instance and must stand alone")
    for name in fenced:
        if name == FENCE_ALL:
            continue
        ordinal = name[len(cluster) + 1 :] if name.startswith(f"{cluster}-") else ""
        if not re.fullmatch(ORDINAL_PATTERN, ordinal) or int(ordinal) >= replicas:
            problems.append(
                f"spec.fencedInstances: {name!r} is not an instance of cluster {cluster!r} "
                f"({cluster}-0 to {cluster}-{replicas - 1}, or '{FENCE_ALL}')"
            )
    if len(set(fenced)) != len(fenced):
        problems.append("spec.fencedInstances: an instance is listed twice")
    return problems


def fenced_names(cluster: str, replicas: int, fenced: Sequence[str] | None) -> frozenset[str]:
    """The instances spec.fencedInstances names, with '*' expanded to every instance."""
    if not fenced:
        return frozenset()
    if FENCE_ALL in fenced:
        return frozenset(f"{cluster}-{i}" for i in range(replicas))
    return frozenset(fenced)
