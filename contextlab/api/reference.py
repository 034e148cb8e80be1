"""The API reference page's content, read from the OpenAPI document the code produces.

``/api/docs`` is rendered on the server from :func:`contextlab.api.openapi.schema`,
the same document ``/api/v1/openapi.json`` serves, so the page cannot describe
an API other than the one that answers. No CDN, no script: a plain page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from contextlab.api.openapi import NOT_BLANK

METHODS = ("get", "post", "put", "patch", "delete")


@dataclass
class Field:
    name: str
    type: str
    required: bool = False
    description: str = ""
    where: str = ""


@dataclass
class Response:
    code: str
    description: str
    type: str = ""


@dataclass
class Operation:
    method: str
    path: str
    anchor: str
    summary: str
    description: str
    parameters: list[Field] = field(default_factory=list)
    body: list[Field] = field(default_factory=list)
    body_type: str = ""
    body_required: bool = False
    example: str = ""
    responses: list[Response] = field(default_factory=list)


@dataclass
class Model:
    name: str
    description: str
    fields: list[Field]


def type_text(schema: dict[str, Any] | None) -> str:
    """A short, readable type: ``array of Turn``, ``integer ≥ 1``, ``"a" | "b"``, ``string (uuid), nullable``."""
    if not schema:
        return "any"
    if "$ref" in schema:
        text = schema["$ref"].rsplit("/", 1)[-1]
    elif "oneOf" in schema or "anyOf" in schema:
        text = " or ".join(type_text(s) for s in schema.get("oneOf") or schema.get("anyOf") or ())
    elif "enum" in schema:
        text = " | ".join(json.dumps(v) for v in schema["enum"])
    elif schema.get("type") == "array":
        text = f"array of {type_text(schema.get('items'))}"
    else:
        text = str(schema.get("type", "object"))
        if schema.get("format"):
            text += f" ({schema['format']})"
        bounds = []
        if "minimum" in schema:
            bounds.append(f"≥ {schema['minimum']}")
        if "maximum" in schema:
            bounds.append(f"≤ {schema['maximum']}")
        if "exclusiveMinimum" in schema:
            bounds.append(f"> {schema['exclusiveMinimum']}")
        if "exclusiveMaximum" in schema:
            bounds.append(f"< {schema['exclusiveMaximum']}")
        if "maxLength" in schema:
            bounds.append(f"at most {schema['maxLength']} characters")
        if "minLength" in schema:
            bounds.append(f"at least {schema['minLength']} characters")
        if schema.get("pattern") == NOT_BLANK:
            bounds.append("not only spaces")
        if bounds:
            text += " " + ", ".join(bounds)
    if schema.get("nullable"):
        text += ", nullable"
    return str(text)


def _fields(schema: dict[str, Any], where: str = "") -> list[Field]:
    required = set(schema.get("required", ()))
    return [Field(name=name, type=type_text(prop), required=name in required,
                  description=str(prop.get("description", "")), where=where)
            for name, prop in (schema.get("properties") or {}).items()]


def _json_schema(part: dict[str, Any]) -> dict[str, Any] | None:
    content = part.get("content") or {}
    media = content.get("application/json") or next(iter(content.values()), None)
    return media.get("schema") if media else None


def operations(document: dict[str, Any]) -> list[Operation]:
    found = []
    for path, item in document.get("paths", {}).items():
        shared = item.get("parameters", [])
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            params = [Field(name=p["name"], type=type_text(p.get("schema")), required=bool(p.get("required")),
                            description=str(p.get("description", "")), where=p.get("in", ""))
                      for p in [*shared, *op.get("parameters", [])]]
            entry = Operation(method=method.upper(), path=path, summary=str(op.get("summary", "")),
                              description=str(op.get("description", "")), parameters=params,
                              anchor=op.get("operationId") or f"{method}-{path}".replace("/", "-").strip("-"))
            body = op.get("requestBody")
            if body:
                entry.body_required = bool(body.get("required"))
                schema = _json_schema(body) or {}
                entry.body = _fields(schema)
                entry.body_type = "" if entry.body else type_text(schema)
                media: Any = next(iter((body.get("content") or {}).values()), {})
                example = media.get("example") if isinstance(media, dict) else None
                if example is None and isinstance(schema, dict):
                    example = schema.get("example")
                if example is not None:
                    entry.example = json.dumps(example, indent=2, ensure_ascii=False)
            for code, response in op.get("responses", {}).items():
                if "$ref" in response:
                    name = response["$ref"].rsplit("/", 1)[-1]
                    response = document.get("components", {}).get("responses", {}).get(name, {})
                entry.responses.append(Response(code=str(code), description=str(response.get("description", "")),
                                                type=type_text(_json_schema(response)) if _json_schema(response) else ""))
            found.append(entry)
    return found


def models(document: dict[str, Any]) -> list[Model]:
    return [Model(name=name, description=str(schema.get("description", "")), fields=_fields(schema))
            for name, schema in document.get("components", {}).get("schemas", {}).items()]
