"""Desired state: pure functions from a cluster to the objects it needs (RBAC, configuration,
Services, the StatefulSet and its pods, the disruption budget, Secrets), volume growth, and the
cluster's status. No I/O; equal input gives equal output.

May import `api`, `objects`, `images` and the capability packages whose pieces it wires into pods
(`backup`, `orchestration`); never `controller`.
"""

from pg_operator.specs.children import CHILD_KINDS, MANAGED_KINDS, desired_children
from pg_operator.specs.labels import child_labels, owner_reference, selector_labels
from pg_operator.specs.pvc import pvc_resizes
from pg_operator.specs.secrets import APP_SECRET_KEYS, ClusterPasswords, build_secrets, secret_names
from pg_operator.specs.status import compute_status

__all__ = [
    "APP_SECRET_KEYS",
    "CHILD_KINDS",
    "MANAGED_KINDS",
    "ClusterPasswords",
    "build_secrets",
    "child_labels",
    "compute_status",
    "desired_children",
    "owner_reference",
    "pvc_resizes",
    "secret_names",
    "selector_labels",
]
