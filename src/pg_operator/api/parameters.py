"""Which PostgreSQL settings `spec.postgresql.parameters` may not hold, and why; the shape of names and
values; the libraries a user may preload and pgaudit's settings. The one list: the CRD's CEL rules and the
pydantic check are both generated from it (documented for users in docs/parameters.md and
docs/extensions.md).

PostgreSQL compares setting names case-insensitively; the name rule admits lower case only, so the exact
lookups in CEL are enough and Python compares `name.lower()`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pg_operator.api.constants import MONITOR_ROLE, PATRONI_API_USER, REPLICATION_USER, SUPERUSER
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
    # shared_preload_libraries is the exception: admitted from PRELOADABLE_LIBRARIES (below).
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


# --- shared_preload_libraries: an allow-list ------------------------------------------------------------
PRELOAD_PARAMETER = "shared_preload_libraries"
# Libraries a user may preload: each ships in the operator's images (contrib, or built from Debian's
# source packages: images/postgres/extensions.lock) and is loaded by name, nothing else. The value is a
# comma-separated list of these names (no quotes, no paths); an empty value preloads nothing.
PRELOADABLE_LIBRARIES: tuple[str, ...] = ("auto_explain", "pg_prewarm", "pg_stat_statements", "pgaudit")
# Majors whose image lacks a library of the list (extensions.lock has no source for them): preloading it
# would keep PostgreSQL from starting, so the spec refuses it for that version.
MISSING_LIBRARIES: dict[str, tuple[str, ...]] = {"pgaudit": ("16", "17")}
PRELOAD_REASON = f"entries must be among {', '.join(PRELOADABLE_LIBRARIES)}, separated by commas"


def preload_entries(value: str) -> list[str]:
    """The libraries a shared_preload_libraries value names, as written (an empty value: none)."""
    if not value.strip():
        return []
    return [entry.strip() for entry in value.split(",")]


def preload_problems(value: str) -> list[str]:
    """One sentence per entry that is not on the allow-list (empty: the value is admitted)."""
    return [
        f"{PRELOAD_PARAMETER}: {entry!r} is not a library the operator allows preloading ({PRELOAD_REASON})"
        for entry in preload_entries(value)
        if entry not in PRELOADABLE_LIBRARIES
    ]


def missing_library_problems(parameters: Mapping[str, str], version: str) -> list[str]:
    """Preloaded libraries the image of PostgreSQL `version` does not ship."""
    entries = preload_entries(parameters.get(PRELOAD_PARAMETER, ""))
    return [
        f"postgresql.parameters: {PRELOAD_PARAMETER}: {library} is not in the image of PostgreSQL {version}"
        for library, majors in MISSING_LIBRARIES.items()
        if version in majors and library in entries
    ]


# Extensions whose library refuses to load unless preloaded (pgaudit's CREATE EXTENSION fails otherwise):
# a database may declare one only when shared_preload_libraries names it.
PRELOAD_ONLY_EXTENSIONS: tuple[str, ...] = ("pgaudit",)


def unpreloaded_extension_problems(parameters: Mapping[str, str], extensions: Iterable[str]) -> list[str]:
    """Declared extensions (spec.databases[].extensions) that need a preload the parameters lack."""
    entries = preload_entries(parameters.get(PRELOAD_PARAMETER, ""))
    return [
        f"databases: extension {ext} needs {ext} in postgresql.parameters.{PRELOAD_PARAMETER}"
        for ext in PRELOAD_ONLY_EXTENSIONS
        if ext in set(extensions) and ext not in entries
    ]


# --- pgaudit's settings ---------------------------------------------------------------------------------
# Each setting pgaudit defines, and what its value may be. pgaudit.role names a role whose privileges
# select what object audit logs: tenant input, so it must be a plain role name and not one of the
# operator's (a superuser passes every privilege check, so naming one would log every statement).
PGAUDIT_PREFIX = "pgaudit."
PGAUDIT_CLASSES: tuple[str, ...] = ("read", "write", "function", "role", "ddl", "misc", "misc_set", "all",
                                    "none")  # fmt: skip
PGAUDIT_LOG_LEVELS: tuple[str, ...] = ("debug1", "debug2", "debug3", "debug4", "debug5", "info", "notice",
                                       "warning", "log")  # fmt: skip
BOOLEAN_VALUES: tuple[str, ...] = ("on", "off", "true", "false", "yes", "no", "1", "0")
PGAUDIT_BOOLEANS: tuple[str, ...] = ("log_catalog", "log_client", "log_parameter", "log_relation",
                                     "log_rows", "log_statement", "log_statement_once")  # fmt: skip
PGAUDIT_SETTINGS: tuple[str, ...] = tuple(
    sorted(("log", "log_level", "log_parameter_max_size", "role", *PGAUDIT_BOOLEANS))
)
PGAUDIT_ROLE_PATTERN = r"^[a-z_][a-z0-9_]{0,62}$"
RESERVED_AUDIT_ROLES: tuple[str, ...] = (SUPERUSER, REPLICATION_USER, MONITOR_ROLE, PATRONI_API_USER)


def pgaudit_problem(name: str, value: str) -> str | None:
    """What is wrong with one pgaudit.* setting (None: admitted). `name` is lower case."""
    setting = name.removeprefix(PGAUDIT_PREFIX)
    words = value.strip().lower()
    if setting not in PGAUDIT_SETTINGS:
        known = ", ".join(PGAUDIT_PREFIX + s for s in PGAUDIT_SETTINGS)
        return f"{name} is not a pgaudit setting ({known})"
    if setting in PGAUDIT_BOOLEANS and words not in BOOLEAN_VALUES:
        return f"{name}: {value!r} is not a boolean (on, off, true, false, ...)"
    if setting == "log":
        for entry in (e.strip().removeprefix("-") for e in words.split(",")):
            if entry not in PGAUDIT_CLASSES:
                return (
                    f"{name}: {entry!r} is not a pgaudit class ({', '.join(PGAUDIT_CLASSES)}, - to exclude)"
                )
    if setting == "log_level" and words not in PGAUDIT_LOG_LEVELS:
        return f"{name}: {value!r} is not one of {', '.join(PGAUDIT_LOG_LEVELS)}"
    if setting == "log_parameter_max_size" and not re.fullmatch(r"[0-9]{1,9}", words):
        return f"{name}: {value!r} is not a size in bytes (0: no limit)"
    if setting == "role":
        if not re.fullmatch(PGAUDIT_ROLE_PATTERN, value) or value.startswith("pg_"):
            return f"{name}: {value!r} is not a role name (lower case, not pg_*)"
        if value in RESERVED_AUDIT_ROLES:
            return f"{name}: {value} is one of the operator's roles ({', '.join(RESERVED_AUDIT_ROLES)})"
    return None


def refusal_reason(name: str) -> str | None:
    """Why `name` cannot be set (the words after the name in the message), None when it can."""
    lowered = name.lower()
    if lowered == PRELOAD_PARAMETER:
        return None  # admitted from the allow-list: the value is checked (preload_problems)
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
        elif name == PRELOAD_PARAMETER:
            problems.extend(preload_problems(parameters[name]))
        elif name.startswith(PGAUDIT_PREFIX):
            problem = pgaudit_problem(name, parameters[name])
            if problem is not None:
                problems.append(problem)
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
    named = sorted(
        n for n in (*OPERATOR_OWNED_PARAMETERS, *REFUSED_PARAMETERS, PRELOAD_PARAMETER) if n.endswith(suffix)
    )
    exempt = f" || k in {_cel_list(named)}" if named else ""
    return rule(
        f"self.all(k, !k.endsWith('{suffix}'){exempt})",
        f"postgresql.parameters: a setting whose name ends in {suffix} {reason}",
        reason="FieldValueForbidden",
    )


_PRELOADABLE = _cel_list(list(PRELOADABLE_LIBRARIES))

PARAMETER_RULES: tuple[dict[str, str], ...] = (
    *(_lookup_rule(p, OWNED_REASON) for p in OPERATOR_OWNED_PARAMETERS),
    *(_lookup_rule(p, why) for p, why in REFUSED_PARAMETERS.items()),
    *(_suffix_rule(suffix, why) for suffix, why in REFUSED_SUFFIXES),
    rule(f"self.all(k, k.matches('{PARAMETER_NAME_PATTERN}'))", _NAME_MESSAGE),
    rule(
        f"!('{PRELOAD_PARAMETER}' in self) || self['{PRELOAD_PARAMETER}'].trim() == '' || "
        f"self['{PRELOAD_PARAMETER}'].split(',').all(e, e.trim() in {_PRELOADABLE})",
        f"postgresql.parameters: {PRELOAD_PARAMETER}: {PRELOAD_REASON}",
        reason="FieldValueForbidden",
    ),
    rule(
        f"self.all(k, !k.startsWith('{PGAUDIT_PREFIX}') || "
        f"k in {_cel_list([PGAUDIT_PREFIX + s for s in PGAUDIT_SETTINGS])})",
        "postgresql.parameters: a pgaudit.* name must be one of pgaudit's settings: "
        + ", ".join(PGAUDIT_PREFIX + s for s in PGAUDIT_SETTINGS),
    ),
    rule(
        f"!('{PGAUDIT_PREFIX}role' in self) || "
        f"(self['{PGAUDIT_PREFIX}role'].matches('{PGAUDIT_ROLE_PATTERN}') && "
        f"!self['{PGAUDIT_PREFIX}role'].startsWith('pg_') && "
        f"!(self['{PGAUDIT_PREFIX}role'] in {_cel_list(list(RESERVED_AUDIT_ROLES))}))",
        f"postgresql.parameters: pgaudit.role must be a role name (lower case, not pg_*) and not one of the "
        f"operator's roles ({', '.join(RESERVED_AUDIT_ROLES)})",
    ),
    *(
        rule(
            f"!('{PGAUDIT_PREFIX}{s}' in self) || "
            f"self['{PGAUDIT_PREFIX}{s}'].lowerAscii().trim() in {_cel_list(list(BOOLEAN_VALUES))}",
            f"postgresql.parameters: {PGAUDIT_PREFIX}{s} must be a boolean (on, off, true, false, ...)",
        )
        for s in PGAUDIT_BOOLEANS
    ),
)

# On the cluster's spec: what depends on the version (a library missing from that major's image).
SPEC_RULES: tuple[dict[str, str], ...] = tuple(
    rule(
        f"!(self.version in {_cel_list(list(majors))}) || !has(self.postgresql) || "
        f"!has(self.postgresql.parameters) || !('{PRELOAD_PARAMETER}' in self.postgresql.parameters) || "
        f"!self.postgresql.parameters['{PRELOAD_PARAMETER}'].split(',').exists(e, e.trim() == '{library}')",
        f"postgresql.parameters: {PRELOAD_PARAMETER}: {library} is not in the image of PostgreSQL "
        f"{' or '.join(majors)}",
        fieldPath=".postgresql.parameters",
    )
    for library, majors in MISSING_LIBRARIES.items()
) + tuple(
    rule(
        f"!has(self.databases) || !self.databases.exists(d, has(d.extensions) && '{ext}' in d.extensions) || "
        f"(has(self.postgresql) && has(self.postgresql.parameters) && "
        f"'{PRELOAD_PARAMETER}' in self.postgresql.parameters && "
        f"self.postgresql.parameters['{PRELOAD_PARAMETER}'].split(',').exists(e, e.trim() == '{ext}'))",
        f"databases: extension {ext} needs {ext} in postgresql.parameters.{PRELOAD_PARAMETER}",
        fieldPath=".databases",
    )
    for ext in PRELOAD_ONLY_EXTENSIONS
)

# On each value (the error's path names the parameter: spec.postgresql.parameters[work_mem]). A raw CEL
# string, so the pattern's backslashes reach the regex engine as they are.
VALUE_RULES: tuple[dict[str, str], ...] = (
    rule(
        f"!self.matches(r'{CONTROL_CHARACTER_PATTERN}')",
        f"postgresql.parameters: a value {CONTROL_CHARACTER_REASON}",
    ),
)
