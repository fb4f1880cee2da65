"""A strict JSON-schema validator over Hyperswitch's patched OpenAPI contract.

:func:`validate` checks a JSON value against a component schema of the spec that
``tests/contract/patch_spec.py`` patches (the shared ``hyperswitch-openapi-v1.json``), made
strict the way a faithful sandbox needs:

- ``$ref`` to ``#/components/schemas/X`` resolve inside one document (``#/definitions/X``);
- OpenAPI 3.0 ``nullable: true`` becomes a JSON-schema ``null`` type (and a ``null`` enum
  member); ``nullable`` without ``type`` was already rewritten by patch 8;
- ``allOf`` parts are merged into one object schema, and a ``oneOf``/``anyOf`` part is
  distributed over the others (``PaymentMethodDataResponseWithBilling`` is ``allOf
  [oneOf [{card}, {wallet}, ...], {billing}]``: each variant plus ``billing``);
- every object schema that declares ``properties`` is **closed** (``additionalProperties:
  false``) unless the spec says otherwise; free-form objects (``metadata``: ``type: object``
  without ``properties``) stay open;
- ``format: date-time`` and ``date`` are checked.

Two things are adjusted on top of patch_spec's patches, each a contradiction inside the spec
itself rather than a guess about the server (see :data:`SCHEMA_PATCHES`):

1. ``PaymentsResponse.amount_capturable`` and ``RefundResponse.amount`` carry utoipa's
   documentation ``minimum = 100``. ``amount_capturable``'s own description says it is 0 once
   captured (every succeeded payment), and a refund of 50 cents is a valid ``MinorUnit``; the
   minimum is dropped for those two fields.
2. ``POST /payments``, ``POST /payments/{id}`` and ``POST /payments/{id}/confirm`` document
   ``PaymentsCreateResponseOpenApi``, a documentation copy of ``PaymentsResponse`` that lacks
   ``unified_code``/``unified_message``/``customer``/``capture_on``. The server serialises
   ``PaymentsResponse`` for them, and the processor interface says ``unified_code`` appears on
   the payment object a declined confirm returns, so :func:`response_schema` answers
   ``PaymentsResponse`` for those operations (``test_sandbox_schema`` pins the difference).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable
from datetime import date, datetime
from typing import Any, Final

import jsonschema
from jsonschema import Draft4Validator, FormatChecker

from tests.contract.patch_spec import load_spec, patch_spec, require_spec

JSON = dict[str, Any]

_COMPONENTS: Final = "#/components/schemas/"
_DEFINITIONS: Final = "#/definitions/"
_COMPOSITIONS: Final = ("oneOf", "anyOf")

#: (schema, property) pairs whose documentation-only ``minimum`` is dropped (see module doc).
SCHEMA_PATCHES: Final = (
    ("PaymentsResponse", "amount_capturable"),
    ("PaymentsCreateResponseOpenApi", "amount_capturable"),
    ("RefundResponse", "amount"),
)

#: Operations documented with the doc-only create schema, validated as ``PaymentsResponse``.
_CREATE_SCHEMA: Final = "PaymentsCreateResponseOpenApi"


@functools.cache
def patched_spec() -> JSON:
    """The spec with patch_spec's patches and :data:`SCHEMA_PATCHES` applied (cached)."""
    spec = patch_spec(load_spec(require_spec("the sandbox's contract checks")))
    schemas: JSON = spec["components"]["schemas"]
    for name, prop in SCHEMA_PATCHES:
        schemas[name]["properties"][prop].pop("minimum", None)
    return spec


class _Normalizer:
    """Turns OpenAPI 3.0 component schemas into strict draft-4 JSON schemas."""

    def __init__(self, components: JSON) -> None:
        self._raw = components
        self._done: dict[str, JSON] = {}
        self._busy: set[str] = set()

    def definitions(self) -> JSON:
        for name in self._raw:
            self.component(name)
        return self._done

    def component(self, name: str) -> JSON | None:
        """The normalized component ``name`` (``None`` while it is being built: a cycle)."""
        if name in self._done:
            return self._done[name]
        if name in self._busy:
            return None
        self._busy.add(name)
        try:
            result: JSON = self.node(self._raw[name])
        finally:
            self._busy.discard(name)
        self._done[name] = result
        return result

    def node(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.node(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return {"$ref": _DEFINITIONS + str(node["$ref"]).removeprefix(_COMPONENTS)}
        out: JSON = {}
        for key, value in node.items():
            if key in ("properties", "patternProperties"):
                out[key] = {name: self.node(sub) for name, sub in value.items()}
            elif key in ("items", "additionalProperties", "not"):
                out[key] = self.node(value) if isinstance(value, dict) else value
            elif key in ("allOf", "anyOf", "oneOf"):
                out[key] = [self.node(sub) for sub in value]
            elif key in ("discriminator", "example", "examples", "xml", "externalDocs"):
                continue
            else:
                out[key] = copy.deepcopy(value)
        if out.pop("nullable", False) is True and "type" in out:
            kinds = out["type"] if isinstance(out["type"], list) else [out["type"]]
            out["type"] = [*kinds, "null"]
            if "enum" in out and None not in out["enum"]:
                out["enum"] = [*out["enum"], None]
        if "allOf" in out:
            parts = out.pop("allOf")
            merged = self._merge(parts)
            if out and not set(out) <= {"description", "title", "default", "deprecated"}:
                return {"allOf": [merged, out]}
            return merged
        return _close(out)

    # -- allOf merging ---------------------------------------------------------------------

    def _inline(self, part: JSON) -> JSON:
        ref = part.get("$ref")
        if isinstance(ref, str) and set(part) == {"$ref"}:
            target = self.component(ref.removeprefix(_DEFINITIONS))
            if target is not None:
                return target
        return part

    def _merge(self, parts: list[JSON]) -> JSON:
        if len(parts) == 1:
            return parts[0]
        flat: list[JSON] = []
        for part in parts:
            inlined = self._inline(part)
            if set(inlined) == {"allOf"}:
                flat.extend(self._inline(p) for p in inlined["allOf"])
            else:
                flat.append(inlined)
        for index, part in enumerate(flat):
            keyword = next((k for k in _COMPOSITIONS if k in part), None)
            if keyword is not None and "properties" not in part:
                rest = flat[:index] + flat[index + 1 :]
                return {keyword: [self._merge([self._inline(v), *rest]) for v in part[keyword]]}
        if all(_is_object(part) for part in flat):
            properties: JSON = {}
            required: list[str] = []
            for part in flat:
                for name, sub in part.get("properties", {}).items():
                    properties[name] = (
                        {"allOf": [properties[name], sub]} if name in properties else sub
                    )
                required += [r for r in part.get("required", []) if r not in required]
            merged: JSON = {"type": "object", "properties": properties}
            if required:
                merged["required"] = required
            return _close(merged)
        return {"allOf": flat}


def _is_object(schema: JSON) -> bool:
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return "properties" in schema or (
        "object" in kinds and not any(k in schema for k in _COMPOSITIONS)
    )


def _close(schema: JSON) -> JSON:
    if "properties" in schema and "additionalProperties" not in schema:
        schema["additionalProperties"] = False
    return schema


_FORMATS = FormatChecker(())


@_FORMATS.checks("date-time", raises=ValueError)
def _date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    parsed = datetime.fromisoformat(value)
    return parsed.tzinfo is not None and "T" in value


@_FORMATS.checks("date", raises=ValueError)
def _date(value: object) -> bool:
    if isinstance(value, str):
        date.fromisoformat(value)
    return True


@functools.cache
def _definitions() -> JSON:
    return _Normalizer(patched_spec()["components"]["schemas"]).definitions()


@functools.cache
def _validator(schema_json: str) -> Draft4Validator:
    root = {**json.loads(schema_json), "definitions": _definitions()}
    return Draft4Validator(root, format_checker=_FORMATS)


def errors(schema: JSON, instance: Any) -> list[str]:
    """Every violation of ``schema`` (a schema over ``#/definitions/...``) by ``instance``.

    A failed ``oneOf``/``anyOf`` is reported by the violations of its closest branch (the one
    whose violations lie deepest), so a field added inside a card shows as such.
    """
    validator = _validator(json.dumps(schema, sort_keys=True))
    found = []
    for error in validator.iter_errors(instance):
        for leaf in _leaves(error):
            path = "/".join(str(p) for p in leaf.absolute_path) or "<root>"
            found.append(f"{path}: {leaf.message[:300]}")
    return sorted(found)


def _leaves(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    if not error.context:
        return [error]
    branches: dict[Any, list[jsonschema.ValidationError]] = {}
    for sub in error.context:
        branch = sub.relative_schema_path[0] if sub.relative_schema_path else None
        branches.setdefault(branch, []).extend(_leaves(sub))

    def closeness(leaves: list[jsonschema.ValidationError]) -> tuple[int, int]:
        return (max(len(leaf.absolute_path) for leaf in leaves), -len(leaves))

    return max(branches.values(), key=closeness)


def ref(name: str) -> JSON:
    """A schema that is the component ``name``."""
    return {"$ref": _DEFINITIONS + name}


def validate(schema: JSON | str, instance: Any) -> None:
    """Raise ``AssertionError`` listing every violation (``schema``: a name or a schema)."""
    resolved = ref(schema) if isinstance(schema, str) else schema
    found = errors(resolved, instance)
    if found:
        raise AssertionError("contract violations:\n  " + "\n  ".join(found))


def response_schema(method: str, path: str, status: str = "200") -> JSON:
    """The (normalized) schema of an operation's JSON answer, ``path`` as the spec spells it.

    The doc-only ``PaymentsCreateResponseOpenApi`` is answered as ``PaymentsResponse``.
    """
    operation = patched_spec()["paths"][path][method.lower()]
    content = operation["responses"][status].get("content", {})
    raw = content["application/json"]["schema"]
    if raw == {"$ref": _COMPONENTS + _CREATE_SCHEMA}:
        raw = {"$ref": _COMPONENTS + "PaymentsResponse"}
    normalized: JSON = _Normalizer(patched_spec()["components"]["schemas"]).node(raw)
    return normalized


def component_properties(name: str) -> set[str]:
    """The property names of a component schema (after merging ``allOf``)."""
    schema = _definitions()[name]
    return set(schema.get("properties", {}))


def undeclared(name: str, keys: Iterable[str]) -> set[str]:
    """The ``keys`` that component ``name`` does not declare."""
    return set(keys) - component_properties(name)
