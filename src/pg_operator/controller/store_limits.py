"""The operator's limits on calls to tenants' object stores (its flags, `backup.store_policy.StoreLimits`),
set once at start (`configure`) and read by the backup reconcilers' store calls and by the instances
sub-reconciler, which wires a store into the pods only where the limits allow it (plain HTTP). Plumbing:
both kinds of reconciler read it, neither imports the other."""

from __future__ import annotations

from pg_operator.backup.store_policy import StoreLimits

_limits = StoreLimits()


def configure(limits: StoreLimits) -> None:
    global _limits
    _limits = limits


def limits() -> StoreLimits:
    return _limits
