"""The OpenAPI 3 description of the JSON API.

Kept beside the views it describes; ``tests/api/test_openapi.py`` checks that
every route in ``contextlab/api/urls.py`` appears here with its methods. What
the code already declares is taken from it, so it cannot drift: the enums
(policies, turn outcomes, statuses) from the engine's constants and the
models' choices, the profile's knobs from the model, and each operationId from
the name of the view that serves it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from django.db import models
from django.urls import URLPattern, URLResolver, get_resolver

from contextlab.engine.core.messages import ROLES
from contextlab.engine.core.profile import BOUNDS, POLICIES, known_timezones
from contextlab.engine.core.trace import OUTCOMES
from contextlab.engine.memory.pins import MAX_FACT_CHARS
from contextlab.engine.stages.summary.identifiers import KINDS as IDENTIFIER_KINDS
from contextlab.insights.services import MAX_QUERY_CHARS, MAX_RECALL_LIMIT
from contextlab.sessions.models import (
    LIST_KNOBS,
    PROFILE_KNOBS,
    AgentProfile,
    AgentSession,
    CompactionRun,
    SessionMessage,
)
from contextlab.sessions.services.inputs import MAX_INSTRUCTION_LENGTH, MAX_TITLE_LENGTH
from contextlab.support import providers


def _enum(values: Any) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)}


def _knob_schema(name: str) -> dict[str, Any]:
    """A profile knob's schema, from its model field and the engine's bounds."""
    field = AgentProfile._meta.get_field(name)
    assert isinstance(field, models.Field)
    if name in LIST_KNOBS:
        return {"type": "array", "items": {"type": "string"}}
    schema: dict[str, Any]
    if isinstance(field, models.IntegerField):
        schema = {"type": "integer"}
    elif isinstance(field, models.FloatField):
        schema = {"type": "number"}
    else:
        schema = {"type": "string"}
        if field.choices:
            schema["enum"] = [value for value, _ in field.choices]
        if getattr(field, "max_length", None):
            schema["maxLength"] = field.max_length
    if name == "timezone":
        return _ref("Timezone")  # some 600 names: listed once, in components
    if name == "compaction_provider":
        # Users choose among the providers the operator lists ("" is none).
        schema["enum"] = ["", *sorted(providers.configured())]
    bound = BOUNDS.get(name)
    if bound is not None:
        schema.update(minimum=bound.low, maximum=bound.high)
    if field.help_text:
        schema["description"] = str(field.help_text)
    return schema


def knob_schemas() -> dict[str, Any]:
    return {name: _knob_schema(name) for name in PROFILE_KNOBS}


_STR_SCHEMA = {"type": "string"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERROR_TEXT = {
    400: "Bad input: the body names the field at fault",
    401: "Missing or invalid API token",
    404: "No such session (or not yours), or no such turn or run",
    409: "The session is busy: still being imported, or another request holds it",
    413: "The body or the upload is too large",
    422: "Well-formed but refused: profile settings breaking a rule between knobs, an unknown profile or "
         "provider, a turn number the session does not have",
    429: "Too many requests for this API token; retry after the seconds in Retry-After",
    502: "The summary model's provider failed",
    503: "The tokenizer's vocabulary is not installed on the server",
}
_HEADERS = {
    401: {"WWW-Authenticate": {"schema": _STR_SCHEMA, "description": "Bearer realm=\"contextlab\""}},
    429: {"Retry-After": {"schema": {"type": "integer", "minimum": 1}, "required": True,
                          "description": "seconds until the token's window resets"}},
}


def _errors(*codes: int) -> dict[str, Any]:
    """Error answers: every authenticated operation may answer 401 and 429, plus ``codes``."""
    answers: dict[str, Any] = {}
    for code in sorted({401, 429, *codes}):
        answers[str(code)] = _json(_ref("Error"), _ERROR_TEXT[code])
        if code in _HEADERS:
            answers[str(code)]["headers"] = _HEADERS[code]
    return answers


def _request(schema: dict[str, Any], *, required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def _body(properties: dict[str, Any], *, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A JSON request body: the server refuses a field it does not list here (400 naming the field)."""
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


API_PREFIX = "api/v1/"  # where contextlab/urls.py mounts the API (and the insights' recall)
SESSION_ID = {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}

# The most rows one page of a list holds.
MAX_PAGE = 200

RUN_ACTIONS = {
    "accept": "Commit exactly the reviewed draft of a dry run (no second compactor call)",
    "discard": "Drop the draft of a dry run; nothing was committed",
    "cancel": "Cancel a queued or running compaction or dry run; nothing of it is committed",
}
RUN_ID = {"name": "run_id", "in": "path", "required": True,
          "schema": {"type": "integer", "format": "int64", "minimum": 0}}


def _run_action(action: str, summary: str) -> dict[str, Any]:
    ok: dict[str, Any] = {"run": {"$ref": "#/components/schemas/CompactionRun"}}
    if action == "accept":
        ok["turn"] = {"$ref": "#/components/schemas/Turn"}
    return {
        "parameters": [SESSION_ID, RUN_ID],
        "post": {
            "summary": summary,
            # One view serves the three actions: each needs its own id.
            "operationId": f"session_run_{action}_post",
            "description": "409 when the draft is stale (the session moved so that committing would store "
                           "another summary than the one reviewed) or the run is not in a state the action "
                           "applies to; nothing is committed then.",
            "responses": {
                "200": _json({"type": "object", "required": list(ok), "properties": ok,
                              "additionalProperties": False}),
                "409": _json({"allOf": [{"$ref": "#/components/schemas/Error"}, {"type": "object", "properties": {
                    "run": {"$ref": "#/components/schemas/CompactionRun"}}}]}, "Stale draft, or nothing to do"),
                **_errors(404)},
        },
    }

_INT = {"type": "integer"}
# Ids, numbers and offsets a client sends: the databases store 64-bit integers.
_INT64 = {"type": "integer", "format": "int64"}
_STR = {"type": "string"}
_NULL_INT = {"type": "integer", "nullable": True}
_NULL_STR = {"type": "string", "nullable": True}
_OBJ = {"type": "object", "additionalProperties": True}

# -- request bodies -----------------------------------------------------------------------
# The views read their field names from these (``json_body(request, BODY)``), so
# a field the document does not list is refused with a 400 naming it.

# A text that is not only spaces, as the server sees spaces (Python's ``str.isspace``:
# ``strip()`` and ``split()``). Spelled out rather than ``\S``: the regular expressions of
# JSON Schema validators (ECMA-262, Unicode White_Space) call the information separators
# U+001C-U+001F ordinary characters, so a field of only those would pass the document and
# be refused as blank.
NOT_BLANK = "[^" + "".join(f"\\u{code:04x}" for code in range(0x10000) if chr(code).isspace()) + "]"

_TITLE = {"type": "string", "maxLength": MAX_TITLE_LENGTH}
_MESSAGE = {
    "type": "object", "required": ["role"], "additionalProperties": True,
    "properties": {"role": {"type": "string", "enum": list(ROLES)}},
    "description": "an OpenAI chat message, an Anthropic message or an AgentScope Msg (the format is detected)",
}
# What the server checks of a tool definition; the rest is the provider's business.
_TOOL = {
    "type": "object", "required": ["function"], "additionalProperties": True,
    "properties": {"type": {**_STR, "enum": ["function"]}, "function": {"type": "object", "required": ["name"], "additionalProperties": True,
                                              "properties": {"name": _STR}}},
}
SESSION_CREATE = _body({
    "system_prompt": _STR,
    "title": _TITLE,
    "profile": {"oneOf": [{**_INT64, "minimum": 1}, {**_STR, "minLength": 1}, _ref("InlineProfile")],
                "description": "a profile id or name, or settings for a new profile; "
                               "default: your profile named 'default'"},
}, required=("system_prompt",))
MESSAGES_APPEND = _body({"messages": {"type": "array", "items": _MESSAGE}}, required=("messages",))
PREPARE = _body({
    "tools": {"type": "array", "items": _TOOL, "nullable": True},
    "response_format": {**_OBJ, "nullable": True},
})
# A provider's usage object: counts (never negative) and nested objects of details.
_USAGE = {"type": "object", "minProperties": 1, "additionalProperties": {
    "nullable": True, "anyOf": [{"type": "number", "minimum": 0}, {"type": "object"}]}}
USAGE_REPORT = _body({"turn": {**_INT64, "minimum": 1}, "usage": _USAGE}, required=("turn", "usage"))
COMPACT = _body({
    "instruction": {**_NULL_STR, "maxLength": MAX_INSTRUCTION_LENGTH},
    "preview": {"type": "boolean", "default": False},
    "background": {"type": "boolean", "default": False,
                   "description": "answer 202 at once and run it as a background job; "
                                  "follow it with GET /sessions/{id}/runs/{run_id}"},
})
RECALL = _body({
    # Not blank: a query of spaces finds nothing.
    "query": {**_STR, "minLength": 1, "maxLength": MAX_QUERY_CHARS, "pattern": NOT_BLANK},
    "limit": {**_INT, "minimum": 1, "maximum": MAX_RECALL_LIMIT, "default": 10},
    "inject": {"type": "boolean", "default": False},
})
RECALL["required"] = ["query"]
DRY_RUN = _body({"instruction": {**_NULL_STR, "maxLength": MAX_INSTRUCTION_LENGTH}})
PIN_ACTIONS = ("pin_message", "unpin_message", "pin_fact", "unpin_fact")
PINS_CHANGE = _body({
    "action": {**_STR, "enum": list(PIN_ACTIONS)},
    "message_id": {**_STR, "minLength": 1, "maxLength": 200, "pattern": NOT_BLANK, "description": "pin_message, unpin_message"},
    "fact": {**_STR, "minLength": 1, "maxLength": MAX_FACT_CHARS, "pattern": NOT_BLANK,
             "description": "pin_fact, unpin_fact"},
}, required=("action",))
# Examples of requests that succeed: a reader's starting point, and the
# fuzzer's examples phase sends each of them.
SESSION_CREATE["example"] = {"system_prompt": "You are a careful coding agent.", "title": "Fix the nightly build"}
MESSAGES_APPEND["example"] = {"messages": [
    {"role": "user", "content": "Build t1 and report the errors in /srv/app/t1.log"},
    {"role": "assistant", "content": "Building t1.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "run_shell", "arguments": "{\"command\": \"make t1\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "[t1] step 0001: compiled module_01.c in 2 ms"},
]}
PREPARE["example"] = {"tools": [{"type": "function", "function": {
    "name": "run_shell", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]}
USAGE_REPORT["example"] = {"turn": 1, "usage": {"prompt_tokens": 1234, "completion_tokens": 56}}
DRY_RUN["example"] = {"instruction": "Keep the target names."}
PINS_CHANGE["example"] = {"action": "pin_fact", "fact": "The database is /srv/db.sqlite"}
COMPACT["example"] = {"instruction": "Keep the target names.", "preview": False, "background": False}
RECALL["example"] = {"query": "make t1", "limit": 5, "inject": False}
# The import form's fields; "background" takes these spellings of yes and no.
IMPORT_FORM = _body({
    "file": {"type": "string", "format": "binary"},
    "profile": {**_STR, "description": "profile id or name; empty: your profile named 'default'"},
    "title": _TITLE,
    "background": {**_STR, "enum": ["1", "true", "yes", "0", "false", "no"],
                   "description": "replay as a background job (202)"},
}, required=("file",))
YES = ("1", "true", "yes")
NO = ("0", "false", "no")
PROFILE_NAME = {**_STR, "minLength": 1, "maxLength": 100, "pattern": NOT_BLANK}


def _profile_body(*, name_required: bool) -> dict[str, Any]:
    if name_required:
        return _body({"name": PROFILE_NAME, **knob_schemas()}, required=("name",))
    # Inline in a new session, an empty name asks the server to make one up.
    name = {**PROFILE_NAME, "minLength": 0, "pattern": "^$|" + NOT_BLANK, "description": "empty: a generated name"}
    return _body({"name": name, **knob_schemas()})


def _schemas() -> dict[str, Any]:
    return {**SCHEMAS, **_profile_schemas()}


def _answer(properties: dict[str, Any], *, closed: bool = True) -> dict[str, Any]:
    """An object the server answers: every key always present; ``closed``: and no other key.

    Objects other schemas extend with ``allOf`` stay open, or the extension
    could not add its keys.
    """
    schema: dict[str, Any] = {"type": "object", "required": list(properties), "properties": properties}
    if closed:
        schema["additionalProperties"] = False
    return schema


def _answer_with_optional(properties: dict[str, Any], *, optional: dict[str, Any]) -> dict[str, Any]:
    """Like ``_answer``, plus keys only some answers carry."""
    schema = _answer({**properties, **optional})
    schema["required"] = list(properties)
    return schema


def _profile_schemas() -> dict[str, Any]:
    """The profile's schemas: built per document, as the operator's provider list is a setting."""
    knobs = knob_schemas()
    return {
        "Profile": {
            "type": "object",
            "description": "every knob of the profile, plus the derived threshold and reserve",
            "required": ["id", "name", *PROFILE_KNOBS, "threshold", "reserve"],
            "properties": {"id": _INT, "name": _STR, **knobs, "threshold": _INT, "reserve": _INT},
        },
        "ProfileSettings": {
            "type": "object",
            "description": "knob values (names as in Profile); omitted knobs take their defaults. Rules between "
                           "knobs (the reserve under the threshold, old limits under recent ones, the eviction "
                           "target under compact_ratio, a model for the openai compactor) answer 422.",
            "additionalProperties": False,
            "properties": knobs,
        },
        "Timezone": {"type": "string", "enum": sorted(known_timezones()), "maxLength": 64,
                     "description": "an IANA zone name this server knows"},
        "InlineProfile": {**_profile_body(name_required=False),
                          "description": "settings for a new profile (see ProfileSettings), with an optional name"},
        "NewProfile": {**_profile_body(name_required=True),
                       "description": "a name and settings (see ProfileSettings)"},
    }


SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error", "field"],
        "properties": {
            "error": {**_STR, "description": "what is wrong, in one sentence"},
            "field": {**_NULL_STR, "description": "the field at fault, e.g. body, messages[2].content, "
                                                  "profile.reserve_ratio"},
            "kind": {**_STR, "description": "the engine's error class, when the engine raised it"},
        },
    },
    "Tokens": _answer({"used": _INT, "threshold": _INT, "window": _INT}),
    "Session": _answer(closed=False, properties={
            "id": {"type": "string", "format": "uuid"},
            "title": _STR,
            "profile": _answer({"id": _INT, "name": _STR}),
            "status": _enum(AgentSession.Status.values),
            "policy": _enum(POLICIES),
            "tokens": _ref("Tokens"),
            "turns": _INT,
            "compactions": _INT,
            "failures": {**_INT, "description": "turns whose summary failed or fell back to the extractive one"},
            "messages": _INT,
            "live_messages": _INT,
            "summary_version": _INT,
            "source": {**_OBJ, "nullable": True, "description": "for imported sessions: format, file, warnings"},
            "created": {"type": "string", "format": "date-time"},
            "last_activity": {"type": "string", "format": "date-time"},
            "url": {**_STR, "description": "the session's page in the dashboard"},
        }),
    "SessionDetail": {
        "allOf": [
            _ref("Session"),
            _answer(closed=False, properties={
                "system_prompt": _STR,
                "summary": _NULL_STR,
                "pending_tool_calls": {"type": "array", "items": _STR},
                "latest_turn": {"allOf": [_ref("Turn")], "nullable": True},
            }),
        ]
    },
    "MessageRow": _answer({
        "id": _STR, "seq": _INT, "role": _enum(ROLES), "tokens": _INT,
        "status": _enum(SessionMessage.Status.values),
        "truncated_stage": _NULL_INT, "truncated_turn": _NULL_INT, "compacted_turn": _NULL_INT,
        "summary_version": _NULL_INT,
        "archive": {**_answer({"file": _STR, "line": _NULL_INT}), "nullable": True},
    }),
    "Turn": _answer(closed=False, properties={
            "number": _INT,
            "trigger": {"type": "string", "enum": ["auto", "manual"]},
            "outcome": _enum(OUTCOMES),
            "policy": _enum(POLICIES),
            "used_tokens": {**_INT, "description": "system prompt + summary + messages coming into the hook"},
            "threshold": _INT, "window": _INT,
            "payload_tokens": {**_INT, "description": "exact tokens of the payload returned"},
            "layers": {"type": "object", "properties": dict.fromkeys(("system", "summary", "messages", "tool_results", "total"), _INT)},
            "compacted": {**_INT, "description": "messages archived at this turn"},
            "summary_version": _INT,
            "duration_ms": {"type": "number"},
            "usage": {**_OBJ, "nullable": True},
            "profile_version": {**_NULL_INT, "description": "the session profile's version this turn ran under "
                                                           "(null: recorded before profiles had versions)"},
            "created": {"type": "string", "format": "date-time"},
        }),
    "TurnFull": {
        "allOf": [
            _ref("Turn"),
            {"type": "object", "properties": {
                "trace": _ref("Trace"),
                "messages": {"type": "array", "items": _OBJ, "description": "the payload, OpenAI chat format"},
            }},
        ]
    },
    "Trace": {
        "type": "object",
        "description": "schema contextlab.trace/1: one record per step of the hook, with numbers and reasons",
        "properties": {
            "schema": _STR, "turn": _INT, "trigger": _STR, "policy": _STR, "outcome": _STR,
            "budget": _OBJ, "steps": {"type": "array", "items": _OBJ}, "payload": _OBJ,
            "flaws_avoided": {"type": "array", "items": _OBJ}, "copaw_losses": {"type": "array", "items": _OBJ},
            "error": _NULL_STR,
        },
        "additionalProperties": True,
    },
    "Summary": _answer({
        "version": _INT, "text": _STR, "turn": _INT, "trigger": _STR, "compactor": _STR,
        "fallback": {"type": "boolean"}, "compacted_ids": {"type": "array", "items": _STR},
        "created": {"type": "string", "format": "date-time"},
        "loss": {**_answer({
            "lost": {"type": "array", "description": "identifiers of the compacted messages kept neither by "
                     "this version nor by a file it names (the first 200)",
                     "items": _answer({"kind": _enum(list(IDENTIFIER_KINDS)), "value": _STR, "message_id": _STR})},
            "lost_count": {**_INT, "description": "all of them, however many are listed"},
            "checked": {**_INT, "description": "distinct identifiers searched for"},
            "checked_kinds": {"type": "array", "items": _enum(list(IDENTIFIER_KINDS)),
                              "description": "the kinds of identifier the check recognises"},
            "unchecked": {"type": "array", "description": "what the check could not search, and why; a verdict "
                          "with anything here is never 'nothing lost'",
                          "items": _answer({"what": _STR, "count": _INT, "why": _STR})},
            "references": {"type": "array", "items": _STR,
                           "description": "the files this version names that were searched too"},
            "nothing_lost": {"type": "boolean",
                             "description": "true only when every identifier was searched for and each is kept"},
        }), "nullable": True, "description": "the loss check's verdict on this version (null: not checked)"},
    }),
    "CompactionRun": _answer_with_optional({
        "id": _INT, "kind": _enum(CompactionRun.Kind.values), "status": _enum(CompactionRun.Status.values),
        "trigger": _STR, "instruction": _STR, "error": _STR, "turn": _NULL_INT, "outcome": _STR,
        "state_version": {**_NULL_INT, "description": "a dry run: the session's state version it was made on"},
        "created": {"type": "string", "format": "date-time"},
        "started": {"type": "string", "format": "date-time", "nullable": True},
        "finished": {"type": "string", "format": "date-time", "nullable": True},
    }, optional={
        "draft": {"allOf": [_ref("Draft")], "nullable": True,
                  "description": "a dry run read on its own (GET the run, or an action's answer): what accepting "
                                 "it would commit, once made"},
    }),
    "Draft": _answer({
        "summary": {**_NULL_STR, "description": "the exact text accept stores; null: the summary failed and "
                                                "the previous one would stay"},
        "previous_summary": _NULL_STR, "summary_version": _INT, "outcome": _STR,
        "compact_ids": {"type": "array", "items": _STR}, "keep_ids": {"type": "array", "items": _STR},
        "pins": _ref("Pins"),
        "lost": {"type": "array", "items": _answer({"kind": _STR, "value": _STR, "message_id": _STR})},
        "lost_count": {**_INT, "description": "identifiers of the compacted messages found neither in the "
                                              "draft nor in a file it names"},
        "failure": _NULL_STR,
    }),
    "Pins": {**_answer({"message_ids": {"type": "array", "items": _STR},
                        "facts": {"type": "array", "items": _STR}}),
             "description": "pinned messages stay live through compactions (or go with their identifiers in the "
                            "summary); pinned facts go into the summary"},
    "SplitPreview": {
        "type": "object",
        "properties": {
            "compact_ids": {"type": "array", "items": _STR}, "keep_ids": {"type": "array", "items": _STR},
            "pinned_ids": {"type": "array", "items": _STR}, "compact_tokens": _INT, "kept_tokens": _INT,
            "reserve": _INT, "notes": {"type": "array", "items": _STR},
        },
    },
    "Hit": _answer({
        "kind": {"type": "string", "enum": ["dialog", "externalized", "tool_result", "memory"]},
        "location": {**_STR, "description": "workspace file, with :line for the archive, offloaded "
                                            "output and memory notes"},
        "message_id": _NULL_STR,
        "seq": {**_NULL_INT, "description": "the message's position in the session, when known"},
        "snippet": _STR,
        "score": {"type": "number"},
    }),
}


def _routes(patterns: list[URLPattern | URLResolver], prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    """Every route of the URL configuration, with its whole path."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, prefix + str(pattern.pattern))
        elif not str(pattern.pattern).startswith("^"):  # a regular expression: the API's catch-all
            yield prefix + str(pattern.pattern), pattern


def _view_names() -> dict[str, str]:
    """OpenAPI path -> name of the view serving it.

    Read from Django's URL resolver when the document is built, not by importing
    the API's URL modules: those import the views, which import this module.
    """
    names: dict[str, str] = {}
    for route, pattern in _routes(get_resolver().url_patterns):
        if route.startswith(API_PREFIX):
            path = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route.removeprefix(API_PREFIX))
            names.setdefault(path, pattern.callback.__name__)
    return names


def _with_operation_ids(paths: dict[str, Any]) -> dict[str, Any]:
    views = _view_names()
    for path, item in paths.items():
        view = views.get(path) or re.sub(r"\W+", "_", path).strip("_")
        for method in ("get", "post", "put", "patch", "delete"):
            if method in item:
                item[method].setdefault("operationId", f"{view}_{method}")
    return paths


def schema(server_url: str) -> dict[str, Any]:
    document = _document(server_url)
    _with_operation_ids(document["paths"])
    return document


def _document(server_url: str) -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "ContextLab API",
            "version": "1",
            "description": "Feed an agent's messages in, get back the exact messages to send to the LLM "
                           "after the pre-reasoning hook, and read every turn's trace. Every refusal is "
                           "{error, field}: a field a request body does not list, a NUL character "
                           "(\\u0000) or a lone surrogate (\\ud800-\\udfff) in any text is refused "
                           "with a 400 naming where it is.",
        },
        "servers": [{"url": server_url}],
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "a token from `manage.py createapitoken USERNAME`"}},
            "schemas": _schemas(),
        },
        "paths": {
            "/sessions": {
                "get": {
                    "summary": "Your sessions, most recently active first",
                    "parameters": [
                        {"name": "profile", "in": "query", "schema": {**_INT64, "minimum": 1},
                         "description": "only this profile id"},
                        {"name": "failed", "in": "query", "schema": {"type": "boolean"},
                         "description": "only sessions that had a failed or fallback summary"},
                        {"name": "limit", "in": "query", "schema": {**_INT, "minimum": 1, "maximum": MAX_PAGE}},
                        {"name": "offset", "in": "query", "schema": {**_INT64, "minimum": 0}},
                    ],
                    "responses": {"200": _json({"type": "object", "required": ["sessions", "count", "limit", "offset"],
                                                "properties": {
                        "sessions": {"type": "array", "items": _ref("Session")}, "count": _INT,
                        "limit": _INT, "offset": _INT}}), **_errors(400)},
                },
                "post": {
                    "summary": "Create a session",
                    "requestBody": _request(SESSION_CREATE),
                    "responses": {"201": _json(_ref("Session"), "Created"), **_errors(400, 413, 422)},
                },
            },
            "/sessions/{session_id}": {
                "parameters": [SESSION_ID],
                "get": {"summary": "One session", "responses": {"200": _json(_ref("SessionDetail")), **_errors(404)}},
            },
            "/sessions/{session_id}/messages": {
                "parameters": [SESSION_ID],
                "post": {
                    "summary": "Append messages (OpenAI, Anthropic or AgentScope format, detected)",
                    "description": "All or nothing. Tool results are cut when they enter the context (stage 1). "
                                   "Messages the detected format cannot read answer 400 naming the message.",
                    "requestBody": _request(MESSAGES_APPEND),
                    "responses": {"201": _json({"type": "object", "properties": {
                        "appended": _INT, "messages": {"type": "array", "items": _ref("MessageRow")},
                        "session": _ref("Session")}}, "Appended"), **_errors(400, 404, 409, 413, 422, 502, 503)},
                },
            },
            "/sessions/{session_id}/prepare": {
                "parameters": [SESSION_ID],
                "post": {
                    "summary": "Run the pre-reasoning hook; returns the exact messages to send and the trace",
                    "description": "tools and response_format (optional, as in an OpenAI chat request) are the "
                                   "next call's tool definitions and output schema: a layer of its budget.",
                    "requestBody": _request(PREPARE, required=False),
                    "responses": {"200": _json({"type": "object", "properties": {
                        "turn": _INT, "messages": {"type": "array", "items": _OBJ}, "trace": _ref("Trace")}}),
                        **_errors(400, 404, 409, 413, 422, 502, 503)},
                },
            },
            "/sessions/{session_id}/usage": {
                "parameters": [SESSION_ID],
                "post": {
                    "summary": "Report the usage the provider returned for a turn's call",
                    "requestBody": _request(USAGE_REPORT),
                    "responses": {"200": _json({"type": "object", "properties": {
                        "turn": _INT, "usage": _OBJ, "payload_tokens": _INT, "reported_prompt_tokens": _NULL_INT,
                        "difference": _NULL_INT}}), **_errors(400, 404, 409, 413, 422)},
                },
            },
            "/sessions/{session_id}/compact": {
                "parameters": [SESSION_ID],
                "post": {
                    "summary": "Manual compaction, or its preview",
                    "requestBody": _request(COMPACT, required=False),
                    # Each branch names its keys, so an answer matches exactly one.
                    "responses": {"200": _json({"oneOf": [
                        {"type": "object", "required": ["preview"], "properties": {"preview": _ref("SplitPreview")}},
                        {"type": "object", "required": ["run", "turn", "trace"],
                         "properties": {"run": _ref("CompactionRun"), "turn": _ref("Turn"), "trace": _ref("Trace")}},
                    ]}), "202": _json({"type": "object", "properties": {"run": _ref("CompactionRun")}},
                                      "Queued as a background job"),
                        **_errors(400, 404, 409, 413, 422, 502, 503)},
                },
            },
            "/sessions/{session_id}/runs/{run_id}": {
                "parameters": [SESSION_ID, {"name": "run_id", "in": "path", "required": True,
                                            "schema": {**_INT64, "minimum": 0}}],
                "get": {"summary": "One compaction or import run: queued, running, done or failed",
                        "responses": {"200": _json(_ref("CompactionRun")), **_errors(404)}},
            },
            "/sessions/{session_id}/dry-runs": {
                "parameters": [SESSION_ID],
                "post": {
                    "summary": "Dry run a manual compaction with the profile's compactor (a background run)",
                    "description": "Nothing is committed; when the run's status is 'draft', GET the run for the "
                                   "draft, then accept or discard it.",
                    "requestBody": _request(DRY_RUN, required=False),
                    "responses": {"202": _json({"type": "object", "required": ["run"], "additionalProperties": False,
                                                "properties": {"run": _ref("CompactionRun")}}, "Queued"),
                                  **_errors(400, 404, 409, 413)},
                },
            },
            **{f"/sessions/{{session_id}}/runs/{{run_id}}/{action}": _run_action(action, summary)
               for action, summary in RUN_ACTIONS.items()},
            "/sessions/{session_id}/pins": {
                "parameters": [SESSION_ID],
                "get": {"summary": "What is pinned for the coming compactions",
                        "responses": {"200": _json(_ref("Pins")), **_errors(404)}},
                "post": {
                    "summary": "Pin or unpin a live message or a fact",
                    "description": "pin_message and unpin_message take message_id (pin_message: a live "
                                   "message of the session); pin_fact and unpin_fact take fact. A missing "
                                   "field, a message that is not live or a full pin list answer 400 naming "
                                   "the field.",
                    "requestBody": _request(PINS_CHANGE),
                    "responses": {"200": _json(_ref("Pins")), **_errors(400, 404, 409, 413)},
                },
            },
            "/sessions/{session_id}/turns": {
                "parameters": [SESSION_ID],
                "get": {
                    "summary": "Turns in order (cursor: after)",
                    "parameters": [{"name": "after", "in": "query", "schema": {**_INT64, "minimum": 0}},
                                   {"name": "limit", "in": "query", "schema": {**_INT, "minimum": 1,
                                                                               "maximum": MAX_PAGE}}],
                    "responses": {"200": _json({"type": "object", "required": ["turns"], "properties": {
                        "turns": {"type": "array", "items": _ref("Turn")}}}), **_errors(400, 404)},
                },
            },
            "/sessions/{session_id}/turns/{number}": {
                "parameters": [SESSION_ID, {"name": "number", "in": "path", "required": True,
                                            "schema": {**_INT64, "minimum": 0}}],
                "get": {"summary": "One turn with its trace and payload",
                        "responses": {"200": _json(_ref("TurnFull")), **_errors(404)}},
            },
            "/sessions/{session_id}/summaries": {
                "parameters": [SESSION_ID],
                "get": {"summary": "Every summary version",
                        "responses": {"200": _json({"type": "object", "properties": {
                            "current_version": _INT, "summaries": {"type": "array", "items": _ref("Summary")}}}),
                            **_errors(404)}},
            },
            "/sessions/{session_id}/recall": {
                "parameters": [SESSION_ID],
                "post": {
                    "summary": "Search what the session keeps outside its live context; optionally inject the hits",
                    "description": "Ranks the dialog archive, externalized units, offloaded tool output and the "
                                   "memory notes (BM25, a verbatim match counts double). With inject, the hits "
                                   "are appended as one user message named 'recollection' whose text starts with "
                                   "'[recollection', so the next prepare sends them as recalled material.",
                    "requestBody": _request(RECALL),
                    "responses": {
                        "200": _json({"type": "object", "properties": {
                            "query": _STR, "hits": {"type": "array", "items": _ref("Hit")},
                            "injected": {"type": "object", "nullable": True}}}),
                        "201": _json({"type": "object", "properties": {
                            "query": _STR, "hits": {"type": "array", "items": _ref("Hit")},
                            "injected": {"type": "object", "properties": {"message": _ref("MessageRow"),
                                                                          "text": _STR}},
                            "session": _ref("Session")}}, "Searched, and the recollection appended"),
                        **_errors(400, 404, 409, 413, 503)},
                },
            },
            "/sessions/{session_id}/export": {
                "parameters": [SESSION_ID],
                "get": {"summary": "The session as a zip bundle (import it with POST /imports)",
                        "responses": {"200": {"description": "zip", "content": {"application/zip": {
                            "schema": {"type": "string", "format": "binary"}}},
                            "headers": {"Content-Disposition": {"schema": _STR, "required": True,
                                                                "description": "attachment; filename=..."}}},
                            **_errors(404, 409)}},
            },
            "/imports": {
                "post": {
                    "summary": "Import a recorded transcript (replayed turn by turn), a session bundle, "
                               "or a zip of a CoPaw workspace or of recorded requests (observed)",
                    "description": "A file no importer reads answers 400 naming the file.",
                    "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": IMPORT_FORM}}},
                    "responses": {"201": _json(_ref("Session"), "Imported"),
                                  "202": _json({"allOf": [_ref("Session"), {"type": "object", "properties": {
                                      "run": _ref("CompactionRun")}}]}, "Importing in the background"),
                                  **_errors(400, 413, 422, 502, 503)},
                },
            },
            "/profiles": {
                "get": {"summary": "Your profiles",
                        "responses": {"200": _json({"type": "object", "required": ["profiles"], "properties": {
                            "profiles": {"type": "array", "items": _ref("Profile")}}}), **_errors()}},
                "post": {
                    "summary": "Create a profile",
                    "requestBody": _request(_ref("NewProfile")),
                    "responses": {"201": _json(_ref("Profile"), "Created"), **_errors(400, 413, 422)},
                },
            },
            "/openapi.json": {
                "get": {"summary": "This document", "security": [],
                        "responses": {"200": _json({"type": "object"})}},
            },
        },
    }
