"""Desired state: pure functions from a cluster to the objects it needs, and its status. No I/O.

See docs/contracts.md (binding interfaces) and docs/helper-rules.md before changing this package.
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
