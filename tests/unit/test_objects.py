from pg_operator import objects

POD = {
    "metadata": {
        "name": "db-0",
        "namespace": "shop",
        "uid": "u1",
        "resourceVersion": "42",
        "generation": 3,
        "labels": {"role": "primary"},
        "annotations": {"status": "{}"},
        "deletionTimestamp": "2026-12-02T00:00:00Z",
        "ownerReferences": [{"kind": "StatefulSet", "name": "db"}],
    },
    "spec": {"nodeName": "n1"},
    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
}


def test_reads_every_field() -> None:
    assert objects.name(POD) == "db-0"
    assert objects.namespace(POD) == "shop"
    assert objects.uid(POD) == "u1"
    assert objects.resource_version(POD) == "42"
    assert objects.generation(POD) == 3
    assert objects.label(POD, "role") == "primary"
    assert objects.annotation(POD, "status") == "{}"
    assert objects.deleting(POD)
    assert objects.owner_references(POD)[0]["name"] == "db"
    assert objects.spec(POD)["nodeName"] == "n1"
    assert objects.condition(objects.status(POD), "Ready") == {"type": "Ready", "status": "True"}
    assert objects.condition_status(objects.status(POD), "Ready") == "True"


def test_missing_parts_read_as_empty() -> None:
    for obj in (None, {}, {"metadata": None, "status": None}):
        assert objects.name(obj) == ""
        assert objects.resource_version(obj) is None
        assert objects.generation(obj) == 0
        assert objects.label(obj, "role") == ""
        assert objects.annotation(obj, "x") == ""
        assert not objects.deleting(obj)
        assert list(objects.owner_references(obj)) == []
        assert objects.condition(objects.status(obj), "Ready") is None
        assert objects.condition_status(objects.status(obj), "Ready") == ""
