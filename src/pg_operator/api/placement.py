"""Types of the instances' placement: anti-affinity over a topology key, spread over zones, tolerations
of taints, what a drain may do to the instances (Disruption), and the label keys and values a node
selector, a topology key and a toleration are made of.

Label keys and values are held to what the API server checks on the StatefulSet's pod template, so a
spec admitted here never yields a StatefulSet the API server refuses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, ValidationInfo, field_validator, model_validator

from pg_operator.api.schema import SpecModel, rule, validations

_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"  # at most 63 characters
# A qualified name, as Kubernetes checks label, node-selector, topology and taint keys: an optional
# DNS-subdomain prefix and '/', then a name. The second pattern bounds the prefix to 253 characters
# (a key must match both).
LABEL_KEY_PATTERN = rf"^({_DNS_SUBDOMAIN}/)?{_LABEL_NAME}$"
LABEL_KEY_PREFIX_PATTERN = r"^([^/]{1,253}/)?[^/]+$"
MAX_LABEL_KEY_LENGTH = 253 + 1 + 63
LABEL_VALUE_PATTERN = rf"^({_LABEL_NAME})?$"
MAX_LABEL_VALUE_LENGTH = 63

LABEL_KEY_REASON = (
    "must be a label key: an optional DNS-subdomain prefix of at most 253 characters and '/', then at most "
    "63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"
)
LABEL_VALUE_REASON = (
    "must be a label value: empty, or at most 63 letters, digits, '-', '_' or '.', beginning and ending "
    "with a letter or digit"
)


def is_label_key(key: str) -> bool:
    return bool(re.fullmatch(LABEL_KEY_PATTERN, key) and re.fullmatch(LABEL_KEY_PREFIX_PATTERN, key))


def is_label_value(value: str) -> bool:
    return re.fullmatch(LABEL_VALUE_PATTERN, value) is not None


def cel_is_label_key(var: str) -> str:
    """The CEL test of is_label_key on `var` (raw strings: the patterns' backslashes reach RE2 as they
    are)."""
    return f"{var}.matches(r'{LABEL_KEY_PATTERN}') && {var}.matches(r'{LABEL_KEY_PREFIX_PATTERN}')"


def cel_is_label_value(var: str) -> str:
    return f"{var}.matches(r'{LABEL_VALUE_PATTERN}')"


def label_key_rule(field: str) -> dict[str, str]:
    return rule(cel_is_label_key("self"), f"{field} {LABEL_KEY_REASON}")


def label_value_rule(field: str) -> dict[str, str]:
    return rule(cel_is_label_value("self"), f"{field} {LABEL_VALUE_REASON}")


# nodeSelector: the keys in one rule over the map (a key has no schema of its own), each value by its own
# rule (the error's path names the key).
NODE_SELECTOR_KEY_RULE = rule(
    f"self.all(k, {cel_is_label_key('k')})", f"nodeSelector: every key {LABEL_KEY_REASON}"
)
NODE_SELECTOR_VALUE_RULE = rule(cel_is_label_value("self"), f"nodeSelector: a value {LABEL_VALUE_REASON}")


def node_selector_problems(selector: Mapping[str, str]) -> list[str]:
    """What is wrong with a node selector, naming each key (empty: nothing)."""
    problems = []
    for key in sorted(selector):
        if not is_label_key(key):
            problems.append(f"{key!r} {LABEL_KEY_REASON}")
        elif not is_label_value(selector[key]):
            problems.append(f"the value of {key} {LABEL_VALUE_REASON}")
    return problems


_NodeLabelValue = Annotated[
    str,
    StringConstraints(max_length=MAX_LABEL_VALUE_LENGTH),
    Field(json_schema_extra=validations(label_value_rule("nodeAffinity: a value"))),
]


class NodeRequirement(SpecModel):
    """One node-label expression the instances' nodes must satisfy (a nodeAffinity matchExpression)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                "self.operator in ['Exists', 'DoesNotExist'] ? !has(self.values) || size(self.values) == 0 "
                ": has(self.values) && size(self.values) > 0",
                "nodeAffinity: operators In and NotIn take values, Exists and DoesNotExist none",
                fieldPath=".values",
            ),
        )
    )

    key: str = Field(
        max_length=MAX_LABEL_KEY_LENGTH,
        description="Node label key.",
        json_schema_extra=validations(label_key_rule("nodeAffinity: key")),
    )
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How the label is matched."
    )
    values: list[_NodeLabelValue] | None = Field(
        None, max_length=32, description="Label values, with In and NotIn."
    )

    @field_validator("key")
    @classmethod
    def _key(cls, key: str) -> str:
        if not is_label_key(key):
            raise ValueError(f"nodeAffinity: key {LABEL_KEY_REASON}")
        return key

    @model_validator(mode="after")
    def _values(self) -> NodeRequirement:
        takes_values = self.operator in ("In", "NotIn")
        if takes_values != bool(self.values):
            raise ValueError("nodeAffinity: operators In and NotIn take values, Exists and DoesNotExist none")
        for value in self.values or ():
            if not is_label_value(value):
                raise ValueError(f"nodeAffinity: a value {LABEL_VALUE_REASON}")
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        inside = present and labels[self.key] in (self.values or ())
        return inside if self.operator == "In" else not inside


ANTI_AFFINITY_AUTO: Literal["auto"] = "auto"
ZONE_LABEL = "topology.kubernetes.io/zone"


class Affinity(SpecModel):
    pod_anti_affinity: Literal["auto", "preferred", "required", "none"] = Field(
        ANTI_AFFINITY_AUTO,
        description=(
            "Keep instances apart over topologyKey: 'required' (an instance stays Pending rather than "
            "share), 'preferred' (shares when it cannot), 'none', or 'auto' (default): 'required' when "
            "the StatefulSet is created and at least spec.replicas schedulable nodes match the instances' "
            "nodeSelector and tolerations, else 'preferred'. The choice is kept afterwards: a node lost "
            "or drained never changes it. A change applies to each instance when its pod is next recreated."
        ),
    )
    topology_key: str = Field(
        "kubernetes.io/hostname",
        max_length=MAX_LABEL_KEY_LENGTH,
        description="Node label that defines the failure domain instances are spread over.",
        json_schema_extra=validations(label_key_rule("affinity.topologyKey")),
    )
    zone_spread: Literal["preferred", "required", "none"] = Field(
        "preferred",
        description=(
            "Spread instances evenly over zoneTopologyKey (topologySpreadConstraints, maxSkew 1): "
            "'preferred' (default, ScheduleAnyway), 'required' (DoNotSchedule: an instance stays Pending "
            "rather than unbalance the zones; nodes without the label are not used), or 'none'."
        ),
    )
    node_affinity: list[NodeRequirement] = Field(
        default_factory=list,
        max_length=16,
        description=(
            "Node-label expressions every node of the instances and pooler pods must satisfy (all of them; "
            "beside nodeSelector): e.g. {key: node.kubernetes.io/instance-type, operator: In, values: [...]}."
        ),
    )
    zone_topology_key: str = Field(
        ZONE_LABEL,
        max_length=MAX_LABEL_KEY_LENGTH,
        description="Node label that names a node's zone.",
        json_schema_extra=validations(label_key_rule("affinity.zoneTopologyKey")),
    )

    @field_validator("topology_key", "zone_topology_key")
    @classmethod
    def _topology_key(cls, key: str, info: ValidationInfo) -> str:
        if not is_label_key(key):
            field = "topologyKey" if info.field_name == "topology_key" else "zoneTopologyKey"
            raise ValueError(f"affinity.{field} {LABEL_KEY_REASON}")
        return key


class Disruption(SpecModel):
    """What voluntary disruptions (node drains, evictions) may do to the instances."""

    single_instance: Literal["Evict", "Block"] = Field(
        "Evict",
        description=(
            "A one-instance cluster on a node being drained: 'Evict' (default) lets the drain evict it "
            "(the database is down until the pod runs again; with node-local volumes, until the node is "
            "back); 'Block' keeps a PodDisruptionBudget that refuses the eviction, so the drain waits "
            "until the pod is deleted by hand, the cluster scaled up, or this set to 'Evict'."
        ),
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
        None,
        max_length=MAX_LABEL_KEY_LENGTH,
        description="Taint key; all when unset.",
        json_schema_extra=validations(label_key_rule("tolerations: key")),
    )
    operator: Literal["Exists", "Equal"] = Field(
        "Equal", description="Equal (key and value) or Exists (key only)."
    )
    value: str | None = Field(
        None,
        max_length=MAX_LABEL_VALUE_LENGTH,
        description="Taint value, with operator Equal.",
        json_schema_extra=validations(label_value_rule("tolerations: value")),
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect; all when unset."
    )
    toleration_seconds: int | None = Field(
        None, ge=0, description="With NoExecute: how long a pod stays bound after the taint appears."
    )

    @field_validator("key")
    @classmethod
    def _key(cls, key: str | None) -> str | None:
        if key is not None and not is_label_key(key):
            raise ValueError(f"tolerations: key {LABEL_KEY_REASON}")
        return key

    @field_validator("value")
    @classmethod
    def _value(cls, value: str | None) -> str | None:
        if value is not None and not is_label_value(value):
            raise ValueError(f"tolerations: value {LABEL_VALUE_REASON}")
        return value

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
