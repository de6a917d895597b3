"""spec.services: the tenant's labels and annotations on the client Services, the additional NodePort and
LoadBalancer Services, and the names and addresses the server certificate must then carry. Tenant input
is hostile: what would change a selector or the operator's ownership is refused naming the field."""

from __future__ import annotations

import datetime as dt
import ipaddress
from typing import Any

import pytest
from cryptography import x509

from harness.objects import cluster_model as cluster
from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.specs import desired_children, selector_labels, tls
from pg_operator.specs import pooler as pooler_specs
from pg_operator.specs.ownership import generated_names
from pg_operator.specs.services import assigned_addresses

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def services_of(children: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in children if c["kind"] == "Service"}


def refused(services: dict[str, Any], **spec: Any) -> str:
    with pytest.raises(ValueError) as err:
        cluster(services=services, **spec)
    return str(err.value)


# --- attacks: what would change a selector or the operator's ownership -----------------------------------


@pytest.mark.parametrize(
    "key",
    [
        CLUSTER_LABEL,
        "app.kubernetes.io/instance",
        "app.kubernetes.io/name",
        "app.kubernetes.io/managed-by",
        "role",
        "db.example.com/pooler",
        "service.kubernetes.io/service-proxy-name",
        "endpointslice.kubernetes.io/managed-by",
        "kubernetes.io/service-name",
    ],
)
def test_a_label_the_operator_sets_or_selects_on_is_refused_naming_it(key: str) -> None:
    message = refused({"labels": {key: "other-db"}})
    assert f"spec.services.labels[{key!r}]" in message
    assert "cannot be overridden" in message


def test_a_label_on_an_additional_service_that_would_take_it_over_is_refused() -> None:
    extra = {"name": "external", "type": "NodePort", "labels": {CLUSTER_LABEL: "victim"}}
    message = refused({"additional": [extra]})
    assert f"services.additional[external].labels[{CLUSTER_LABEL!r}]" in message


def test_the_operators_own_annotation_domain_is_refused() -> None:
    message = refused({"annotations": {"db.example.com/applied-hash": "x"}})
    assert "spec.services.annotations['db.example.com/applied-hash']" in message


@pytest.mark.parametrize("suffix", ["", "-rw", "-ro", "-r", "-pooler-rw", "-pooler-ro"])
def test_an_additional_service_may_not_take_an_operator_service_name(suffix: str) -> None:
    message = refused({"additional": [{"name": f"orders-db{suffix}", "type": "NodePort"}]})
    assert f"spec.services.additional[orders-db{suffix}].name" in message


def test_the_operators_labels_and_selectors_win_on_every_service() -> None:
    got = services_of(
        desired_children(
            cluster(
                services={
                    "labels": {"team": "payments"},
                    "annotations": {"a/b": "c"},
                    "additional": [{"name": "ext", "type": "NodePort"}],
                }
            )
        )
    )
    for name in ("orders-db-rw", "orders-db-ro", "orders-db-r", "ext"):
        labels = got[name]["metadata"]["labels"]
        assert labels[CLUSTER_LABEL] == "orders-db", name
        assert labels["app.kubernetes.io/managed-by"] == "pg-operator", name
        assert labels["team"] == "payments", name
        assert got[name]["metadata"]["annotations"] == {"a/b": "c"}, name
        assert got[name]["metadata"]["ownerReferences"][0]["controller"] is True
    # The headless Service (pod DNS, Patroni) stays the operator's alone.
    assert "team" not in got["orders-db"]["metadata"]["labels"]
    assert got["ext"]["spec"]["selector"] == got["orders-db-rw"]["spec"]["selector"]


# --- validation ------------------------------------------------------------------------------------------


def test_pooler_targets_need_the_pooler_side() -> None:
    assert "needs spec.pooler" in refused({"additional": [{"name": "ext", "target": "pooler-rw"}]})
    message = refused({"additional": [{"name": "ext", "target": "pooler-ro"}]}, pooler={"instances": 1})
    assert "spec.services.additional[ext].target: pooler-ro needs spec.pooler with readOnly: true" in message


def test_source_ranges_are_networks_and_only_for_load_balancers() -> None:
    bad = {"name": "ext", "loadBalancerSourceRanges": ["10.0.0.1/8"]}
    assert "'10.0.0.1/8' must be a network in CIDR form" in refused({"additional": [bad]})
    node_port = {"name": "ext", "type": "NodePort", "loadBalancerSourceRanges": ["10.0.0.0/8"]}
    assert "applies to type LoadBalancer only" in refused({"additional": [node_port]})


def test_a_node_port_is_used_once_and_in_range() -> None:
    twice = [
        {"name": "a", "type": "NodePort", "nodePort": 30432},
        {"name": "b", "type": "NodePort", "nodePort": 30432},
    ]
    message = refused({"additional": twice})
    assert "services.additional[b].nodePort: 30432 is used by another Service" in message
    assert "nodePort" in refused({"additional": [{"name": "a", "nodePort": 80}]})


def test_hosts_are_dns_names_or_addresses() -> None:
    message = refused({"additional": [{"name": "a", "hosts": ["db.example.org", "Bad_Host"]}]})
    assert "'Bad_Host' must be a lower-case DNS name" in message


# --- rendering -------------------------------------------------------------------------------------------


def test_node_port_service_routes_to_its_target() -> None:
    spec = {
        "additional": [
            {"name": "ext-rw", "type": "NodePort", "nodePort": 30432, "externalTrafficPolicy": "Local"},
            {"name": "ext-ro", "target": "ro", "loadBalancerSourceRanges": ["10.0.0.0/8"]},
            {"name": "ext-pool", "target": "pooler-rw", "type": "NodePort"},
        ]
    }
    c = cluster(services=spec, pooler={"instances": 1})
    got = services_of(desired_children(c))
    rw = got["ext-rw"]["spec"]
    assert rw["type"] == "NodePort" and rw["externalTrafficPolicy"] == "Local"
    assert rw["ports"] == [
        {"name": "postgresql", "port": 5432, "targetPort": "postgresql", "protocol": "TCP", "nodePort": 30432}
    ]
    assert rw["selector"] == {**selector_labels(c), "role": "primary"}
    ro = got["ext-ro"]["spec"]
    assert ro["type"] == "LoadBalancer" and ro["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    assert ro["selector"] == {**selector_labels(c), "role": "replica"}
    assert got["ext-pool"]["spec"]["selector"] == pooler_specs.service(c, "rw")["spec"]["selector"]


def test_the_pooler_service_carries_the_tenant_metadata_under_the_operators() -> None:
    c = cluster(services={"labels": {"team": "payments"}}, pooler={"instances": 1})
    svc = pooler_specs.service(c, "rw")
    assert svc["metadata"]["labels"]["team"] == "payments"
    assert svc["metadata"]["labels"][CLUSTER_LABEL] == "orders-db"


def test_additional_names_are_the_clusters_so_a_foreign_service_there_is_a_conflict() -> None:
    c = cluster(services={"additional": [{"name": "external", "type": "NodePort"}]})
    assert ("v1", "Service", "external") in generated_names(c)


# --- TLS names follow ------------------------------------------------------------------------------------


def test_the_server_certificate_names_every_additional_service_and_declared_host() -> None:
    hosts = ["db.example.org", "10.1.2.3", "fd00::1"]
    c = cluster(services={"additional": [{"name": "external", "type": "NodePort", "hosts": hosts}]})
    names = tls.server_dns_names(c)
    for name in (
        "external",
        "external.shop",
        "external.shop.svc",
        "external.shop.svc.cluster.local",
        "db.example.org",
    ):
        assert name in names
    assert "10.1.2.3" not in names
    assert tls.server_ip_addresses(c) == ["127.0.0.1", "::1", "10.1.2.3", "fd00::1"]
    ca = tls.new_ca(c, NOW)
    cert = x509.load_pem_x509_certificate(tls.issue_server(c, ca, NOW).cert_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "db.example.org" in sans.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("10.1.2.3") in sans.get_values_for_type(x509.IPAddress)


def test_declaring_a_host_renews_the_server_certificate() -> None:
    before = cluster()
    ca = tls.new_ca(before, NOW)
    server = tls.issue_server(before, ca, NOW)
    secret = {
        "data": {
            tls.TLS_CERT_KEY: tls.b64(server.cert_pem),
            tls.TLS_KEY_KEY: tls.b64(server.key_pem),
            tls.CA_CERT_KEY: tls.b64(ca.cert_pem),
        }
    }
    assert tls.server_renewal(before, ca, secret, NOW) is None
    with_name = cluster(services={"additional": [{"name": "ext", "hosts": ["db.example.org"]}]})
    why = tls.server_renewal(with_name, ca, secret, NOW)
    assert why == "the names the server certificate must carry changed"
    with_address = cluster(services={"additional": [{"name": "orders-db-ext", "hosts": ["10.1.2.3"]}]})
    assert "orders-db-ext" in tls.server_dns_names(with_address)
    assert tls.server_renewal(with_address, ca, secret, NOW) is not None


def test_addresses_a_load_balancer_assigned_are_named_by_the_certificate() -> None:
    c = cluster(services={"additional": [{"name": "ext", "target": "ro"}]})
    lb = {
        "metadata": {"name": "ext"},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}, {"hostname": "lb-1.example.net"}]}},
    }
    elsewhere = {
        "metadata": {"name": "not-declared"},
        "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}},
    }
    hostile = {
        "metadata": {"name": "ext"},
        "status": {"loadBalancer": {"ingress": [{"hostname": "Bad Name"}]}},
    }
    assigned = assigned_addresses(c, [lb, elsewhere, hostile])
    assert assigned == ["203.0.113.7", "lb-1.example.net"]
    assert "lb-1.example.net" in tls.server_dns_names(c, assigned=assigned)
    assert "203.0.113.7" in tls.server_ip_addresses(c, assigned)
    ca = tls.new_ca(c, NOW)
    server = tls.issue_server(c, ca, NOW)
    secret = {
        "data": {
            tls.TLS_CERT_KEY: tls.b64(server.cert_pem),
            tls.TLS_KEY_KEY: tls.b64(server.key_pem),
            tls.CA_CERT_KEY: tls.b64(ca.cert_pem),
        }
    }
    assert tls.server_renewal(c, ca, secret, NOW) is None
    assert tls.server_renewal(c, ca, secret, NOW, assigned=assigned) is not None  # assigned: re-issued
    reissued = tls.issue_server(c, ca, NOW, assigned)
    secret["data"][tls.TLS_CERT_KEY] = tls.b64(reissued.cert_pem)
    secret["data"][tls.TLS_KEY_KEY] = tls.b64(reissued.key_pem)
    assert tls.server_renewal(c, ca, secret, NOW, assigned=assigned) is None
