"""spec.nodeLoss: what the operator does with an instance whose node is lost (NotReady, unreachable or
gone) — report it always; replace it on another node, with a new volume cloned from the primary, when
the user allows it (or, unset, when its volume is node-local and so can never follow it), once the node
has been lost for `after`.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from pg_operator.api.schema import SpecModel, rule, validations

# A whole number of seconds, minutes or hours, as the user writes it ("90s", "5m", "1h").
DURATION_PATTERN = r"^[0-9]{1,5}(s|m|h)$"
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}
DEFAULT_AFTER = "5m"
# Longer than this a lost instance is not worth waiting for: a day covers any planned repair.
MAX_AFTER_SECONDS = 24 * 3600


def duration_seconds(text: str) -> int:
    """The seconds of a duration matching DURATION_PATTERN ("5m" -> 300)."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration such as 90s, 5m or 1h")
    return int(text[:-1]) * DURATION_UNITS[text[-1]]


class NodeLoss(SpecModel):
    replace_instances: bool | None = Field(
        None,
        description=(
            "Replace an instance whose node is lost on another node, with a new volume re-cloned from the "
            "primary (the lost volume is left to its provisioner). Unset: only when the instance's volume "
            "is pinned to the lost node (node-local storage); a volume that can follow its pod waits for "
            "the node. Never the primary, never two at once (docs/high-availability.md)."
        ),
    )
    after: str = Field(
        DEFAULT_AFTER,
        max_length=6,
        pattern=DURATION_PATTERN,
        description=(
            "How long the node must have been lost (since its Ready condition changed) before the instance "
            "is replaced, e.g. 90s, 5m, 1h; at most 24h."
        ),
        json_schema_extra=validations(
            rule(
                "int(self.substring(0, size(self) - 1)) * (self.endsWith('h') ? 3600 : "
                f"(self.endsWith('m') ? 60 : 1)) <= {MAX_AFTER_SECONDS}",
                "nodeLoss.after must be at most 24h",
            )
        ),
    )

    @field_validator("after")
    @classmethod
    def _bounded(cls, after: str) -> str:
        if duration_seconds(after) > MAX_AFTER_SECONDS:
            raise ValueError(f"nodeLoss.after: {after} is longer than 24h")
        return after

    @property
    def after_seconds(self) -> int:
        return duration_seconds(self.after)
