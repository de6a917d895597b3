"""Which PostgreSQL settings `spec.postgresql.parameters` may not hold, and why; the shape of names and
values. The one list: the CRD's CEL rules and the pydantic check are both generated from it (documented
for users in docs/parameters.md).

PostgreSQL compares setting names case-insensitively; the name rule admits lower case only, so the exact
lookups in CEL are enough and Python compares `name.lower()`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pg_operator.api.schema import rule

# The settings that make an instance follow a recovery (a restore, a standby's archive): set by the
# operator's restore (backup.recovery), never by the user, and removed from a restored
# postgresql.auto.conf.
RECOVERY_SETTINGS: tuple[str, ...] = (
    "recovery_target",
    "recovery_target_action",
    "recovery_target_inclusive",
    "recovery_target_lsn",
    "recovery_target_name",
    "recovery_target_time",
    "recovery_target_timeline",
    "recovery_target_xid",
    "restore_command",
)

# PostgreSQL settings that Patroni and the operator set themselves; a user value would break replication,
# failover, archiving or the pod layout. The archiving ones (backup.archiving.ARCHIVING_PARAMETERS) come
# from spec.backup: archiveTimeout, walMaxKeepSize.
OPERATOR_OWNED_PARAMETERS: tuple[str, ...] = (
    "archive_cleanup_command",
    "archive_command",
    "archive_library",
    "archive_mode",
    "archive_timeout",
    "cluster_name",
    "config_file",
    "data_directory",
    "external_pid_file",
    "hba_file",
    "hot_standby",
    "ident_file",
    "listen_addresses",
    "max_replication_slots",
    "max_slot_wal_keep_size",
    "max_wal_senders",
    "password_encryption",
    "port",
    "primary_conninfo",
    "primary_slot_name",
    "promote_trigger_file",
    "recovery_end_command",
    *RECOVERY_SETTINGS,
    # TLS: the operator's certificates, and no protocol older than TLS 1.2 (docs/tls.md).
    "ssl",
    "ssl_min_protocol_version",
    "synchronous_standby_names",
    "unix_socket_directories",
    "unix_socket_group",
    "unix_socket_permissions",
    "wal_level",
    "wal_log_hints",
)
OWNED_REASON = "is set by the operator and cannot be overridden"

# Settings no user may set at all, whoever owns the cluster: whoever can write the spec must not get to
# run programs as the postgres user, load code into the server or make it read or write files of their
# choosing (the pod's volumes hold the data and the credentials). What each one does, and so the reason
# its refusal gives after the name:
RUNS_A_PROGRAM = "runs a shell command on the server and cannot be set"
LOADS_CODE = "loads code into the server and cannot be set"
NAMES_A_FILE = "names a file or directory on the server and cannot be set"
WRITES_THE_LOG = "chooses where the server writes log files and cannot be set"
KEYS_ARE_UNENCRYPTED = "cannot be set: the operator's TLS keys have no passphrase"

REFUSED_PARAMETERS: dict[str, str] = {
    # A command line PostgreSQL runs through the shell (the other *_command settings are owned; any
    # further name ending in _command is caught by REFUSED_SUFFIXES).
    "ssl_passphrase_command": RUNS_A_PROGRAM,
    # Shared libraries loaded into the server or its backends, and where they are looked up (PostgreSQL
    # 18: OAuth validators and the search path of extension control files, which name their libraries).
    "shared_preload_libraries": LOADS_CODE,
    "session_preload_libraries": LOADS_CODE,
    "local_preload_libraries": LOADS_CODE,
    "dynamic_library_path": LOADS_CODE,
    "jit_provider": LOADS_CODE,
    "oauth_validator_libraries": LOADS_CODE,
    "extension_control_path": LOADS_CODE,
    # Files the server reads: configuration it would include, keys and certificates, a Kerberos keytab.
    "include": NAMES_A_FILE,
    "include_dir": NAMES_A_FILE,
    "include_if_exists": NAMES_A_FILE,
    "ssl_cert_file": NAMES_A_FILE,
    "ssl_key_file": NAMES_A_FILE,
    "ssl_ca_file": NAMES_A_FILE,
    "ssl_crl_file": NAMES_A_FILE,
    "ssl_crl_dir": NAMES_A_FILE,
    "ssl_dh_params_file": NAMES_A_FILE,
    "krb_server_keyfile": NAMES_A_FILE,
    # Where the server writes: log files (a directory inside PGDATA, or anywhere the postgres user may
    # write), the statistics directory of PostgreSQL 14 and older (an unknown name on 15 and later).
    "log_directory": WRITES_THE_LOG,
    "log_filename": WRITES_THE_LOG,
    "event_source": WRITES_THE_LOG,
    "stats_temp_directory": NAMES_A_FILE,
    # The passphrase command's companion means nothing without the command (the operator's keys have no
    # passphrase).
    "ssl_passphrase_command_supports_reload": KEYS_ARE_UNENCRYPTED,
}

# Name endings that mean the same whatever the setting (an extension's too, e.g. `myext.reload_command`):
# checked over every key, so a setting this list does not name yet is still refused.
REFUSED_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("_command", RUNS_A_PROGRAM),
    ("_libraries", LOADS_CODE),
    ("_file", NAMES_A_FILE),
    ("_directory", NAMES_A_FILE),
)

PARAMETER_NAME_PATTERN = r"^[a-z_][a-z0-9_]*([.][a-z_][a-z0-9_]*)?$"  # no backslash: it goes into CEL
# C0 control characters and DEL: a newline would end the postgresql.conf line Patroni writes and start
# another setting (`work_mem: "4MB\nshared_preload_libraries = x"`); the others have no place in a value.
CONTROL_CHARACTER_PATTERN = r"[\x00-\x1f\x7f]"
MAX_PARAMETERS = 128
MAX_PARAMETER_VALUE_LENGTH = 4096

_NAME_MESSAGE = (
    "postgresql.parameters: names are lower-case PostgreSQL setting names, e.g. shared_buffers "
    "or auto_explain.log_min_duration"
)
CONTROL_CHARACTER_REASON = (
    "must not contain control characters (newline, carriage return, tab, NUL, ...): a newline would start "
    "another setting in postgresql.conf"
)


def refusal_reason(name: str) -> str | None:
    """Why `name` cannot be set (the words after the name in the message), None when it can."""
    lowered = name.lower()
    if lowered in OPERATOR_OWNED_PARAMETERS:
        return OWNED_REASON
    if lowered in REFUSED_PARAMETERS:
        return REFUSED_PARAMETERS[lowered]
    for suffix, reason in REFUSED_SUFFIXES:
        if lowered.endswith(suffix):
            return reason
    return None


def parameter_problems(parameters: Mapping[str, str]) -> list[str]:
    """What is wrong with the user's parameters, one sentence per name, in name order (empty: nothing)."""
    problems = []
    for name in sorted(parameters):
        reason = refusal_reason(name)
        if reason is not None:
            problems.append(f"{name} {reason}")
        elif not re.fullmatch(PARAMETER_NAME_PATTERN, name):
            problems.append(f"{name!r} is not a PostgreSQL setting name")
        elif re.search(CONTROL_CHARACTER_PATTERN, parameters[name]):
            problems.append(f"{name} {CONTROL_CHARACTER_REASON}")
    return problems


# --- the CRD's rules ------------------------------------------------------------------------------------
# One key lookup per named parameter, each with its own message: the API server bounds a rule's estimated
# cost, and a message built from the user's keys (map keys have no declarable maximum length) exceeds it.
# The suffix rules iterate over the keys once each (as the name rule does) with a fixed message; names the
# lookups already refuse are left out of them, so a name gets one message.


def _cel_list(values: list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _lookup_rule(name: str, reason: str) -> dict[str, str]:
    return rule(
        f"!('{name}' in self)", f"postgresql.parameters: {name} {reason}", reason="FieldValueForbidden"
    )


def _suffix_rule(suffix: str, reason: str) -> dict[str, str]:
    named = sorted(n for n in (*OPERATOR_OWNED_PARAMETERS, *REFUSED_PARAMETERS) if n.endswith(suffix))
    exempt = f" || k in {_cel_list(named)}" if named else ""
    return rule(
        f"self.all(k, !k.endsWith('{suffix}'){exempt})",
        f"postgresql.parameters: a setting whose name ends in {suffix} {reason}",
        reason="FieldValueForbidden",
    )


PARAMETER_RULES: tuple[dict[str, str], ...] = (
    *(_lookup_rule(p, OWNED_REASON) for p in OPERATOR_OWNED_PARAMETERS),
    *(_lookup_rule(p, why) for p, why in REFUSED_PARAMETERS.items()),
    *(_suffix_rule(suffix, why) for suffix, why in REFUSED_SUFFIXES),
    rule(f"self.all(k, k.matches('{PARAMETER_NAME_PATTERN}'))", _NAME_MESSAGE),
)

# On each value (the error's path names the parameter: spec.postgresql.parameters[work_mem]). A raw CEL
# string, so the pattern's backslashes reach the regex engine as they are.
VALUE_RULES: tuple[dict[str, str], ...] = (
    rule(
        f"!self.matches(r'{CONTROL_CHARACTER_PATTERN}')",
        f"postgresql.parameters: a value {CONTROL_CHARACTER_REASON}",
    ),
)
