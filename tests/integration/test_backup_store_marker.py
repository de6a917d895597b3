"""The ownership marker against a real S3 server (moto, authentication on; no Kubernetes needed): the
conditional create lets exactly one of two claimants write it, the read-back names the winner, and the
prefix inspection sees the marker, other objects and adoption evidence the way the decisions expect.
Each call takes its namespace's slot (store_calls): two claimants race only from two namespaces, and a
second call of one namespace while the first is in flight is turned away (StoreBusy) without a request."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.s3 import REGION, S3Server, s3_server
from pg_operator.backup.barman import ObjectStore
from pg_operator.backup.store_ownership import Owner, decide, marker_body, marker_key, parse_marker
from pg_operator.controller.store_client import (
    Deleted,
    StoreAccess,
    StoreBusy,
    StoreError,
    delete_prefix,
    inspect_prefix,
    put_if_absent,
)

BUCKET = "marker-it"
T0 = dt.datetime(2026, 12, 2, 9, 0, tzinfo=dt.UTC)
A, B = Owner("team-a", "dup", "uid-a"), Owner("team-b", "dup", "uid-b")


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("moto")) as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


def access(s3: S3Server, store: ObjectStore, namespace: str = A.namespace) -> StoreAccess:
    """What a cluster of `namespace` calls the store with (its slot is that namespace's)."""
    return StoreAccess(namespace=namespace, bucket=store.bucket, prefix=store.prefix,
                       endpoint_url=s3.endpoint, region=REGION, access_key_id=s3.access_key_id,
                       secret_access_key=s3.secret_access_key)  # fmt: skip


def test_one_of_two_claimants_wins_and_the_other_is_refused(s3: S3Server) -> None:
    store = ObjectStore(bucket=BUCKET, server_name="dup", path="race")
    key = marker_key(store)
    empty = asyncio.run(inspect_prefix(access(s3, store), key, ()))
    assert empty.marker is None and not empty.has_objects
    assert decide(A, store, marker=None, has_objects=False).kind == "claim"

    async def both() -> list[bool]:
        puts = await asyncio.gather(
            put_if_absent(access(s3, store, A.namespace), key, marker_body(A, how="claimed", now=T0)),
            put_if_absent(access(s3, store, B.namespace), key, marker_body(B, how="claimed", now=T0)),
        )
        assert all(p.conditional for p in puts)  # the store honoured If-None-Match
        assert all(p.read_back is not None and parse_marker(p.read_back) == parse_marker(puts[0].read_back
                   or b"") for p in puts)  # fmt: skip
        return [p.created for p in puts]

    created = asyncio.run(both())
    assert sorted(created) == [False, True]
    winner = A if created[0] else B
    loser = B if created[0] else A
    seen = asyncio.run(inspect_prefix(access(s3, store), key, ()))
    assert seen.marker is not None and parse_marker(seen.marker) == winner and not seen.has_objects
    verdict = decide(loser, store, marker=parse_marker(seen.marker), has_objects=seen.has_objects)
    assert verdict.kind == "owned-elsewhere" and winner.uid in verdict.message
    # A second claim by the winner changes nothing (the marker is written once).
    again = asyncio.run(put_if_absent(access(s3, store), key, marker_body(winner, how="claimed", now=T0)))
    assert not again.created and again.read_back == seen.marker


def test_a_second_call_of_one_namespace_in_flight_is_turned_away(s3: S3Server) -> None:
    """Two calls of namespace A at once: the first runs, the second fails at once as StoreBusy and sends
    nothing (its marker is not written); namespace B's call at the same time runs."""
    store_a = ObjectStore(bucket=BUCKET, server_name="busy-a", path="slots")
    store_b = ObjectStore(bucket=BUCKET, server_name="busy-b", path="slots")
    as_a, as_b = marker_body(A, how="claimed", now=T0), marker_body(B, how="claimed", now=T0)

    async def together() -> list[object]:
        return await asyncio.gather(
            put_if_absent(access(s3, store_a, A.namespace), marker_key(store_a), as_a),
            put_if_absent(access(s3, store_a, A.namespace), marker_key(store_a), as_b),
            put_if_absent(access(s3, store_b, B.namespace), marker_key(store_b), as_b),
            return_exceptions=True,
        )

    first, second, other = asyncio.run(together())
    assert isinstance(second, StoreBusy), second
    assert not isinstance(first, BaseException) and not isinstance(other, BaseException), (first, other)
    # The marker under A's prefix is the first call's: the turned-away one sent nothing.
    written = s3.client().get_object(Bucket=BUCKET, Key=marker_key(store_a))["Body"].read()
    assert parse_marker(written) == A
    assert s3.keys(BUCKET, "slots/busy-b/") == [marker_key(store_b)]


def test_inspection_sees_objects_without_a_marker_and_the_evidence(s3: S3Server) -> None:
    store = ObjectStore(bucket=BUCKET, server_name="legacy", path="old")
    client = s3.client()
    client.put_object(Bucket=BUCKET, Key="old/legacy/wals/0000000100000000/000000010000000000000003.gz",
                      Body=b"x")  # fmt: skip
    # A neighbour whose name starts the same is not under this prefix.
    client.put_object(Bucket=BUCKET, Key="old/legacy-2/wals/x", Body=b"x")
    evidence = (
        "old/legacy/base/20261201T010000/",
        "old/legacy/wals/0000000100000000/000000010000000000000003",
    )
    seen = asyncio.run(inspect_prefix(access(s3, store), marker_key(store), evidence))
    assert seen.marker is None and seen.has_objects and seen.evidence_found == 1
    none = asyncio.run(inspect_prefix(access(s3, store), marker_key(store), evidence[:1]))
    assert none.evidence_found is None


def test_a_missing_bucket_is_a_store_error_not_an_empty_prefix(s3: S3Server) -> None:
    store = ObjectStore(bucket="no-such-bucket", server_name="dup")
    with pytest.raises(StoreError, match="NoSuchBucket"):
        asyncio.run(inspect_prefix(access(s3, store), marker_key(store), ()))


def test_deleting_the_owned_prefix_takes_the_marker_and_leaves_the_neighbour(
    s3: S3Server, tmp_path: Path
) -> None:
    store = ObjectStore(bucket=BUCKET, server_name="gone", path="del")
    client = s3.client()
    asyncio.run(put_if_absent(access(s3, store), marker_key(store), marker_body(A, how="claimed", now=T0)))
    client.put_object(Bucket=BUCKET, Key="del/gone/base/x", Body=b"x")
    client.put_object(Bucket=BUCKET, Key="del/gone-2/base/x", Body=b"x")
    assert asyncio.run(delete_prefix(access(s3, store))) == Deleted(2, complete=True)
    assert s3.keys(BUCKET, "del/") == ["del/gone-2/base/x"]
