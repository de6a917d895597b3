"""Typed reads of raw Kubernetes objects: the dicts the API server, the informers and lightkube's
`to_dict()` give. Every field may be missing (a desired object before it exists, a partial watch body,
a status not yet written), so each reader answers with an empty value instead of raising.

A leaf: imports nothing of pg_operator, so every layer may use it.
"""

from collections.abc import Mapping, Sequence
from typing import Any

Obj = Mapping[str, Any]
_EMPTY: Mapping[str, Any] = {}


def meta(obj: Obj | None) -> Mapping[str, Any]:
    return (obj or _EMPTY).get("metadata") or _EMPTY


def name(obj: Obj | None) -> str:
    return str(meta(obj).get("name") or "")


def namespace(obj: Obj | None) -> str:
    return str(meta(obj).get("namespace") or "")


def uid(obj: Obj | None) -> str:
    return str(meta(obj).get("uid") or "")


def resource_version(obj: Obj | None) -> str | None:
    """None when the object (or its version) is unknown: a write memo tells that apart from a version."""
    rv = meta(obj).get("resourceVersion")
    return str(rv) if rv else None


def generation(obj: Obj | None) -> int:
    return int(meta(obj).get("generation") or 0)


def labels(obj: Obj | None) -> Mapping[str, str]:
    return meta(obj).get("labels") or _EMPTY


def label(obj: Obj | None, key: str) -> str:
    return str(labels(obj).get(key) or "")


def annotations(obj: Obj | None) -> Mapping[str, str]:
    return meta(obj).get("annotations") or _EMPTY


def annotation(obj: Obj | None, key: str) -> str:
    return str(annotations(obj).get(key) or "")


def deleting(obj: Obj | None) -> bool:
    """The object has a deletionTimestamp: it is going (finalizers may still hold it)."""
    return bool(meta(obj).get("deletionTimestamp"))


def owner_references(obj: Obj | None) -> Sequence[Mapping[str, Any]]:
    return meta(obj).get("ownerReferences") or ()


def spec(obj: Obj | None) -> Mapping[str, Any]:
    return (obj or _EMPTY).get("spec") or _EMPTY


def status(obj: Obj | None) -> Mapping[str, Any]:
    return (obj or _EMPTY).get("status") or _EMPTY


def condition(status_: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of this type in a status (not a whole object), or None."""
    for cond in (status_ or _EMPTY).get("conditions") or ():
        if cond.get("type") == type_:
            return dict(cond)
    return None


def condition_status(status_: Mapping[str, Any] | None, type_: str) -> str:
    """ "True", "False", "Unknown", or "" when the condition is absent."""
    return str((condition(status_, type_) or _EMPTY).get("status") or "")
