"""Does an observed object already carry what we would apply? Compare only the fields we set.

Two checks, both cheap and local:
- the desired object's hash, stored in an annotation when we apply it, catches changes of our own intent
  (including fields we stopped setting, which a subset comparison cannot see);
- a subset comparison of every field we set against the observed object catches drift made by others
  (kubectl edit, another controller), tolerant of what the API server normalises (quantities, omitted
  empty/false values, server-defaulted extra fields, list items other managers added to keyed lists).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from pg_operator import objects
from pg_operator.api import quantity
from pg_operator.api.constants import GROUP

HASH_ANNOTATION = f"{GROUP}/applied-hash"

# Top-level fields that are identity, not content.
_IDENTITY = frozenset({"apiVersion", "kind"})
_META_COMPARED = ("labels", "annotations", "ownerReferences")
_LIST_KEYS = ("name", "type", "containerPort", "port", "mountPath", "key")


# Spec fields left out of the hash: immutable fields the builders copy from the existing object (as the
# server stored them, defaults included), so the hash stays that of our intent before and after creation.
HASH_EXCLUDED_SPEC: dict[str, tuple[str, ...]] = {
    "StatefulSet": ("selector", "serviceName", "volumeClaimTemplates", "podManagementPolicy"),
}


def desired_hash(desired: Mapping[str, Any]) -> str:
    """Stable hash of a desired object, ignoring our own hash annotation."""
    body = json.loads(json.dumps(desired, sort_keys=True, default=str))
    spec = body.get("spec")
    if isinstance(spec, dict):
        for name in HASH_EXCLUDED_SPEC.get(str(body.get("kind")), ()):
            spec.pop(name, None)
    meta = body.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    annotations.pop(HASH_ANNOTATION, None)
    if not annotations:
        meta.pop("annotations", None)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def with_hash(desired: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `desired` carrying its hash annotation, ready to apply."""
    body: dict[str, Any] = json.loads(json.dumps(desired, default=str))
    meta = body.setdefault("metadata", {})
    annotations = meta.get("annotations") or {}
    annotations[HASH_ANNOTATION] = desired_hash(desired)
    meta["annotations"] = annotations
    return body


def parse_quantity(value: str) -> Fraction | None:
    try:
        return quantity.parse_quantity(value)
    except ValueError:
        return None


def _empty(value: Any) -> bool:
    return value is None or value is False or value == 0 or value == "" or value == {} or value == []


def _scalar_equal(want: Any, got: Any) -> bool:
    if want == got:
        return True
    if isinstance(want, bool) or isinstance(got, bool):
        return False
    if isinstance(want, str) and isinstance(got, str):
        a, b = parse_quantity(want), parse_quantity(got)
        return a is not None and a == b
    if (isinstance(want, int | float) and isinstance(got, str)) or (
        isinstance(want, str) and isinstance(got, int)
    ):
        # e.g. a quantity given as 1 that the server renders as "1"
        a = parse_quantity(str(want))
        b = parse_quantity(str(got))
        return a is not None and a == b
    return False


def _list_key(items: Sequence[Any]) -> str | None:
    """The field that identifies items of a list of objects, if all items carry the same one."""
    if not items or not all(isinstance(i, Mapping) for i in items):
        return None
    for key in _LIST_KEYS:
        values = [i.get(key) for i in items]
        if all(v is not None for v in values) and len(set(map(str, values))) == len(values):
            return key
    return None


def differences(want: Any, got: Any, path: str = "") -> list[str]:
    """Paths (dotted) where the observed value does not carry the desired one. Empty list: no difference."""
    if isinstance(want, Mapping):
        return _mapping_differences(want, got, path)
    if isinstance(want, list):
        return _list_differences(want, got, path)
    if got is None:
        return [] if _empty(want) else [path]
    return [] if _scalar_equal(want, got) else [path]


def _mapping_differences(want: Mapping[str, Any], got: Any, path: str) -> list[str]:
    if got is None and all(_empty(v) for v in want.values()):
        return []
    if not isinstance(got, Mapping):
        return [path or "."]
    out: list[str] = []
    for k, v in want.items():
        sub = f"{path}.{k}" if path else str(k)
        if k not in got:
            if not _empty(v) and not (isinstance(v, Mapping) and not differences(v, None, sub)):
                out.append(sub)
            continue
        out.extend(differences(v, got[k], sub))
    return out


def _list_differences(want: list[Any], got: Any, path: str) -> list[str]:
    """A list of objects with a key field (containers by name …) is compared item by item on the key;
    any other list position by position."""
    if got is None and not want:
        return []
    if not isinstance(got, list):
        return [path]
    key = _list_key(want)
    out: list[str] = []
    if key is not None:
        by_key = {str(i.get(key)): i for i in got if isinstance(i, Mapping) and i.get(key) is not None}
        for item in want:
            ident = str(item[key])
            sub = f"{path}[{key}={ident}]"
            if ident not in by_key:
                out.append(sub)
            else:
                out.extend(differences(item, by_key[ident], sub))
        return out
    if len(want) != len(got):
        return [path]
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        out.extend(differences(a, b, f"{path}[{i}]"))
    return out


def object_differences(desired: Mapping[str, Any], observed: Mapping[str, Any] | None) -> list[str]:
    """Why `desired` needs applying over `observed`; empty when the observed object already matches.

    `desired` is what we would apply (hash annotation included or not).
    """
    if observed is None:
        return ["<missing>"]
    out: list[str] = []
    obs_meta = objects.meta(observed)
    want_hash = desired_hash(desired)
    if objects.annotation(observed, HASH_ANNOTATION) != want_hash:
        out.append(f"metadata.annotations.{HASH_ANNOTATION}")
    want_meta = dict(desired.get("metadata") or {})
    want_annotations = dict(want_meta.get("annotations") or {})
    want_annotations.pop(HASH_ANNOTATION, None)
    want_meta["annotations"] = want_annotations
    for field in _META_COMPARED:
        if field in want_meta:
            out.extend(differences(want_meta[field], obs_meta.get(field), f"metadata.{field}"))
    for field, value in desired.items():
        if field in _IDENTITY or field == "metadata":
            continue
        out.extend(differences(value, observed.get(field), field))
    return out
