"""Patroni settings the operator keeps in Patroni's dynamic configuration (the `<scope>-config` key).

`primary_start_timeout: 0` makes a primary whose PostgreSQL or whole container crashed hand over to a
healthy replica (in synchronous mode: only to the recorded synchronous standby) instead of recovering
in place. Without it, a primary whose container the kubelet restarts quickly takes its own leader key
back (the key still names it), and whether the cluster fails over depends on who is quicker: the
operator releasing the key, or the restarted Patroni renewing it. With it, the restarted Patroni
itself stops, releases the key and rejoins as a replica (pg_rewind); a single instance, with nobody to
hand over to, still recovers in place. The old process is dead (or its PostgreSQL is stopped), so no
second primary can exist while a replica is promoted.

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


def dynamic_config_patch(configmap: Mapping[str, Any] | None,
                         desired: Mapping[str, Any] = OPERATOR_DYNAMIC_SETTINGS) -> dict[str, Any] | None:
    """The body of a PATCH /config that brings Patroni's dynamic settings to `desired` (a JSON merge
    patch of only the keys that differ), or None when nothing differs or Patroni has not bootstrapped
    yet (then Patroni has no leader to ask, and its bootstrap copy may still come)."""
    current = dynamic_config(configmap)
    if current is None:
        return None
    patch = {key: value for key, value in desired.items() if current.get(key) != value}
    return patch or None
