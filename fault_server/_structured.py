"""Structured outputs: the JSON content that answers a request's ``response_format`` (chat)
or ``text.format`` (Responses), and the arguments of a tool call that fit the tool's own
schema (chat ``function.parameters``, Responses ``parameters``, Anthropic
``input_schema``), so an SDK's ``parse()`` (with pydantic tools too) gets an object it can
validate.

The instance is built from the schema the client sent: every property of an object (strict
schemas require them all), strings carry the echo text, numbers are 0, booleans false,
arrays empty, the first choice of an ``enum``/``anyOf``/``oneOf``, ``$ref`` followed into
``$defs``/``definitions``. A schema is the client's input: the work is bounded by a node
budget and a depth, whatever it nests or refers to, and past either the value is ``null``;
each string holds at most `MAX_TEXT` characters of the echo text, however long the message.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_NODES", "MAX_TEXT", "json_answer", "tool_arguments"]

MAX_NODES = 1_000  # values built per answer; a self-referring schema stops here
MAX_TEXT = 256  # characters of the echo text in each string: 1,000 of them stay small
_MAX_DEPTH = 32


def json_answer(spec: object, text: str) -> str | None:
    """The JSON text answering a ``response_format``/``text.format`` value ``spec``, or None
    when it asks for plain text (absent, ``{"type": "text"}``, or not a JSON request).

    ``{"type": "json_object"}`` gets ``{"text": <text>}``; ``{"type": "json_schema", ...}``
    an instance of its schema (chat nests it as ``json_schema.schema``, Responses has it at
    ``schema``).
    """
    if not isinstance(spec, dict):
        return None
    text = text[:MAX_TEXT]
    kind = spec.get("type")
    if kind == "json_object":
        return json.dumps({"text": text})
    if kind != "json_schema":
        return None
    holder = spec.get("json_schema", spec)
    schema = holder.get("schema") if isinstance(holder, dict) else None
    if not isinstance(schema, dict):
        return json.dumps({"text": text})
    return json.dumps(_Builder(schema, text).value(schema, 0))


def tool_arguments(schema: object, text: str) -> str:
    """The JSON arguments of a call to a tool whose parameters are ``schema``: an instance
    of it, strings holding (at most `MAX_TEXT` characters of) ``text``; ``{"text": text}``
    for a tool whose schema names no properties (any object fits it)."""
    if isinstance(schema, dict) and _names_properties(schema):
        built = _Builder(schema, text[:MAX_TEXT]).value(schema, 0)
        if isinstance(built, dict):
            return json.dumps(built)
    return json.dumps({"text": text})


def _names_properties(schema: dict[str, Any]) -> bool:
    return any(key in schema for key in ("properties", "$ref", "anyOf", "oneOf", "allOf"))


class _Builder:
    def __init__(self, root: dict[str, Any], text: str) -> None:
        self.root = root
        self.text = text
        self.left = MAX_NODES

    def value(self, schema: object, depth: int) -> Any:
        self.left -= 1
        if not isinstance(schema, dict) or depth > _MAX_DEPTH or self.left < 0:
            return None
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self.value(self._resolve(ref), depth + 1)
        if "const" in schema:
            return schema["const"]
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return enum[0]
        for key in ("anyOf", "oneOf", "allOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                chosen = next((o for o in options if not _is_null(o)), options[0])
                return self.value(chosen, depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind == "object" or (kind is None and isinstance(schema.get("properties"), dict)):
            properties = schema.get("properties")
            if not isinstance(properties, dict):
                return {}
            built: dict[str, Any] = {}
            for name, sub in properties.items():
                if self.left <= 0:
                    break  # out of budget: the rest is left out
                built[str(name)] = self.value(sub, depth + 1)
            return built
        if kind == "string":
            return self.text
        if kind == "array":
            return []
        return _SCALARS.get(kind)

    def _resolve(self, ref: str) -> object:
        # Local references only ("#/$defs/Name", "#/definitions/Name", "#"); anything else
        # is not followed.
        if ref == "#":
            return self.root
        parts = ref.removeprefix("#/").split("/")
        if not ref.startswith("#/") or len(parts) != 2:
            return None
        defs = self.root.get(parts[0])
        return defs.get(parts[1]) if isinstance(defs, dict) else None


_SCALARS: dict[object, Any] = {"integer": 0, "number": 0, "boolean": False}


def _is_null(schema: object) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null"
