"""The scale bench of the reconcile loop (bench/bench_reconcile_scale.py is its entry point), by part:
clusters (the kind, creating and counting Ready ones, the role-label stand-in), volumes (pre-bound claims
and volumes), operator_half, floor (the same children created directly), restart (a fresh operator over
converged clusters), measure (RSS, CPU, progress lines). It imports the test harness (tests/harness)."""
