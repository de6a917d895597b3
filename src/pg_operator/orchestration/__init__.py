"""Decisions that carry the on-call runbook: rollout order, switchover before scale-down, when a dead
primary's leader lock may be released. Pure functions over observed instances; the controller acts."""
