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
from typing import Any

from django.db import models
from django.urls import URLPattern, URLResolver

from contextlab.engine.profile import BOUNDS, POLICIES
from contextlab.engine.trace import OUTCOMES
from contextlab.sessions.models import (
    LIST_KNOBS,
    PROFILE_KNOBS,
    AgentProfile,
    AgentSession,
    CompactionRun,
    SessionMessage,
)


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
    bound = BOUNDS.get(name)
    if bound is not None:
        schema.update(minimum=bound.low, maximum=bound.high)
    if field.help_text:
        schema["description"] = str(field.help_text)
    return schema


KNOB_SCHEMAS: dict[str, Any] = {name: _knob_schema(name) for name in PROFILE_KNOBS}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "Bad input: the body names the field at fault",
        401: "Missing or invalid API token",
        404: "No such session (or not yours), or no such turn",
        409: "The session is still being imported",
        413: "The body or the upload is too large",
        422: "Invalid profile settings",
    }
    return {str(code): _json(_ref("Error"), text[code]) for code in (401, *codes)}


SESSION_ID = {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}

RUN_ACTIONS = {
    "accept": "Commit exactly the reviewed draft of a dry run (no second compactor call)",
    "discard": "Drop the draft of a dry run; nothing was committed",
    "cancel": "Cancel a queued or running compaction or dry run; nothing of it is committed",
}


def _run_action(action: str, summary: str) -> dict[str, Any]:
    run_id = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "integer", "format": "int64"}}
    ok: dict[str, Any] = {"run": {"$ref": "#/components/schemas/CompactionRun"}}
    if action == "accept":
        ok["turn"] = {"$ref": "#/components/schemas/Turn"}
    return {
        "parameters": [SESSION_ID, run_id],
        "post": {
            "summary": summary,
            "description": "409 when the draft is stale (the session moved so that committing would store "
                           "another summary than the one reviewed) or the run is not in a state the action "
                           "applies to; nothing is committed then.",
            "responses": {
                "200": _json({"type": "object", "required": list(ok), "properties": ok}),
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
    "Tokens": {"type": "object", "properties": {"used": _INT, "threshold": _INT, "window": _INT}},
    "Session": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "title": _STR,
            "profile": {"type": "object", "properties": {"id": _INT, "name": _STR}},
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
        },
    },
    "SessionDetail": {
        "allOf": [
            _ref("Session"),
            {"type": "object", "properties": {
                "system_prompt": _STR,
                "summary": _NULL_STR,
                "pending_tool_calls": {"type": "array", "items": _STR},
                "latest_turn": {"allOf": [_ref("Turn")], "nullable": True},
            }},
        ]
    },
    "MessageRow": {
        "type": "object",
        "properties": {
            "id": _STR, "seq": _INT, "role": _STR, "tokens": _INT,
            "status": _enum(SessionMessage.Status.values),
            "truncated_stage": _NULL_INT, "truncated_turn": _NULL_INT, "compacted_turn": _NULL_INT,
            "summary_version": _NULL_INT,
            "archive": {"type": "object", "nullable": True, "properties": {"file": _STR, "line": _INT}},
        },
    },
    "Turn": {
        "type": "object",
        "properties": {
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
        },
    },
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
    "Summary": {
        "type": "object",
        "properties": {
            "version": _INT, "text": _STR, "turn": _INT, "trigger": _STR, "compactor": _STR,
            "fallback": {"type": "boolean"}, "compacted_ids": {"type": "array", "items": _STR},
            "created": {"type": "string", "format": "date-time"},
        },
    },
    "CompactionRun": {
        "type": "object",
        "properties": {
            "id": _INT, "kind": _enum(CompactionRun.Kind.values), "status": _enum(CompactionRun.Status.values),
            "trigger": _STR, "instruction": _STR, "error": _STR, "turn": _NULL_INT, "outcome": _STR,
            "state_version": {**_NULL_INT, "description": "a dry run: the session's state version it was made on"},
            "draft": {"allOf": [_ref("Draft")], "nullable": True,
                      "description": "a dry run only: what accepting it would commit, once made"},
            "created": {"type": "string", "format": "date-time"},
            "started": {"type": "string", "format": "date-time", "nullable": True},
            "finished": {"type": "string", "format": "date-time", "nullable": True},
        },
    },
    "Draft": {
        "type": "object",
        "properties": {
            "summary": {**_NULL_STR, "description": "the exact text accept stores; null: the summary failed and "
                                                    "the previous one would stay"},
            "previous_summary": _NULL_STR, "summary_version": _INT, "outcome": _STR,
            "compact_ids": {"type": "array", "items": _STR}, "keep_ids": {"type": "array", "items": _STR},
            "pins": _ref("Pins"),
            "lost": {"type": "array", "items": {"type": "object", "properties": {
                "kind": _STR, "value": _STR, "message_id": _STR}}},
            "lost_count": {**_INT, "description": "identifiers of the compacted messages found neither in the "
                                                  "draft nor in a file it names"},
            "failure": _NULL_STR,
        },
    },
    "Pins": {
        "type": "object",
        "description": "pinned messages stay live through compactions (or go with their identifiers in the "
                       "summary); pinned facts go into the summary",
        "properties": {"message_ids": {"type": "array", "items": _STR}, "facts": {"type": "array", "items": _STR}},
    },
    "SplitPreview": {
        "type": "object",
        "properties": {
            "compact_ids": {"type": "array", "items": _STR}, "keep_ids": {"type": "array", "items": _STR},
            "pinned_ids": {"type": "array", "items": _STR}, "compact_tokens": _INT, "kept_tokens": _INT,
            "reserve": _INT, "notes": {"type": "array", "items": _STR},
        },
    },
    "Profile": {
        "type": "object",
        "description": "every knob of the profile, plus the derived threshold and reserve",
        "required": ["id", "name", *PROFILE_KNOBS, "threshold", "reserve"],
        "properties": {"id": _INT, "name": _STR, **KNOB_SCHEMAS, "threshold": _INT, "reserve": _INT},
    },
    "Hit": {
        "type": "object",
        "properties": {
            "kind": {"type": "string", "enum": ["dialog", "externalized", "tool_result", "memory"]},
            "location": {**_STR, "description": "workspace file, with :line for the archive, offloaded "
                                                "output and memory notes"},
            "message_id": _NULL_STR,
            "seq": {**_NULL_INT, "description": "the message's position in the session, when known"},
            "snippet": _STR,
            "score": {"type": "number"},
        },
    },
    "ProfileSettings": {
        "type": "object",
        "description": "knob values (names as in Profile); omitted knobs take their defaults",
        "properties": KNOB_SCHEMAS,
    },
}


def _view_names() -> dict[str, str]:
    """OpenAPI path -> name of the view serving it, from the URL configuration."""
    from contextlab.api.urls import urlpatterns as api_patterns
    from contextlab.insights.api_urls import urlpatterns as insights_patterns

    names: dict[str, str] = {}
    for pattern in [*insights_patterns, *api_patterns]:
        if isinstance(pattern, URLResolver) or not isinstance(pattern, URLPattern):
            continue
        route = str(pattern.pattern)
        if route.startswith("^"):
            continue  # the catch-all
        names["/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)] = pattern.callback.__name__
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
                           "after the pre-reasoning hook, and read every turn's trace.",
        },
        "servers": [{"url": server_url}],
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "a token from `manage.py createapitoken USERNAME`"}},
            "schemas": SCHEMAS,
        },
        "paths": {
            "/sessions": {
                "get": {
                    "summary": "Your sessions, most recently active first",
                    "parameters": [
                        {"name": "profile", "in": "query", "schema": _INT64, "description": "only this profile id"},
                        {"name": "failed", "in": "query", "schema": {"type": "boolean"},
                         "description": "only sessions that had a failed or fallback summary"},
                        {"name": "limit", "in": "query", "schema": {**_INT, "minimum": 1, "maximum": 200}},
                        {"name": "offset", "in": "query", "schema": {**_INT64, "minimum": 0}},
                    ],
                    "responses": {"200": _json({"type": "object", "properties": {
                        "sessions": {"type": "array", "items": _ref("Session")}, "count": _INT,
                        "limit": _INT, "offset": _INT}}), **_errors(400)},
                },
                "post": {
                    "summary": "Create a session",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {
                        "type": "object", "required": ["system_prompt"],
                        "properties": {
                            "system_prompt": _STR,
                            "title": _STR,
                            "profile": {"oneOf": [_INT, _STR, _ref("ProfileSettings")],
                                        "description": "a profile id or name, or settings for a new profile; "
                                                       "default: your profile named 'default'"},
                        }}}}},
                    "responses": {"201": _json(_ref("Session"), "Created"), **_errors(400, 422)},
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
                    "description": "All or nothing. Tool results are cut when they enter the context (stage 1).",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {
                        "type": "object", "required": ["messages"],
                        "properties": {"messages": {"type": "array", "items": _OBJ}}}}}},
                    "responses": {"201": _json({"type": "object", "properties": {
                        "appended": _INT, "messages": {"type": "array", "items": _ref("MessageRow")},
                        "session": _ref("Session")}}, "Appended"), **_errors(400, 404, 409, 413)},
                },
            },
            "/sessions/{session_id}/prepare": {
                "parameters": [SESSION_ID],
                "post": {
                    "summary": "Run the pre-reasoning hook; returns the exact messages to send and the trace",
                    "description": "tools and response_format (optional, as in an OpenAI chat request) are the "
                                   "next call's tool definitions and output schema: a layer of its budget.",
                    "requestBody": {"required": False, "content": {"application/json": {"schema": {
                        "type": "object", "properties": {"tools": {"type": "array", "items": _OBJ},
                                                         "response_format": _OBJ}}}}},
                    "responses": {"200": _json({"type": "object", "properties": {
                        "turn": _INT, "messages": {"type": "array", "items": _OBJ}, "trace": _ref("Trace")}}),
                        **_errors(400, 404, 409)},
                },
            },
            "/sessions/{session_id}/usage": {
                "parameters": [SESSION_ID],
                "post": {
                    "summary": "Report the usage the provider returned for a turn's call",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {
                        "type": "object", "required": ["turn", "usage"],
                        "properties": {"turn": _INT, "usage": _OBJ}}}}},
                    "responses": {"200": _json({"type": "object", "properties": {
                        "turn": _INT, "usage": _OBJ, "payload_tokens": _INT, "reported_prompt_tokens": _NULL_INT,
                        "difference": _NULL_INT}}), **_errors(400, 404)},
                },
            },
            "/sessions/{session_id}/compact": {
                "parameters": [SESSION_ID],
                "post": {
                    "summary": "Manual compaction, or its preview",
                    "requestBody": {"content": {"application/json": {"schema": {
                        "type": "object", "properties": {
                            "instruction": _NULL_STR,
                            "preview": {"type": "boolean", "default": False},
                            "background": {"type": "boolean", "default": False,
                                           "description": "answer 202 at once and run it as a background job; "
                                                          "follow it with GET /sessions/{id}/runs/{run_id}"}}}}}},
                    # Each branch names its keys, so an answer matches exactly one.
                    "responses": {"200": _json({"oneOf": [
                        {"type": "object", "required": ["preview"], "properties": {"preview": _ref("SplitPreview")}},
                        {"type": "object", "required": ["run", "turn", "trace"],
                         "properties": {"run": _ref("CompactionRun"), "turn": _ref("Turn"), "trace": _ref("Trace")}},
                    ]}), "202": _json({"type": "object", "properties": {"run": _ref("CompactionRun")}},
                                      "Queued as a background job"), **_errors(400, 404, 409)},
                },
            },
            "/sessions/{session_id}/runs/{run_id}": {
                "parameters": [SESSION_ID, {"name": "run_id", "in": "path", "required": True, "schema": _INT64}],
                "get": {"summary": "One compaction or import run: queued, running, done or failed",
                        "responses": {"200": _json(_ref("CompactionRun")), **_errors(404)}},
            },
            "/sessions/{session_id}/dry-runs": {
                "parameters": [SESSION_ID],
                "post": {
                    "summary": "Dry run a manual compaction with the profile's compactor (a background run)",
                    "description": "Nothing is committed; when the run's status is 'draft', GET the run for the "
                                   "draft, then accept or discard it.",
                    "requestBody": {"content": {"application/json": {"schema": {
                        "type": "object", "properties": {"instruction": _NULL_STR}}}}},
                    "responses": {"202": _json({"type": "object", "properties": {"run": _ref("CompactionRun")}},
                                               "Queued"), **_errors(400, 404, 409)},
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
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {
                        "type": "object", "required": ["action"], "properties": {
                            "action": _enum(["pin_message", "unpin_message", "pin_fact", "unpin_fact"]),
                            "message_id": _STR, "fact": {**_STR, "maxLength": 500}}}}}},
                    "responses": {"200": _json(_ref("Pins")), **_errors(400, 404, 409)},
                },
            },
            "/sessions/{session_id}/turns": {
                "parameters": [SESSION_ID],
                "get": {
                    "summary": "Turns in order (cursor: after)",
                    "parameters": [{"name": "after", "in": "query", "schema": _INT64},
                                   {"name": "limit", "in": "query", "schema": {**_INT, "minimum": 1,
                                                                               "maximum": 200}}],
                    "responses": {"200": _json({"type": "object", "properties": {
                        "turns": {"type": "array", "items": _ref("Turn")}}}), **_errors(400, 404)},
                },
            },
            "/sessions/{session_id}/turns/{number}": {
                "parameters": [SESSION_ID, {"name": "number", "in": "path", "required": True, "schema": _INT64}],
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
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {
                        "type": "object", "required": ["query"],
                        "properties": {"query": {**_STR, "maxLength": 1000},
                                       "limit": {**_INT, "minimum": 1, "maximum": 50, "default": 10},
                                       "inject": {"type": "boolean", "default": False}}}}}},
                    "responses": {
                        "200": _json({"type": "object", "properties": {
                            "query": _STR, "hits": {"type": "array", "items": _ref("Hit")},
                            "injected": {"type": "object", "nullable": True}}}),
                        "201": _json({"type": "object", "properties": {
                            "query": _STR, "hits": {"type": "array", "items": _ref("Hit")},
                            "injected": {"type": "object", "properties": {"message": _ref("MessageRow"),
                                                                          "text": _STR}},
                            "session": _ref("Session")}}, "Searched, and the recollection appended"),
                        **_errors(400, 404, 409)},
                },
            },
            "/sessions/{session_id}/export": {
                "parameters": [SESSION_ID],
                "get": {"summary": "The session as a zip bundle (import it with POST /imports)",
                        "responses": {"200": {"description": "zip", "content": {"application/zip": {
                            "schema": {"type": "string", "format": "binary"}}}}, **_errors(404)}},
            },
            "/imports": {
                "post": {
                    "summary": "Import a recorded transcript (replayed turn by turn), a session bundle, "
                               "or a zip of a CoPaw workspace or of recorded requests (observed)",
                    "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
                        "type": "object", "required": ["file"],
                        "properties": {"file": {"type": "string", "format": "binary"},
                                       "profile": {**_STR, "description": "profile id or name"},
                                       "title": _STR,
                                       "background": {**_STR, "enum": ["1", "true", "yes"],
                                                      "description": "replay as a background job (202)"}}}}}},
                    "responses": {"201": _json(_ref("Session"), "Imported"),
                                  "202": _json({"allOf": [_ref("Session"), {"type": "object", "properties": {
                                      "run": _ref("CompactionRun")}}]}, "Importing in the background"),
                                  **_errors(400, 413, 422)},
                },
            },
            "/profiles": {
                "get": {"summary": "Your profiles",
                        "responses": {"200": _json({"type": "object", "properties": {
                            "profiles": {"type": "array", "items": _ref("Profile")}}}), **_errors()}},
                "post": {
                    "summary": "Create a profile",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {
                        "allOf": [_ref("ProfileSettings"),
                                  {"type": "object", "required": ["name"], "properties": {"name": _STR}}]}}}},
                    "responses": {"201": _json(_ref("Profile"), "Created"), **_errors(400, 422)},
                },
            },
            "/openapi.json": {
                "get": {"summary": "This document", "security": [],
                        "responses": {"200": _json({"type": "object"})}},
            },
        },
    }
