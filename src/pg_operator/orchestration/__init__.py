"""Decisions that carry the on-call runbook: rollout order, switchover before scale-down, when a dead
primary's leader lock may be released, Patroni's dynamic configuration. Pure functions over observed
instances; the controller's high-availability sub-reconciler acts on them.

May import `api`, `objects`; never `specs` or `controller`.
"""
