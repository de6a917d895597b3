"""A switchover asked for on the cluster (`db.example.com/switchover-to`: an instance's name, or `auto`
for the best candidate), as a pure decision: when the request is answered by what the cluster shows.

The request is done once the instance it names leads. For `auto` no name tells that, so the operator
remembers which instance led when it first asked Patroni: once another leads, the switchover happened.
That also holds when Patroni's answer was lost (a REST API restarting with new certificates, a
timeout): asking again would switch over a second time, from the primary promoted a moment ago, and a
candidate that had not yet followed it would start a timeline of the same number beside it."""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"


@dataclass(frozen=True)
class Asked:
    """A request the operator has put to Patroni: what was asked and who led at the time."""

    requested: str
    leader: str


def answered(requested: str, primary: str | None, asked: Asked | None) -> str | None:
    """Why the request is done (a message for the SwitchoverDone Event), or None while it is not."""
    if primary is None:
        return None
    if primary == requested:
        return f"{requested} is the primary"
    if asked is not None and asked.requested == requested and asked.leader != primary:
        return f"{primary} is the primary (it was {asked.leader} when the switchover was asked for)"
    return None
