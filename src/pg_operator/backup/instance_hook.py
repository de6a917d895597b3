"""The instance's end of the `backup` section of instance.yaml (`backup.instance_section` is its format,
which the operator renders): the entrypoint lays it over the Patroni config it rendered (`apply`). Runs in
the instance pod only; the operator's builders never import it (tests/unit/test_import_layers.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pg_operator.backup.archive_gate import DEFAULT_GATE_DIR
from pg_operator.backup.archiving import ArchiveSettings, merge, patroni_fragment
from pg_operator.backup.barman import DEFAULT_BIN_DIR
from pg_operator.backup.instance_section import RecoveryPlan
from pg_operator.backup.recovery import patroni_bootstrap


def _run_dir(config: Mapping[str, Any]) -> str:
    parameters = (config.get("postgresql") or {}).get("parameters") or {}
    first = str(parameters.get("unix_socket_directories") or "").split(",")[0].strip()
    return first or DEFAULT_GATE_DIR


def apply(
    config: Mapping[str, Any],
    backup: Mapping[str, Any] | None,
    *,
    pgdata: str,
    bin_dir: str = DEFAULT_BIN_DIR,
) -> dict[str, Any]:
    """The Patroni config with archiving (parameters, replicas' restore_command) and, for a restore,
    the custom bootstrap method in place of initdb. Without a backup section: the config unchanged."""
    out = dict(config)
    if not backup:
        return out
    archive_data = backup.get("archive")
    archive = ArchiveSettings.from_mapping(archive_data, bin_dir=bin_dir) if archive_data else None
    if archive is not None:
        # archive_command waits behind the gate in the instance's run directory (its Unix socket
        # directory), which the operator opens once the cluster owns its store prefix.
        archive = replace(archive, gate_dir=_run_dir(out))
        out = merge(out, patroni_fragment(archive))
    recovery_data = backup.get("recovery")
    if recovery_data:
        plan = RecoveryPlan.from_mapping(recovery_data, bin_dir=bin_dir)
        bootstrap = {k: v for k, v in dict(out.get("bootstrap") or {}).items() if k != "initdb"}
        bootstrap.update(
            patroni_bootstrap(
                plan.source,
                plan.target,
                pgdata,
                archive.store if archive else None,
                session_token=plan.session_token,
            )
        )
        out["bootstrap"] = bootstrap
    return out
