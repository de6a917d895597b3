"""A CA rotation's steps, decided from the Secrets and what each instance reports it loaded."""

from __future__ import annotations

import datetime as dt
from typing import Any

from harness.objects import cluster_model as cluster
from pg_operator.specs.ca_rotation import (
    TRUST_PERIOD,
    Authority,
    authority_from_secret,
    authority_patch,
    authority_secret,
    finish,
    plan,
    secret_digest,
    start,
)
from pg_operator.specs.tls import KeyPair, issue_client, issue_server, new_ca, server_renewal, server_secret

NOW = dt.datetime(2026, 12, 2, 10, 0, tzinfo=dt.UTC)
C = cluster()


def leaves(ca: KeyPair, trust: bytes) -> dict[str, Any]:
    """Secret <name>-server-tls with leaves `ca` signed, trusting `trust`."""
    return server_secret(C, ca, issue_server(C, ca, NOW), issue_client(ca, "replicator", NOW), trust)


def test_a_request_starts_one_rotation_and_only_one_per_value() -> None:
    steady = Authority(new_ca(C, NOW))
    secret = leaves(steady.current, steady.trust_pem())
    assert plan(steady, None, secret, {}, NOW).start is False
    assert plan(steady, "r1", secret, {}, NOW).start is True
    done = Authority(steady.current, rotated_for="r1")
    assert plan(done, "r1", secret, {}, NOW).start is False  # that request was acted on
    assert plan(done, "r2", secret, {}, NOW).start is True
    # A CA with a third of its life left rotates without being asked.
    assert plan(steady, None, secret, {}, NOW + dt.timedelta(days=2500)).start is True


def test_the_rotation_trusts_both_then_reissues_then_drops_the_old_ca() -> None:
    old = Authority(new_ca(C, NOW))
    before = leaves(old.current, old.trust_pem())
    later = NOW + dt.timedelta(seconds=1)
    rotating = start(old, "r1", new_ca(C, later), later)
    assert rotating.previous == old.current and rotating.rotated_for == "r1"
    assert rotating.trust_pem() == rotating.current.cert_pem + old.current.cert_pem

    # 1. trust: the leaves stay the old CA's; the Secret must carry both CAs first.
    step = plan(rotating, "r1", before, {"db-0": secret_digest(before)}, later)
    assert step.leaf_ca == old.current and not step.finish and "both CAs" in step.waiting
    assert server_renewal(C, step.leaf_ca, before, later, rotating.trust_pem()) == (
        "the trusted certificate authorities changed"
    )
    bundled = leaves(old.current, rotating.trust_pem())
    loaded = {"db-0": secret_digest(bundled), "db-1": secret_digest(bundled)}
    # Every instance has the bundle, but the trust period is not over: wait, and come back when it is.
    step = plan(rotating, "r1", bundled, loaded, later + dt.timedelta(seconds=30))
    assert step.leaf_ca == old.current and step.again_in is not None and 59 <= step.again_in <= 61
    # One instance still runs the old files: wait for it by name.
    step = plan(rotating, "r1", bundled, {**loaded, "db-1": secret_digest(before)}, later + TRUST_PERIOD)
    assert step.leaf_ca == old.current and "db-1" in step.waiting

    # A shorter trust period (pg-operator run --ca-trust-period) ends sooner.
    short = dt.timedelta(seconds=20)
    step = plan(rotating, "r1", bundled, loaded, later + dt.timedelta(seconds=10), trust_period=short)
    assert step.leaf_ca == old.current and step.again_in is not None and 9 <= step.again_in <= 11
    step = plan(rotating, "r1", bundled, loaded, later + short, trust_period=short)
    assert step.leaf_ca == rotating.current

    # 2. re-issue: all trust both and the period passed: the new CA signs.
    step = plan(rotating, "r1", bundled, loaded, later + TRUST_PERIOD)
    assert step.leaf_ca == rotating.current and not step.finish and step.waiting == ""
    assert server_renewal(C, step.leaf_ca, bundled, later, rotating.trust_pem()) == (
        "the certificate authority changed"
    )
    reissued = leaves(rotating.current, rotating.trust_pem())
    step = plan(rotating, "r1", reissued, loaded, later + TRUST_PERIOD)
    assert step.leaf_ca == rotating.current and not step.finish and "db-0" in step.waiting

    # 3. finish: every instance serves the new leaves: the old CA goes, and then the bundle shrinks.
    step = plan(rotating, "r1", reissued, {"db-0": secret_digest(reissued)}, later + TRUST_PERIOD)
    assert step.finish
    finished = finish(rotating)
    assert finished.previous is None and finished.started is None and finished.rotated_for == "r1"
    assert server_renewal(C, finished.current, reissued, later, finished.trust_pem()) == (
        "the trusted certificate authorities changed"
    )
    assert plan(finished, "r1", reissued, {}, later).start is False


def test_the_ca_secret_round_trip_and_its_patches() -> None:
    old = Authority(new_ca(C, NOW))
    rotating = start(old, "r1", new_ca(C, NOW + dt.timedelta(seconds=1)), NOW)
    body = authority_secret(C, rotating)
    assert set(body["data"]) == {"ca.crt", "ca.key", "previous-ca.crt", "previous-ca.key"}
    assert authority_from_secret(body) == rotating
    assert authority_from_secret(authority_secret(C, old)) == old
    patch = authority_patch(finish(rotating), "42")
    assert patch["metadata"]["resourceVersion"] == "42"
    assert patch["data"]["previous-ca.crt"] is None and patch["data"]["previous-ca.key"] is None
    assert patch["metadata"]["annotations"]["db.example.com/ca-rotation-started"] is None
    assert "PRIVATE" not in repr(rotating)
