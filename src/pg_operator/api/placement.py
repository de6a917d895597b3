"""Types of the instances' placement: anti-affinity over a topology key and tolerations of taints."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from pg_operator.api.schema import SpecModel, rule, validations

LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"  # optional DNS-subdomain prefix
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class Affinity(SpecModel):
    pod_anti_affinity: Literal["preferred", "required", "none"] = Field(
        "preferred",
        description=(
            "Spread instances over topologyKey: 'preferred' (default; schedules anyway when it cannot), "
            "'required' (an instance stays Pending rather than share), or 'none'."
        ),
    )
    topology_key: str = Field(
        "kubernetes.io/hostname",
        max_length=316,
        pattern=LABEL_KEY_PATTERN,
        description="Node label that defines the failure domain instances are spread over.",
    )


class Toleration(SpecModel):
    """Lets the instances run on tainted nodes (e.g. nodes reserved for databases)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                "has(self.key) || self.operator == 'Exists'",
                "tolerations: a toleration without a key must use operator Exists (it tolerates every taint)",
                fieldPath=".operator",
            ),
            rule(
                "self.operator != 'Exists' || !has(self.value)",
                "tolerations: a toleration with operator Exists takes no value",
                fieldPath=".value",
            ),
            rule(
                "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                "tolerations: tolerationSeconds only applies to effect NoExecute",
                fieldPath=".tolerationSeconds",
            ),
        )
    )

    key: str | None = Field(
        None, max_length=316, pattern=LABEL_KEY_PATTERN, description="Taint key; all when unset."
    )
    operator: Literal["Exists", "Equal"] = Field(
        "Equal", description="Equal (key and value) or Exists (key only)."
    )
    value: str | None = Field(None, max_length=63, description="Taint value, with operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect; all when unset."
    )
    toleration_seconds: int | None = Field(
        None, ge=0, description="With NoExecute: how long a pod stays bound after the taint appears."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.key is None and self.operator != "Exists":
            raise ValueError(
                "tolerations: a toleration without a key must use operator Exists (it tolerates every taint)"
            )
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("tolerations: a toleration with operator Exists takes no value")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerations: tolerationSeconds only applies to effect NoExecute")
        return self
