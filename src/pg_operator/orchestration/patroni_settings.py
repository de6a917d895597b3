"""Patroni settings the operator keeps in Patroni's dynamic configuration (the `<scope>-config` key).

`primary_start_timeout: 0` makes a primary whose PostgreSQL or whole container crashed hand over to a
healthy replica (in synchronous mode: only to one of the recorded quorum voters) instead of recovering
in place. Without it, a primary whose container the kubelet restarts quickly takes its own leader key
back (the key still names it), and whether the cluster fails over depends on who is quicker: the
operator releasing the key, or the restarted Patroni renewing it. With it, the restarted Patroni
itself stops, releases the key and rejoins as a replica (pg_rewind); a single instance, with nobody to
hand over to, still recovers in place. The old process is dead (or its PostgreSQL is stopped), so no
second primary can exist while a replica is promoted.

The user's PostgreSQL parameters and synchronous replication live here too, not in each pod's local
Patroni config (which would override the dynamic one, so a later change would never reach a running
pod): Patroni applies a changed dynamic setting on every member by reload, and marks members
`pending_restart` when a setting needs a restart (orchestration.rollout.plan_restart restarts them).

Patroni reads the bootstrap copy of these settings only at initdb; the operator compares what the
config key holds (read from the watch cache, no request) and PATCHes Patroni's /config on the leader
only when something differs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

CONFIG_ANNOTATION = "config"

OPERATOR_DYNAMIC_SETTINGS: Mapping[str, Any] = {"primary_start_timeout": 0}

# Replication settings every cluster needs; Patroni takes these from the dynamic configuration only.
# wal_retrieve_retry_interval bounds how long a promotion can wait: a standby whose primary died retries
# streaming after each failure, and when the promote request arrives while it is (re)starting streaming,
# PostgreSQL notices it, shuts the WAL receiver down and then still sleeps out what is left of this
# interval since the last failure before it ends recovery (xlogrecovery.c, the XLOG_FROM_STREAM failure
# path). At PostgreSQL's 5 s default that cost a failover 4.8 s of a read-only "primary" already labelled
# for -rw (bench/results-failover.md); 1 s bounds it, for one retry a second while a primary is down.
# The user's own value wins (postgresql.parameters).
BASE_PARAMETERS: Mapping[str, str | int] = {
    "wal_level": "replica",
    "max_wal_senders": 10,
    "max_replication_slots": 10,
    "wal_retrieve_retry_interval": "1s",
}


def synchronous_settings(number: int, data_durability: str) -> dict[str, Any]:
    """`spec.synchronous` in Patroni's words. number 0 = asynchronous; "required" makes writes wait while
    fewer synchronous standbys are available (strict), "preferred" falls back to asynchronous.

    Quorum commit (`synchronous_standby_names = 'ANY n (every replica)'`), not one named standby: a
    commit waits for the first n replicas to confirm, whichever they are, so one slow or failed replica
    stalls nothing while another confirms; and after a crash every voter is a candidate and the most
    advanced one is promoted, so no other replica was ahead of the new timeline and none has to rewind
    before commits can be confirmed again (with one named standby, an asynchronous replica that had
    received more WAL than it must pg_rewind first, which held strict mode's commits for ~9 s:
    bench/results-failover.md, cause 5). The guarantee is the same: n replicas hold every commit.
    Quorum's own gap, a new leader that names only the previous voters (the dead primary among them)
    until its next loop, is closed by the operator waking that loop (orchestration.failover.plan_nudges;
    cause 6)."""
    if number == 0:
        return {"synchronous_mode": False, "synchronous_mode_strict": False}
    return {
        "synchronous_mode": "quorum",
        "synchronous_node_count": number,
        "synchronous_mode_strict": data_durability == "required",
    }


def desired_dynamic_settings(
    parameters: Mapping[str, str | int | float],
    sync_number: int,
    sync_durability: str,
    timing: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Everything the operator keeps in Patroni's dynamic configuration for one cluster: its own settings,
    Patroni's timing (ttl, loop_wait, retry_timeout), synchronous replication and
    `postgresql.parameters` (the base replication settings plus the user's). The same values seed
    `bootstrap.dcs` at initdb and are enforced afterwards."""
    return {
        **(timing or {}),
        **OPERATOR_DYNAMIC_SETTINGS,
        **synchronous_settings(sync_number, sync_durability),
        "postgresql": {"parameters": {**BASE_PARAMETERS, **parameters}},
    }


def _same(current: Any, desired: Any) -> bool:
    # Patroni keeps values as they were sent: 10 and "10" are the same setting.
    if isinstance(current, bool) or isinstance(desired, bool):
        return bool(current == desired)
    if isinstance(current, int | float | str) and isinstance(desired, int | float | str):
        return str(current) == str(desired)
    return bool(current == desired)


def config_configmap_name(scope: str) -> str:
    return f"{scope}-config"


def dynamic_config(configmap: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What Patroni keeps as its dynamic configuration, or None before the cluster was bootstrapped
    (no key, or a value that is not a JSON object)."""
    annotations = ((configmap or {}).get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(CONFIG_ANNOTATION)
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def dynamic_config_patch(
    configmap: Mapping[str, Any] | None, desired: Mapping[str, Any] = OPERATOR_DYNAMIC_SETTINGS
) -> dict[str, Any] | None:
    """The body of a PATCH /config that brings Patroni's dynamic settings to `desired` (a JSON merge
    patch of only the keys that differ), or None when nothing differs or Patroni has not bootstrapped
    yet (then Patroni has no leader to ask, and its bootstrap copy may still come).

    `postgresql.parameters` in `desired` is the whole set: a parameter Patroni holds that is not in it
    (the user removed it) is sent as null, which Patroni's merge removes, resetting it to its default.
    Other keys under `postgresql` (use_slots, use_pg_rewind, ...) are left as they are."""
    current = dynamic_config(configmap)
    if current is None:
        return None
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        if key == "postgresql" and isinstance(value, Mapping):
            section = _postgresql_patch(current.get("postgresql"), value)
            if section:
                patch["postgresql"] = section
        elif key not in current or not _same(current.get(key), value):
            patch[key] = value
    return patch or None


def _postgresql_patch(current: Any, desired: Mapping[str, Any]) -> dict[str, Any]:
    current = current if isinstance(current, Mapping) else {}
    out: dict[str, Any] = {}
    for key, value in desired.items():
        if key != "parameters" or not isinstance(value, Mapping):
            if key not in current or not _same(current.get(key), value):
                out[key] = value
            continue
        held = current.get("parameters")
        held = held if isinstance(held, Mapping) else {}
        params: dict[str, Any] = {
            name: v for name, v in value.items() if name not in held or not _same(held[name], v)
        }
        params.update({name: None for name in held if name not in value})
        if params:
            out["parameters"] = params
    return out


def changed_parameter_names(patch: Mapping[str, Any] | None) -> list[str]:
    """The PostgreSQL parameters a patch from dynamic_config_patch sets or removes, for the log and
    the Event (values are left out: a parameter may hold something the user considers sensitive)."""
    section = (patch or {}).get("postgresql")
    params = section.get("parameters") if isinstance(section, Mapping) else None
    return sorted(params) if isinstance(params, Mapping) else []
