"""Issue 12, item 7 (part): the API document takes from the code what the code declares.

A client generated from the document raised on ``GET /sessions`` for a whole
account once one eviction session existed: the enums lacked ``eviction`` and
``evicted``. These tests hold the document to the code and to a real eviction
session's answers.
"""

from __future__ import annotations

from contextlab.engine.core.profile import POLICIES
from contextlab.engine.core.trace import OUTCOMES
from contextlab.sessions.models import PROFILE_KNOBS
from tests.conversations import answer, tool_turn


def _document(api) -> dict:
    return api.get("/api/v1/openapi.json").json()


def test_the_enums_are_the_engines(api):
    schemas = _document(api)["components"]["schemas"]
    assert schemas["Session"]["properties"]["policy"]["enum"] == list(POLICIES)
    assert schemas["Turn"]["properties"]["outcome"]["enum"] == list(OUTCOMES)
    assert "eviction" in POLICIES and "evicted" in OUTCOMES


def test_every_operation_has_its_own_operation_id(api):
    ids = [operation["operationId"] for item in _document(api)["paths"].values()
           for method, operation in item.items() if method in ("get", "post", "put", "patch", "delete")]
    assert len(ids) == len(set(ids)) >= 17
    assert "sessions_get" in ids and "session_turn_get" in ids


def test_the_profile_schema_lists_every_knob_and_no_operator_setting(api):
    schemas = _document(api)["components"]["schemas"]
    assert set(schemas["Profile"]["properties"]) == {"id", "name", *PROFILE_KNOBS, "threshold", "reserve"}
    assert set(schemas["ProfileSettings"]["properties"]) == set(PROFILE_KNOBS)
    assert "compaction_base_url" not in schemas["ProfileSettings"]["properties"]
    window = schemas["ProfileSettings"]["properties"]["max_input_length"]
    assert window["type"] == "integer" and window["minimum"] > 0


def test_an_eviction_sessions_answers_are_in_the_documents_enums(api):
    schemas = _document(api)["components"]["schemas"]
    profile = api.post("/api/v1/profiles", {"name": "evict", "policy": "eviction", "max_input_length": 4_000,
                                            "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400}).json()
    session = api.post("/api/v1/sessions", {"system_prompt": "You are careful.", "profile": profile["id"]}).json()
    for i in range(1, 8):
        api.post(f"/api/v1/sessions/{session['id']}/messages",
                 {"messages": [*([answer(i - 1)] if i > 1 else []), *tool_turn(i)]})
        api.post(f"/api/v1/sessions/{session['id']}/prepare")
    listed = api.get("/api/v1/sessions").json()["sessions"]
    assert {s["policy"] for s in listed} == {"eviction"}
    assert {s["policy"] for s in listed} <= set(schemas["Session"]["properties"]["policy"]["enum"])
    outcomes = {t["outcome"] for t in api.get(f"/api/v1/sessions/{session['id']}/turns").json()["turns"]}
    assert outcomes <= set(schemas["Turn"]["properties"]["outcome"]["enum"])


def test_the_document_is_valid_openapi_3(api):
    from openapi_spec_validator import validate

    validate(_document(api))  # raises on the first error


def _validate_answer(document: dict, path: str, method: str, status: int, answer: object) -> None:
    """Validate a real answer against the document's schema for it, as a generated client reads it."""
    from openapi_schema_validator import OAS30Validator

    schema = document["paths"][path][method]["responses"][str(status)]["content"]["application/json"]["schema"]
    # The components ride along, so every $ref resolves inside one document.
    OAS30Validator({**schema, "components": document["components"]}).validate(answer)


def test_an_account_with_an_eviction_session_lists_in_the_documents_shape(api):
    document = _document(api)
    profile = api.post("/api/v1/profiles", {"name": "evict", "policy": "eviction", "max_input_length": 4_000,
                                            "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400}).json()
    _validate_answer(document, "/profiles", "post", 201, profile)
    session = api.post("/api/v1/sessions", {"system_prompt": "You are careful.", "profile": profile["id"]}).json()
    api.post("/api/v1/sessions", {"system_prompt": "You are the copaw one.", "profile": {"policy": "copaw"}})
    for i in range(1, 8):
        api.post(f"/api/v1/sessions/{session['id']}/messages",
                 {"messages": [*([answer(i - 1)] if i > 1 else []), *tool_turn(i, output_bytes=1_200)]})
        api.post(f"/api/v1/sessions/{session['id']}/prepare")
    turns = api.get(f"/api/v1/sessions/{session['id']}/turns").json()
    assert "evicted" in {t["outcome"] for t in turns["turns"]}
    _validate_answer(document, "/sessions/{session_id}/turns", "get", 200, turns)
    listed = api.get("/api/v1/sessions").json()
    assert {s["policy"] for s in listed["sessions"]} == {"eviction", "copaw"}
    _validate_answer(document, "/sessions", "get", 200, listed)
    detail = api.get(f"/api/v1/sessions/{session['id']}").json()
    _validate_answer(document, "/sessions/{session_id}", "get", 200, detail)
    _validate_answer(document, "/profiles", "get", 200, api.get("/api/v1/profiles").json())
