"""The operator speaks to Patroni's REST API over verified HTTPS only: whatever a pod's annotations say
(a missing `db.example.com/patroni-api-tls` once meant plain HTTP with basic auth), and with no CA to
verify with it does not ask at all and reports why."""

from __future__ import annotations

import base64
import datetime as dt
import ssl
from typing import Any

import pytest

from harness.objects import cluster_model
from harness.pods import instance_pod
from pg_operator.controller.cache import Snapshot
from pg_operator.controller.reconcilers import ReconcileContext
from pg_operator.controller.reconcilers.high_availability import HighAvailabilityReconciler
from pg_operator.orchestration.instances import instances_from_pods
from pg_operator.patroni.client import Endpoint
from pg_operator.specs.tls import new_ca


class NoEvents:
    async def record(self, *_: Any) -> bool:
        return True


def a_pass(*, with_ca: bool) -> tuple[ReconcileContext, Any]:
    cluster = cluster_model()
    pod = instance_pod("orders-db-0", role="primary")
    pod["metadata"]["labels"]["db.example.com/cluster"] = "orders-db"
    pod["metadata"]["annotations"] = {}  # no TLS annotation at all
    pod["status"]["podIP"] = "10.1.0.7"
    children: dict[tuple[str, str], list[dict[str, Any]]] = {("v1", "Pod"): [pod]}
    if with_ca:
        ca = new_ca(cluster, dt.datetime.now(dt.UTC))
        data = {"ca.crt": base64.b64encode(ca.cert_pem).decode()}
        children[("v1", "Secret")] = [{"metadata": {"name": "orders-db-ca"}, "data": data}]
    ctx = ReconcileContext({"metadata": {"name": "orders-db", "namespace": "shop"}}, cluster,
                    Snapshot(None, children), None)  # fmt: skip
    (instance,) = instances_from_pods([pod])
    return ctx, instance


def reconciler() -> HighAvailabilityReconciler:
    return HighAvailabilityReconciler(None, NoEvents())  # type: ignore[arg-type]


def test_a_pod_without_the_tls_annotation_is_still_asked_over_verified_https() -> None:
    ctx, instance = a_pass(with_ca=True)
    endpoint = reconciler().endpoint(ctx, instance)
    assert endpoint is not None
    assert endpoint.url("/cluster") == "https://10.1.0.7:8008/cluster"
    assert endpoint.options()["ssl"].verify_mode == ssl.CERT_REQUIRED
    assert endpoint.options()["server_hostname"] == "orders-db-0.orders-db.shop.svc"
    assert ctx.problem is None


def test_without_a_ca_patroni_is_not_asked_and_the_pass_says_why() -> None:
    ctx, instance = a_pass(with_ca=False)
    assert reconciler().endpoint(ctx, instance) is None
    assert ctx.problem is not None
    reason, message = ctx.problem
    assert reason == "PatroniUnverified"
    assert "orders-db-0" in message and "orders-db-ca" in message


def test_an_endpoint_cannot_be_plain_or_unverified() -> None:
    with pytest.raises((TypeError, ValueError)):
        Endpoint("10.1.0.7")  # type: ignore[call-arg]
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    with pytest.raises(ValueError):
        Endpoint("10.1.0.7", unverified, "orders-db-0.orders-db.shop.svc")
    with pytest.raises(ValueError):
        Endpoint("10.1.0.7", ssl.create_default_context(), "")
