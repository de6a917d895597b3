"""Types of `spec.networkPolicy`: who may reach a cluster's instances over the network.

The peers are the shapes of Kubernetes' own NetworkPolicyPeer (a podSelector and/or a namespaceSelector,
or an ipBlock), so a platform engineer writes what they already know and the operator copies it into the
cluster's NetworkPolicy (`specs/network_policy.py`). Each constraint the API server would apply to the
NetworkPolicy is checked here first, so a spec admitted here never yields a policy it refuses.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pg_operator.api.placement import (
    LABEL_KEY_REASON,
    LABEL_VALUE_PATTERN,
    LABEL_VALUE_REASON,
    MAX_LABEL_KEY_LENGTH,
    MAX_LABEL_VALUE_LENGTH,
    cel_is_label_key,
    is_label_key,
    is_label_value,
    label_key_rule,
)
from pg_operator.api.schema import SpecModel, rule, validations

MAX_PEERS = 16
MAX_SELECTOR_TERMS = 16
MAX_VALUES = 32
MAX_EXCEPT = 16
MAX_CIDR_LENGTH = 43  # the longest IPv6 CIDR text: 39 characters, '/', 3 digits
VALUES_MESSAGE = "matchExpressions: operators In and NotIn need values, Exists and DoesNotExist take none"

# Values by `pattern`, not CEL: a CEL rule on every value of every expression of every peer exceeds the
# API server's cost budget for one CRD rule; a pattern costs nothing there. (The error then quotes the
# pattern; the operator's own check, below, says it in words.)
_LabelValue = Annotated[
    str, Field(max_length=MAX_LABEL_VALUE_LENGTH, json_schema_extra={"pattern": LABEL_VALUE_PATTERN})
]
_Cidr = Annotated[
    str,
    Field(
        max_length=MAX_CIDR_LENGTH,
        json_schema_extra=validations(rule("isCIDR(self)", "must be a CIDR such as 10.0.0.0/8 or fd00::/8")),
    ),
]


def cidr_problem(value: str) -> str | None:
    """Why `value` is not a CIDR as Kubernetes takes it (None: it is one)."""
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return f"{value!r} must be a CIDR such as 10.0.0.0/8 or fd00::/8"
    if "/" not in value:
        return f"{value!r} must be a CIDR such as 10.0.0.0/8 or fd00::/8 (the prefix length is missing)"
    return None


class SelectorRequirement(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
                VALUES_MESSAGE,
                fieldPath=".values",
            )
        )
    )

    key: str = Field(
        max_length=MAX_LABEL_KEY_LENGTH,
        description="The label key the requirement applies to.",
        json_schema_extra=validations(label_key_rule("matchExpressions: key")),
    )
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How key relates to values."
    )
    values: list[_LabelValue] | None = Field(
        None, max_length=MAX_VALUES, description="Values for In and NotIn; none for Exists and DoesNotExist."
    )

    @field_validator("key")
    @classmethod
    def _key(cls, key: str) -> str:
        if not is_label_key(key):
            raise ValueError(f"matchExpressions: key {LABEL_KEY_REASON}")
        return key

    @model_validator(mode="after")
    def _values(self) -> SelectorRequirement:
        if (self.operator in ("In", "NotIn")) != bool(self.values):
            raise ValueError(VALUES_MESSAGE)
        for value in self.values or ():
            if not is_label_value(value):
                raise ValueError(f"matchExpressions: the value {value!r} {LABEL_VALUE_REASON}")
        return self


class LabelSelector(SpecModel):
    """A Kubernetes label selector; an empty one selects everything."""

    match_labels: dict[str, _LabelValue] | None = Field(
        None,
        max_length=MAX_SELECTOR_TERMS,
        description="Labels that must all be present with these values.",
        json_schema_extra=validations(
            rule(f"self.all(k, {cel_is_label_key('k')})", f"matchLabels: every key {LABEL_KEY_REASON}")
        ),
    )
    match_expressions: list[SelectorRequirement] | None = Field(
        None, max_length=MAX_SELECTOR_TERMS, description="Requirements that must all hold."
    )

    @field_validator("match_labels")
    @classmethod
    def _labels(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        for key, value in sorted((labels or {}).items()):
            if not is_label_key(key):
                raise ValueError(f"matchLabels: the key {key!r} {LABEL_KEY_REASON}")
            if not is_label_value(value):
                raise ValueError(f"matchLabels: the value of {key} {LABEL_VALUE_REASON}")
        return labels


class IPBlock(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                "!has(self.except) || self.except.all(e, cidr(self.cidr).containsCIDR(e) && "
                "cidr(e).prefixLength() > cidr(self.cidr).prefixLength())",
                "ipBlock: every except entry must lie inside cidr and be smaller",
                fieldPath=".except",
            )
        )
    )

    cidr: _Cidr = Field(description="Addresses allowed, e.g. 10.20.0.0/16.")
    except_: list[_Cidr] | None = Field(
        None, alias="except", max_length=MAX_EXCEPT, description="Addresses inside cidr that stay refused."
    )

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        problem = cidr_problem(value)
        if problem:
            raise ValueError(f"ipBlock.cidr: {problem}")
        return value

    @model_validator(mode="after")
    def _except_inside(self) -> IPBlock:
        outer = ipaddress.ip_network(self.cidr, strict=False)
        for entry in self.except_ or ():
            problem = cidr_problem(entry)
            if problem:
                raise ValueError(f"ipBlock.except: {problem}")
            inner = ipaddress.ip_network(entry, strict=False)
            inside = inner.version == outer.version and inner.subnet_of(outer)  # type: ignore[arg-type]
            if not inside or inner.prefixlen <= outer.prefixlen:
                raise ValueError(f"ipBlock.except: {entry!r} must lie inside {self.cidr!r} and be smaller")
        return self


class NetworkPeer(SpecModel):
    """Who may connect: pods chosen by podSelector (in this namespace, or in the namespaces namespaceSelector
    picks), or addresses in ipBlock — the shape of a NetworkPolicy's `from` entry."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                "has(self.ipBlock) != (has(self.podSelector) || has(self.namespaceSelector))",
                "a peer is either an ipBlock or a podSelector and/or namespaceSelector",
            )
        )
    )

    pod_selector: LabelSelector | None = Field(
        None, description="Pods allowed; with namespaceSelector, those pods in the namespaces it picks."
    )
    namespace_selector: LabelSelector | None = Field(
        None, description="Namespaces whose pods are allowed ({} is every namespace)."
    )
    ip_block: IPBlock | None = Field(None, description="Addresses allowed (usually outside the pod network).")

    @model_validator(mode="after")
    def _one_kind(self) -> NetworkPeer:
        selectors = self.pod_selector is not None or self.namespace_selector is not None
        if (self.ip_block is not None) == selectors:
            raise ValueError("a peer is either an ipBlock or a podSelector and/or namespaceSelector")
        return self


class NetworkPolicySpec(SpecModel):
    enabled: bool = Field(
        True,
        description=(
            "Keep a NetworkPolicy that admits only the peers below (plus the cluster's own pods and the "
            "operator). false: no policy; the operator deletes the one it made."
        ),
    )
    allow_from: list[NetworkPeer] | None = Field(
        None,
        max_length=MAX_PEERS,
        description=(
            "Who may connect to PostgreSQL (5432). Unset: every pod in the cluster's namespace. A list "
            "replaces that default ([] admits no one beyond the cluster's own pods and the operator)."
        ),
    )
    metrics_from: list[NetworkPeer] | None = Field(
        None,
        max_length=MAX_PEERS,
        description=(
            "Who may scrape the instances' and the pooler's metrics ports (9187, 9127). Unset: the pods of "
            "the monitoring namespace the operator's install names (--monitoring-namespace, default "
            "monitoring), the cluster's own pods and the operator. A list replaces that default."
        ),
    )
