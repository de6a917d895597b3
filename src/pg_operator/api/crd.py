"""CustomResourceDefinitions generated from the pydantic models: one builder for every kind.

pydantic emits JSON Schema (2020-12) with `$defs`/`$ref`, `anyOf: [X, null]` for optional fields and
titles; the API server wants a structural schema: every node typed, no references, no nullable unions,
defaults and value validations inline. `structural_schema` does that conversion, keeping the CEL rules
(`x-kubernetes-validations`) and other `x-kubernetes-*` markers the models carry. `build` wraps a kind's
schemas in its CRD from a `CustomResource`, the small description each kind's module gives.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from pg_operator.api.constants import GROUP, VERSION

# JSON-schema keywords a structural schema may carry as they are.
_KEPT = frozenset(
    {
        "type",
        "description",
        "default",
        "enum",
        "format",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "required",
        "x-kubernetes-int-or-string",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-validations",
    }
)


class SchemaError(ValueError):
    """The models produced a schema shape this converter does not know how to make structural."""


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if key == "x-kubernetes-validations":
            out[key] = [*out.get(key, []), *value]
        else:
            out[key] = value
    return out


def _convert(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    out = _resolve(node, defs, path)
    if "type" not in out and not out.get("x-kubernetes-int-or-string"):
        raise SchemaError(f"{path}: no type")
    return out


def _resolve(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    node = dict(node)
    ref = node.pop("$ref", None)
    if ref is not None:
        # A field of a model type: the model's schema, with the field's own keywords (description,
        # default, CEL rules) laid over it.
        target = defs[ref.removeprefix("#/$defs/")]
        return _merge(_resolve(target, defs, path), _resolve(node, defs, path))
    all_of = node.pop("allOf", None)
    if all_of is not None:
        if len(all_of) != 1:
            raise SchemaError(f"{path}: allOf with {len(all_of)} members")
        return _merge(_resolve(all_of[0], defs, path), _resolve(node, defs, path))

    out: dict[str, Any] = {}
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        if node.get("x-kubernetes-int-or-string"):
            # The one union a structural schema allows; its members carry nothing but their type.
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        else:
            members = [m for m in any_of if m != {"type": "null"}]
            if len(members) != 1:
                raise SchemaError(f"{path}: anyOf with {len(members)} non-null members")
            # Optional field: absent means None; the API server prunes explicit nulls.
            out = _resolve(members[0], defs, path)
            if node.get("default", ...) is None:
                node.pop("default")

    return _keywords(node, defs, path, out)


def _keywords(node: dict[str, Any], defs: dict[str, Any], path: str, out: dict[str, Any]) -> dict[str, Any]:
    """The node's keywords, in their structural form, added to `out`."""
    for key, value in node.items():
        if key == "properties":
            out["properties"] = {name: _convert(sub, defs, f"{path}.{name}") for name, sub in value.items()}
        elif key == "items":
            out["items"] = _convert(value, defs, f"{path}[]")
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out["additionalProperties"] = _convert(value, defs, f"{path}{{}}")
            # `false` (pydantic's extra="forbid") is the API server's pruning anyway.
        elif key == "const":
            out["enum"] = [value]
        elif key == "default" and value is None:
            continue
        elif key in _KEPT:
            out[key] = copy.deepcopy(value)
        elif key in {"title", "$defs"}:
            continue
        else:
            raise SchemaError(f"{path}: keyword {key!r} has no structural equivalent")
    return out


def _without_defaults(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_without_defaults(v) for v in node]
    return node


def structural_schema(model: type[BaseModel], *, defaults: bool = True) -> dict[str, Any]:
    """The model's validation schema (camelCase field names) as a Kubernetes structural schema.
    `defaults=False` leaves out the models' defaults (for the status, which only the operator writes)."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    out = _convert(schema, schema.get("$defs", {}), model.__name__)
    return out if defaults else _without_defaults(out)


@dataclass(frozen=True)
class CustomResource:
    """What tells one kind's CRD from another's: its names, models, root rules, columns, subresources."""

    kind: str
    plural: str
    short: str
    description: str
    spec: type[BaseModel]
    status: type[BaseModel]
    columns: tuple[dict[str, Any], ...]
    # Rules on the whole object (they need metadata.name): x-kubernetes-validations of the root.
    root_rules: tuple[dict[str, str], ...] = ()
    # Beyond `status`, e.g. `scale`.
    subresources: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def source(self) -> str:
        """The file its models are in, relative to the repository (for the generated file's header)."""
        return "src/" + self.spec.__module__.replace(".", "/") + ".py"


def _openapi_schema(kind: CustomResource) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "description": kind.description,
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": structural_schema(kind.spec),
            "status": structural_schema(kind.status, defaults=False),
        },
        "required": ["spec"],
    }
    if kind.root_rules:
        schema["x-kubernetes-validations"] = [dict(r) for r in kind.root_rules]
    return schema


def build(kind: CustomResource) -> dict[str, Any]:
    """The whole CustomResourceDefinition object of one kind."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": kind.name,
            "labels": {"app.kubernetes.io/name": "pg-operator", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.kind.lower(),
                "shortNames": [kind.short],
                "categories": ["pg-operator"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _openapi_schema(kind)},
                    "subresources": {"status": {}, **kind.subresources},
                    "additionalPrinterColumns": [dict(c) for c in kind.columns],
                }
            ],
        },
    }


__all__ = ["CustomResource", "SchemaError", "build", "structural_schema"]
