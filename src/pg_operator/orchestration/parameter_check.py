"""PostgreSQL's own judgement of `spec.postgresql.parameters`, before a value is sent to Patroni and
after Patroni reloaded it.

Before: each new value is handed to the instance's own server binary in its "print one setting" mode,
`postgres -C NAME -c NAME=VALUE -D $PGDATA`, run in the primary's container. That parses the value
exactly as a start or reload would (units and their rounding, ranges, enums, Boolean spellings, check
hooks such as time zones, unknown names) against the instance's own configuration file, prints the
setting and exits: it applies nothing and, for ordinary settings, is documented to work on a running
server. A value it refuses is never sent to Patroni (whose validator would drop it silently, or write
it to postgresql.conf where a misspelled name keeps PostgreSQL from starting); the other values of
the same edit still go. Its FATAL/DETAIL/HINT lines are PostgreSQL's words for the condition and Event.

After: the values Patroni was sent are read back from `pg_settings` on the primary. A setting whose
value is in effect is reported applied, one PostgreSQL marks `pending_restart` waits for the rolling
restart, and one that shows neither is reported as not (yet) applied — never as applied.

Values travel on the exec's stdin, not in its URL; the operator's log and Events name parameters, and
quote a value only where PostgreSQL's own refusal quotes it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pg_operator.api.parameters import PARAMETER_NAME_PATTERN

# One block per parameter: a marker line, then the printed setting (accepted) or the server's
# messages (refused). Input on stdin, one `name=value` a line (values hold no control characters: the
# API refuses them). stderr is dropped on success (log lines such as "skipping missing configuration
# file"), and captured on refusal by running it again.
CHECK_SCRIPT = r"""
while IFS= read -r line; do
  name=${line%%=*}
  if value=$(postgres -C "$name" -c "$line" -D "$PGDATA" 2>/dev/null); then
    printf '%s %s\n%s\n' '@@pgop-accepted' "$name" "$value"
  else
    printf '%s %s\n' '@@pgop-refused' "$name"
    postgres -C "$name" -c "$line" -D "$PGDATA" 2>&1 >/dev/null
  fi
done
"""
ACCEPTED_MARK, REFUSED_MARK = "@@pgop-accepted", "@@pgop-refused"
# A setting's name as the schema admits it (so psql may quote it without escaping).
NAME_PATTERN = re.compile(PARAMETER_NAME_PATTERN)
# The severity tag PostgreSQL puts after whatever log_line_prefix says: "FATAL:  message".
_MESSAGE = re.compile(r"\b(FATAL|ERROR|DETAIL|HINT):\s+(.*)$")


@dataclass(frozen=True)
class Verdict:
    """PostgreSQL's word on one value: accepted (with the setting it parses to, in the unit
    pg_settings.setting uses), refused (with its reason), or unknown (the check itself did not run)."""

    accepted: bool
    setting: str = ""  # as `postgres -C` prints it when accepted
    reason: str = ""  # PostgreSQL's message when refused; what went wrong when unknown
    unknown: bool = False


def value_text(value: Any) -> str:
    """A parameter's value as Patroni writes it into postgresql.conf."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


CHECK_ARGV = ["sh", "-c", CHECK_SCRIPT]


def check_input(values: Mapping[str, Any]) -> bytes:
    """CHECK_SCRIPT's stdin for `values` ({name: value}): the values stay out of the exec request's
    URL (and so out of the API server's logs)."""
    for name, value in values.items():
        if not NAME_PATTERN.match(name) or any(ord(c) < 32 or ord(c) == 127 for c in value_text(value)):
            raise ValueError(f"{name}: not a parameter name, or a value with a control character")
    return "".join(f"{name}={value_text(values[name])}\n" for name in sorted(values)).encode()


def postgres_reason(lines: list[str]) -> str:
    """PostgreSQL's messages for a refusal, one sentence: the FATAL (or ERROR) line, then DETAIL and
    HINT as it prints them; "" when there is none."""
    parts: dict[str, str] = {}
    for line in lines:
        found = _MESSAGE.search(line)
        if found and found.group(1) not in parts:
            parts["FATAL" if found.group(1) == "ERROR" else found.group(1)] = found.group(2).strip()
    if "FATAL" not in parts:
        return ""
    out = parts["FATAL"]
    for tag in ("DETAIL", "HINT"):
        if tag in parts:
            out += f" ({tag}: {parts[tag]})"
    return out


def parse_check_output(names: Collection[str], stdout: str) -> dict[str, Verdict]:
    """The verdict on each of `names` from CHECK_SCRIPT's output. A name without a block, or refused
    without a message from PostgreSQL (the binary missing, say), is unknown: neither sent nor refused."""
    blocks: dict[str, tuple[str, list[str]]] = {}
    current: list[str] | None = None
    for line in stdout.splitlines():
        mark, _, name = line.partition(" ")
        if mark in (ACCEPTED_MARK, REFUSED_MARK) and name:
            current = []
            blocks[name] = (mark, current)
        elif current is not None:
            current.append(line)
    verdicts: dict[str, Verdict] = {}
    for name in names:
        mark, lines = blocks.get(name, ("", []))
        if mark == ACCEPTED_MARK:
            verdicts[name] = Verdict(True, setting=lines[0] if lines else "")
            continue
        reason = postgres_reason(lines) if mark == REFUSED_MARK else ""
        if reason:
            verdicts[name] = Verdict(False, reason=reason)
        else:
            tail = " ".join(line.strip() for line in lines[-3:] if line.strip())
            verdicts[name] = Verdict(
                False, unknown=True, reason=f"could not check {name}: {tail or 'no answer from postgres -C'}"
            )
    return verdicts


def new_values(patch: Mapping[str, Any] | None) -> dict[str, Any]:
    """The parameters a dynamic-config patch sets (removals, sent as null, need no check)."""
    section = (patch or {}).get("postgresql")
    params = section.get("parameters") if isinstance(section, Mapping) else None
    if not isinstance(params, Mapping):
        return {}
    return {name: value for name, value in params.items() if value is not None}


def without_refused(
    desired: Mapping[str, Any], held: Mapping[str, Any] | None, refused: Collection[str]
) -> dict[str, Any]:
    """`desired` dynamic settings with each refused parameter kept as Patroni holds it now (or left
    out when it holds none), so the patch built from them carries only what PostgreSQL accepts."""
    section = desired.get("postgresql")
    params = section.get("parameters") if isinstance(section, Mapping) else None
    if not refused or not isinstance(params, Mapping):
        return dict(desired)
    held_section = (held or {}).get("postgresql")
    held_params = held_section.get("parameters") if isinstance(held_section, Mapping) else None
    held_params = held_params if isinstance(held_params, Mapping) else {}
    kept = {name: value for name, value in params.items() if name not in refused}
    kept.update({name: held_params[name] for name in refused if name in held_params})
    assert isinstance(section, Mapping)
    return {**desired, "postgresql": {**section, "parameters": kept}}


def refusal_message(refused: Mapping[str, str]) -> str:
    """The condition's and the Event's message: each refused parameter with PostgreSQL's reason."""
    said = "; ".join(f"{name}: {reason}" for name, reason in sorted(refused.items()))
    return (
        f"spec.postgresql.parameters: PostgreSQL refuses {', '.join(sorted(refused))} "
        f"({said}); not sent to the instances, which keep their previous value"
    )


# --- after the reload --------------------------------------------------------------------------------


def verify_query(names: Collection[str]) -> str:
    """pg_settings rows (name|setting|pending_restart) for `names`, which must match NAME_PATTERN."""
    bad = [n for n in names if not NAME_PATTERN.match(n)]
    if bad:
        raise ValueError(f"not a parameter name: {bad[0]!r}")
    listed = ", ".join(f"'{n}'" for n in sorted(names))
    # Safe to inline: every name matched NAME_PATTERN (no quote, no space).
    return f"select name, setting, pending_restart from pg_settings where name in ({listed})"  # noqa: S608


@dataclass(frozen=True)
class Applied:
    applied: tuple[str, ...] = ()  # in effect on the instance read
    waiting_restart: tuple[str, ...] = ()  # PostgreSQL holds the new value back until a restart
    not_yet: tuple[str, ...] = ()  # neither (yet): Patroni has not reloaded, or dropped the value


def read_back(expected: Mapping[str, str], psql_output: str) -> Applied:
    """Compare pg_settings (psql -At, '|'-separated: name|setting|pending_restart) with the settings
    `postgres -C` parsed the sent values to ({name: setting})."""
    rows: dict[str, tuple[str, bool]] = {}
    for line in psql_output.splitlines():
        parts = line.split("|")
        if len(parts) >= 3 and parts[0] in expected:
            rows[parts[0]] = ("|".join(parts[1:-1]), parts[-1].strip() == "t")
    applied, waiting, not_yet = [], [], []
    for name in sorted(expected):
        setting, pending = rows.get(name, (None, False))
        if pending:
            waiting.append(name)
        elif setting is not None and setting == expected[name]:
            applied.append(name)
        else:
            not_yet.append(name)
    return Applied(tuple(applied), tuple(waiting), tuple(not_yet))


def applied_message(result: Applied, primary: str, removed: Collection[str] = ()) -> str:
    """The ConfigurationUpdated Event: only what the primary really shows."""
    parts = []
    if result.applied:
        parts.append(
            f"applied on primary {primary} (replicas reload the same configuration): "
            + ", ".join(f"parameter {n}" for n in result.applied)
        )
    if result.waiting_restart:
        parts.append(
            "waiting for a restart of every instance: "
            + ", ".join(f"parameter {n}" for n in result.waiting_restart)
        )
    if removed:
        parts.append(
            "removed from Patroni's configuration: " + ", ".join(f"parameter {n}" for n in sorted(removed))
        )
    if result.not_yet:
        parts.append(f"not in effect on {primary}: " + ", ".join(f"parameter {n}" for n in result.not_yet))
    return "; ".join(parts)
