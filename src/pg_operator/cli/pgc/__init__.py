"""`kubectl pgc`: the on-call engineer's command line for PostgresClusters (a kubectl plugin, installed
with the package as `kubectl-pgc`).

One module per command group: `status.py` (one screen of a cluster, `-o json`), `requests.py`
(switchover and rolling restart, asked of the operator through annotations on the cluster),
`sql.py` (`psql` into an instance, `reload` of every instance's configuration), `backup.py` (a `Backup`
resource), `logs.py` (every instance's log merged by time), `certs.py` (the cluster's CA and server
certificate). `connection.py` resolves `--kubeconfig`/`--context`/`-n` as kubectl does (kubectl passes
none of them to a plugin) and builds the `kubectl` command lines for what needs a terminal or exec;
`errors.py` holds the exit codes; `main.py` the parser.

API reads and writes go through lightkube; `psql`, `reload` (exec into pods) shell out to the `kubectl`
that runs the plugin. Imports `api` (names and constants) and `objects`; nothing imports it.
"""
