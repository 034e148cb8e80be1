"""Tool definitions and response-format schemas: a fixed layer of the budget.

A chat request that declares tools pays for them in prompt tokens: the
provider renders every function into the prompt (a TypeScript-like
``namespace functions`` block: name, description, each parameter with its type,
description and allowed values). The messages alone say nothing of it, so a
request with 40 tools is billed thousands of tokens ContextLab would not see.

How the layer is counted (tiktoken, the profile's encoding), per request:

* each function: 7 + tokens of ``"<name>:<description>"``;
* if it has parameters: 3, then per parameter 3 + tokens of
  ``"<key>:<type>:<description without a final period>"``; a parameter with an
  ``enum`` adds −3 + Σ (3 + tokens of the value); nested object parameters are
  counted the same way, one level down;
* 12 once for the whole block.

These are the per-item costs OpenAI's chat models (gpt-4o family, o200k_base)
bill, measured against their reported ``prompt_tokens``; other providers render
tools their own way, so there the layer is an estimate.

A ``response_format`` of type ``json_schema`` costs the tokens of its name and
of its schema as compact JSON (an estimate: the provider does not document its
rendering); ``text`` and ``json_object`` cost nothing here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from contextlab.engine.core.errors import MalformedInput
from contextlab.engine.core.tokens import TokenCounter
from contextlab.engine.core.unicode import holds_nul

FUNCTION_TOKENS = 7
PARAMETERS_TOKENS = 3
PARAMETER_TOKENS = 3
ENUM_TOKENS = -3
ENUM_VALUE_TOKENS = 3
TOOLS_END_TOKENS = 12


def _refuse_nul(value: Any, field: str) -> None:
    # The schemas are part of the engine's saved state: a NUL no PostgreSQL
    # text or JSON column holds would fail at save, after the turn ran.
    if holds_nul(value):
        raise MalformedInput(f"{field} holds a NUL character (\\u0000), which cannot be stored", field=field)


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """Tool definitions as the OpenAI chat API takes them, or ``MalformedInput``."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise MalformedInput("tools must be a list of tool definitions", field="tools")
    for index, tool in enumerate(tools):
        _refuse_nul(tool, f"tools[{index}]")
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or tool.get("type", "function") != "function":
            raise MalformedInput("each tool must be {\"type\": \"function\", \"function\": {\"name\": …}}",
                                 field=f"tools[{index}]")
    return list(tools)


def check_response_format(response_format: Any) -> dict[str, Any] | None:
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise MalformedInput("response_format must be an object", field="response_format")
    _refuse_nul(response_format, "response_format")
    return dict(response_format)


def _parameter_tokens(counter: TokenCounter, properties: Mapping[str, Any]) -> int:
    tokens = 0
    for key, spec in properties.items():
        spec = spec if isinstance(spec, Mapping) else {}
        tokens += PARAMETER_TOKENS
        kind = spec.get("type", "")
        kind = "|".join(str(k) for k in kind) if isinstance(kind, list) else str(kind)
        description = str(spec.get("description") or "").removesuffix(".")
        enum = spec.get("enum")
        if isinstance(enum, Sequence) and not isinstance(enum, str) and enum:
            tokens += ENUM_TOKENS + sum(ENUM_VALUE_TOKENS + counter.count_text(str(v)) for v in enum)
        tokens += counter.count_text(f"{key}:{kind}:{description}")
        nested = spec.get("properties")
        if not isinstance(nested, Mapping) and isinstance(spec.get("items"), Mapping):
            nested = spec["items"].get("properties")
        if isinstance(nested, Mapping) and nested:
            tokens += PARAMETERS_TOKENS + _parameter_tokens(counter, nested)
    return tokens


def tool_tokens(counter: TokenCounter, tools: Sequence[Mapping[str, Any]]) -> int:
    if not tools:
        return 0
    tokens = TOOLS_END_TOKENS
    for tool in tools:
        function = tool.get("function") or {}
        name = str(function.get("name") or "")
        description = str(function.get("description") or "")
        tokens += FUNCTION_TOKENS + counter.count_text(f"{name}:{description}")
        parameters = function.get("parameters") or {}
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        if isinstance(properties, Mapping) and properties:
            tokens += PARAMETERS_TOKENS + _parameter_tokens(counter, properties)
    return tokens


def response_format_tokens(counter: TokenCounter, response_format: Mapping[str, Any] | None) -> int:
    if not response_format or response_format.get("type") != "json_schema":
        return 0
    spec = response_format.get("json_schema") or {}
    if not isinstance(spec, Mapping):
        return 0
    schema = json.dumps(spec.get("schema") or {}, ensure_ascii=False, separators=(",", ":"))
    return counter.count_text(str(spec.get("name") or "")) + counter.count_text(schema)


def schema_tokens(counter: TokenCounter, tools: Sequence[Mapping[str, Any]],
                  response_format: Mapping[str, Any] | None) -> int:
    """The whole layer: tool definitions plus the response-format schema."""
    return tool_tokens(counter, tools) + response_format_tokens(counter, response_format)
