"""Types of `spec.services`: how clients outside the cluster's pods reach it (docs/exposure.md).

Two things, both tenant input: annotations and labels added to the operator's client Services (`-rw`,
`-ro`, `-r` and the pooler's), and extra Services of type NodePort or LoadBalancer in front of `rw`, `ro`,
`r` or a pooler side, which the operator creates, keeps and removes like its own.

What the operator itself sets always wins: a label key the operator sets or selects on, its own domain
(`db.example.com/`) and the Kubernetes domains (`kubernetes.io`, `k8s.io`: kube-proxy and the endpoint
controllers act on keys there, e.g. a Service-proxy name that makes kube-proxy skip the Service) are
refused naming the field, never merged under the operator's. Annotations may use the Kubernetes domains
(load-balancer controllers are configured through them) but not the operator's own.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator

from pg_operator.api.constants import CLUSTER_LABEL, GROUP, ROLE_LABEL
from pg_operator.api.placement import LABEL_KEY_REASON, LABEL_VALUE_REASON, is_label_key, is_label_value
from pg_operator.api.schema import SpecModel, rule, validations

MAX_ADDITIONAL = 8
MAX_METADATA_ENTRIES = 32
MAX_ANNOTATION_VALUE_LENGTH = 4096
MAX_HOSTS = 16
MAX_SOURCE_RANGES = 32
NODE_PORT_MIN, NODE_PORT_MAX = 30000, 32767
# A Service name: a DNS-1035 label.
SERVICE_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# A host name a client may dial (lower-case DNS name, optionally a leading wildcard label).
HOST_NAME_PATTERN = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

# The label keys the operator sets on its Services or selects pods with (specs/labels.py, the pooler's
# pod labels): never the tenant's.
OPERATOR_LABEL_KEYS: tuple[str, ...] = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/component",
    "app.kubernetes.io/version",
    CLUSTER_LABEL,
    ROLE_LABEL,
)
# Domains whose keys the tenant may not set as labels: the operator's and Kubernetes' own.
RESERVED_LABEL_DOMAINS: tuple[str, ...] = (GROUP, "kubernetes.io", "k8s.io")
RESERVED_ANNOTATION_DOMAINS: tuple[str, ...] = (GROUP,)

Target = Literal["rw", "ro", "r", "pooler-rw", "pooler-ro"]


def _domain(key: str) -> str:
    return key.split("/", 1)[0] if "/" in key else ""


def _in_domain(key: str, domains: tuple[str, ...]) -> bool:
    domain = _domain(key)
    return any(domain == d or domain.endswith("." + d) for d in domains)


def label_problems(field: str, labels: Mapping[str, str]) -> list[str]:
    """What is wrong with labels the tenant adds to a Service, naming each key (empty: nothing)."""
    problems = []
    for key in sorted(labels):
        where = f"{field}[{key!r}]"
        if not is_label_key(key):
            problems.append(f"{where}: {LABEL_KEY_REASON}")
        elif key in OPERATOR_LABEL_KEYS or _in_domain(key, RESERVED_LABEL_DOMAINS):
            problems.append(f"{where}: the operator sets or selects on this key; it cannot be overridden")
        elif not is_label_value(labels[key]):
            problems.append(f"{where}: {LABEL_VALUE_REASON}")
    return problems


def annotation_problems(field: str, annotations: Mapping[str, str]) -> list[str]:
    problems = []
    for key in sorted(annotations):
        where = f"{field}[{key!r}]"
        if not is_label_key(key):
            problems.append(f"{where}: {LABEL_KEY_REASON}")
        elif _in_domain(key, RESERVED_ANNOTATION_DOMAINS):
            problems.append(f"{where}: the operator's own annotation domain {GROUP} is not the tenant's")
        elif len(annotations[key]) > MAX_ANNOTATION_VALUE_LENGTH:
            problems.append(f"{where}: at most {MAX_ANNOTATION_VALUE_LENGTH} characters")
    return problems


def _cel_reserved(var: str, domains: tuple[str, ...]) -> str:
    """CEL: the key `var` lies in one of the domains (its prefix before '/' is the domain or under it)."""
    prefix = f"{var}.split('/')[0]"
    tests = [f"({var}.contains('/') && ({prefix} == '{d}' || {prefix}.endsWith('.{d}')))" for d in domains]
    return " || ".join(tests)


_OPERATOR_KEYS_CEL = "[" + ", ".join(f"'{k}'" for k in OPERATOR_LABEL_KEYS) + "]"
LABELS_RULE = rule(
    f"self.all(k, !(k in {_OPERATOR_KEYS_CEL}) && !({_cel_reserved('k', RESERVED_LABEL_DOMAINS)}))",
    "labels: the operator's own label keys and the db.example.com, kubernetes.io and k8s.io domains "
    "cannot be set or overridden",
)
ANNOTATIONS_RULE = rule(
    f"self.all(k, !({_cel_reserved('k', RESERVED_ANNOTATION_DOMAINS)}))",
    f"annotations: the operator's own domain {GROUP} cannot be set",
)

_LabelValue = Annotated[str, StringConstraints(max_length=63)]
_AnnotationValue = Annotated[str, StringConstraints(max_length=MAX_ANNOTATION_VALUE_LENGTH)]
_Host = Annotated[str, StringConstraints(min_length=1, max_length=253)]
_SourceRange = Annotated[str, StringConstraints(min_length=1, max_length=43)]


def _labels_field(what: str) -> Any:
    return Field(
        default_factory=dict,
        max_length=MAX_METADATA_ENTRIES,
        description=f"Labels added to {what}; the operator's own keys always win and cannot be set.",
        json_schema_extra=validations(LABELS_RULE),
    )


def _annotations_field(what: str) -> Any:
    return Field(
        default_factory=dict,
        max_length=MAX_METADATA_ENTRIES,
        description=f"Annotations added to {what} (e.g. a load balancer's settings).",
        json_schema_extra=validations(ANNOTATIONS_RULE),
    )


def host_problem(host: str) -> str | None:
    """Why `host` cannot be a name in the server certificate (None: it can): a DNS name or an IP address."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return None
    if re.fullmatch(HOST_NAME_PATTERN, host) is None:
        return f"{host!r} must be a lower-case DNS name (optionally starting with '*.') or an IP address"
    return None


class AdditionalService(SpecModel):
    """A Service of type NodePort or LoadBalancer the operator keeps in front of one target."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                "!has(self.loadBalancerSourceRanges) || size(self.loadBalancerSourceRanges) == 0 || "
                "self.type == 'LoadBalancer'",
                "services.additional: loadBalancerSourceRanges applies to type LoadBalancer only",
                fieldPath=".loadBalancerSourceRanges",
            ),
        )
    )

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=SERVICE_NAME_PATTERN,
        description="The Service's name (a DNS label); not one of the operator's own Service names.",
    )
    target: Target = Field(
        "rw",
        description=(
            "What it routes to: rw (the primary), ro (the replicas), r (any instance), pooler-rw or "
            "pooler-ro (the pooler's sides; spec.pooler, and readOnly for pooler-ro, required)."
        ),
    )
    type: Literal["NodePort", "LoadBalancer"] = Field("LoadBalancer", description="The Service's type.")
    node_port: int | None = Field(
        None,
        ge=NODE_PORT_MIN,
        le=NODE_PORT_MAX,
        description="A fixed node port; unset: Kubernetes allocates one.",
    )
    load_balancer_source_ranges: list[_SourceRange] = Field(
        default_factory=list,
        max_length=MAX_SOURCE_RANGES,
        description="Client networks (CIDRs) the load balancer admits; unset: any.",
    )
    external_traffic_policy: Literal["Cluster", "Local"] = Field(
        "Cluster",
        description="Local keeps the client's source address (only nodes running a target pod answer).",
    )
    hosts: list[_Host] = Field(
        default_factory=list,
        max_length=MAX_HOSTS,
        description=(
            "DNS names and IP addresses clients dial to reach this Service (a load balancer's name, a "
            "node's address): the server certificate covers each of them."
        ),
    )
    labels: dict[str, _LabelValue] = _labels_field("this Service")
    annotations: dict[str, _AnnotationValue] = _annotations_field("this Service")

    @field_validator("load_balancer_source_ranges")
    @classmethod
    def _ranges(cls, ranges: list[str]) -> list[str]:
        for value in ranges:
            try:
                ipaddress.ip_network(value, strict=True)
            except ValueError:
                raise ValueError(f"{value!r} must be a network in CIDR form (e.g. 10.0.0.0/8)") from None
        return ranges

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        problems = [p for p in map(host_problem, hosts) if p]
        if problems:
            raise ValueError("; ".join(problems))
        return hosts

    def problems(self) -> list[str]:
        """What is wrong with it beyond each field's own shape, named from `services` (ServicesSpec checks
        it, so the message names the Service rather than its index)."""
        field = f"services.additional[{self.name}]"
        problems = label_problems(f"{field}.labels", self.labels)
        problems += annotation_problems(f"{field}.annotations", self.annotations)
        if self.load_balancer_source_ranges and self.type != "LoadBalancer":
            problems.append(f"{field}.loadBalancerSourceRanges: applies to type LoadBalancer only")
        return problems


class ServicesSpec(SpecModel):
    model_config = ConfigDict(
        json_schema_extra=validations(
            rule(
                "!has(self.additional) || self.additional.all(a, !has(a.nodePort) || "
                "self.additional.filter(b, has(b.nodePort) && b.nodePort == a.nodePort).size() == 1)",
                "services.additional: each nodePort may be used by one Service only",
                fieldPath=".additional",
            ),
        )
    )

    labels: dict[str, _LabelValue] = _labels_field(
        "the operator's client Services (-rw, -ro, -r and the pooler's) and the additional ones"
    )
    annotations: dict[str, _AnnotationValue] = _annotations_field(
        "the operator's client Services (-rw, -ro, -r and the pooler's) and the additional ones"
    )
    additional: list[AdditionalService] = Field(
        default_factory=list,
        max_length=MAX_ADDITIONAL,
        description="Services of type NodePort or LoadBalancer the operator creates, keeps and removes.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @model_validator(mode="after")
    def _consistent(self) -> ServicesSpec:
        problems = label_problems("services.labels", self.labels)
        problems += annotation_problems("services.annotations", self.annotations)
        seen_names: set[str] = set()
        seen_ports: set[int] = set()
        for extra in self.additional:
            problems += extra.problems()
            if extra.name in seen_names:
                problems.append(f"services.additional[{extra.name}]: the name is used twice")
            seen_names.add(extra.name)
            if extra.node_port is not None:
                if extra.node_port in seen_ports:
                    problems.append(f"services.additional[{extra.name}].nodePort: {extra.node_port} is "
                                    "used by another Service")  # fmt: skip
                seen_ports.add(extra.node_port)
        if problems:
            raise ValueError("; ".join(problems))
        return self


def operator_service_names(cluster_name: str) -> tuple[str, ...]:
    """The Services the operator names after the cluster (specs/names.py, specs/pooler.py): no additional
    Service may take one of them."""
    return (
        cluster_name,
        *(f"{cluster_name}-{suffix}" for suffix in ("rw", "ro", "r", "pooler-rw", "pooler-ro")),
    )


def additional_problems(
    cluster_name: str, services: ServicesSpec, pooler_sides: tuple[str, ...]
) -> list[str]:
    """What the whole cluster refuses in spec.services: a name the operator uses, a pooler side that does
    not run."""
    problems = []
    reserved = operator_service_names(cluster_name)
    for extra in services.additional:
        where = f"services.additional[{extra.name}]"
        if extra.name in reserved:
            problems.append(f"{where}.name: {extra.name!r} is one of the operator's own Service names")
        if extra.target.startswith("pooler-") and extra.target.removeprefix("pooler-") not in pooler_sides:
            side = extra.target.removeprefix("pooler-")
            need = "spec.pooler" if side == "rw" else "spec.pooler with readOnly: true"
            problems.append(f"{where}.target: {extra.target} needs {need}")
    return problems


# The same checks as root CEL rules (they need metadata.name and spec.pooler).
ROOT_SERVICES_RULES: tuple[dict[str, str], ...] = (
    rule(
        "!has(self.spec.services) || !has(self.spec.services.additional) || "
        # Cheap for the API server's cost estimate: no concatenation of the (unbounded) metadata.name.
        "self.spec.services.additional.all(a, !a.name.startsWith(self.metadata.name) || "
        "!(a.name.size() == self.metadata.name.size() || "
        "a.name.substring(self.metadata.name.size()) in ['-rw', '-ro', '-r', '-pooler-rw', '-pooler-ro']))",
        "spec.services.additional: a name may not be one of the operator's own Service names "
        "(<name>, -rw, -ro, -r, -pooler-rw, -pooler-ro)",
    ),
    rule(
        "!has(self.spec.services) || !has(self.spec.services.additional) || "
        "self.spec.services.additional.all(a, !has(a.target) || !a.target.startsWith('pooler-') || "
        "(has(self.spec.pooler) && (a.target == 'pooler-rw' || "
        "(has(self.spec.pooler.readOnly) && self.spec.pooler.readOnly))))",
        "spec.services.additional: target pooler-rw needs spec.pooler, pooler-ro needs spec.pooler.readOnly",
    ),
)
