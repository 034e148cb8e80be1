"""The API is exactly as strict as its document (issue 12, item 7).

Each request here was found by schemathesis against the live server (see
``test_fuzz_live.py``): the document forbade it and the server accepted it, or
the other way round. Fixed on whichever side was wrong, pinned here in process.
"""

from __future__ import annotations

import json
import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from contextlab.api.openapi import NOT_BLANK
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession
from tests.conversations import tool_turn


def _document(api) -> dict:
    return api.get("/api/v1/openapi.json").json()


def _request_schema(document: dict, path: str, content: str = "application/json") -> dict:
    return document["paths"][path]["post"]["requestBody"]["content"][content]["schema"]


SESSION_BODIES = {
    "messages": {"messages": []},
    "prepare": {},
    "usage": {"turn": 1, "usage": {"prompt_tokens": 1}},
    "compact": {"preview": True},
    "recall": {"query": "build"},
}


@pytest.mark.parametrize("endpoint", sorted(SESSION_BODIES))
def test_it_refuses_a_field_the_document_does_not_list(api, alice_session, endpoint):
    body = {**SESSION_BODIES[endpoint], "previeww": True}
    response = api.post(f"/api/v1/sessions/{alice_session.pk}/{endpoint}", body)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "previeww"
    schema = _request_schema(_document(api), f"/sessions/{{session_id}}/{endpoint}")
    assert schema["additionalProperties"] is False and "previeww" not in schema["properties"]


def test_it_refuses_an_unknown_field_when_creating_a_session(api, alice):
    response = api.post("/api/v1/sessions", {"system_prompt": "", "titel": "typo"})
    assert response.status_code == 400
    assert response.json()["field"] == "titel"
    assert not AgentSession.objects.filter(owner=alice).exists()


@pytest.mark.parametrize("field", ["profile", "title"])
def test_it_refuses_null_where_the_document_says_a_value(api, alice, field):
    response = api.post("/api/v1/sessions", {"system_prompt": "", field: None})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field


@pytest.mark.parametrize(("name", "status"), [(None, 400), (7, 400), ("", 201), ("inline", 201)])
def test_it_names_an_inline_profile_as_the_document_says(api, alice, name, status):
    response = api.post("/api/v1/sessions", {"system_prompt": "", "profile": {"name": name, "policy": "copaw"}})
    assert response.status_code == status, response.content
    if status == 400:
        assert response.json()["field"] == "profile.name"


@pytest.mark.parametrize("query", ["failed=null", "failed=1", "failed=", "profile=0", "limit=", "offset="])
def test_it_refuses_a_list_query_the_document_forbids(api, alice_session, query):
    response = api.get(f"/api/v1/sessions?{query}")
    assert response.status_code == 400, (query, response.content)
    assert response.json()["field"] == query.partition("=")[0]


def test_it_takes_the_boolean_the_document_declares(api, alice_session):
    assert api.get("/api/v1/sessions?failed=true").json()["count"] == 0
    assert api.get("/api/v1/sessions?failed=false").json()["count"] == 1


def test_it_checks_every_compaction_field_before_previewing(api, alice_session):
    response = api.post(f"/api/v1/sessions/{alice_session.pk}/compact", {"preview": True, "background": None})
    assert response.status_code == 400
    assert response.json()["field"] == "background"


def test_it_refuses_a_tool_that_is_not_a_function(api, alice_session):
    response = api.post(f"/api/v1/sessions/{alice_session.pk}/prepare",
                        {"tools": [{"type": {}, "function": {"name": "grep"}}]})
    assert response.status_code == 400
    assert response.json()["field"] == "tools[0]"


def test_it_takes_null_tools_and_response_format_as_the_document_says(api, alice_session):
    services.messages_append(session=alice_session, messages=tool_turn(1))
    response = api.post(f"/api/v1/sessions/{alice_session.pk}/prepare", {"tools": None, "response_format": None})
    assert response.status_code == 200
    schema = _request_schema(_document(api), "/sessions/{session_id}/prepare")
    assert schema["properties"]["tools"]["nullable"] and schema["properties"]["response_format"]["nullable"]


def test_it_refuses_a_null_recall_limit(api, alice_session):
    response = api.post(f"/api/v1/sessions/{alice_session.pk}/recall", {"query": "build", "limit": None})
    assert response.status_code == 400
    assert response.json()["field"] == "limit"


def test_the_document_says_what_the_server_refuses_in_a_query_and_a_usage(api):
    document = _document(api)
    recall = _request_schema(document, "/sessions/{session_id}/recall")["properties"]["query"]
    assert recall["minLength"] == 1 and recall["pattern"] == NOT_BLANK
    usage = _request_schema(document, "/sessions/{session_id}/usage")["properties"]
    assert usage["turn"]["minimum"] == 1 and usage["usage"]["minProperties"] == 1
    turns = document["paths"]["/sessions/{session_id}/turns"]["get"]["parameters"]
    assert next(p for p in turns if p["name"] == "after")["schema"]["minimum"] == 0


def test_the_document_lists_the_servers_timezones_and_providers(api, settings):
    settings.CONTEXTLAB_PROVIDERS = {"local": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": ""}}
    schemas = _document(api)["components"]["schemas"]
    assert "Europe/Paris" in schemas["Timezone"]["enum"] and "" not in schemas["Timezone"]["enum"]
    assert schemas["ProfileSettings"]["properties"]["timezone"] == {"$ref": "#/components/schemas/Timezone"}
    assert schemas["ProfileSettings"]["properties"]["compaction_provider"]["enum"] == ["", "local"]
    assert schemas["NewProfile"]["properties"]["name"]["pattern"] == NOT_BLANK


def test_it_documents_429_with_retry_after_on_every_authenticated_operation(api):
    for path, item in _document(api)["paths"].items():
        for method, operation in item.items():
            if method not in ("get", "post") or operation.get("security") == []:
                continue
            assert "Retry-After" in operation["responses"]["429"]["headers"], (path, method)
            assert "401" in operation["responses"], (path, method)


def _import(client, token, **fields):
    transcript = json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    return client.post("/api/v1/imports", {"file": SimpleUploadedFile("t.json", transcript.encode()), **fields},
                       headers={"Authorization": f"Bearer {token}"})


@pytest.mark.parametrize(("fields", "field"), [({"titel": "typo"}, "titel"), ({"background": "maybe"}, "background")])
def test_it_refuses_an_import_form_the_document_forbids(client, alice, alice_token, fields, field):
    response = _import(client, alice_token, **fields)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert not AgentSession.objects.filter(owner=alice).exists()


def test_it_imports_in_the_foreground_when_background_is_no(client, alice, alice_token):
    assert _import(client, alice_token, background="false").status_code == 201


def test_a_rate_limited_answer_is_the_one_the_document_declares(api, alice_session, settings):
    from openapi_schema_validator import OAS30Validator

    settings.CONTEXTLAB_RATE_LIMIT_API = "1/3600"
    api.get("/api/v1/sessions")
    response = api.get("/api/v1/sessions")
    assert response.status_code == 429
    declared = _document(api)["paths"]["/sessions"]["get"]["responses"]["429"]
    document = _document(api)
    OAS30Validator({**declared["content"]["application/json"]["schema"],
                    "components": document["components"]}).validate(response.json())
    assert int(response.headers["Retry-After"]) >= declared["headers"]["Retry-After"]["schema"]["minimum"]


def test_its_not_blank_pattern_refuses_exactly_the_characters_the_server_strips():
    # Found by the fuzzer: a query of only U+001E passed ``\S`` (a JSON Schema validator's
    # regex calls it a character) and the server refused it as blank (Python calls it a space).
    for code in range(0x110000):
        if 0xD800 <= code < 0xE000:
            continue
        character = chr(code)
        assert (re.fullmatch(NOT_BLANK, character) is None) == character.isspace(), hex(code)
    assert re.search(NOT_BLANK, "\x1e\x1f ") is None and re.search(NOT_BLANK, " a ") is not None


def test_it_refuses_a_query_of_information_separators_as_its_document_says(api, alice_session):
    response = api.post(f"/api/v1/sessions/{alice_session.pk}/recall", {"query": "\x1e"})
    assert response.status_code == 400 and response.json()["field"] == "query"
    query = _request_schema(_document(api), "/sessions/{session_id}/recall")["properties"]["query"]
    assert re.search(query["pattern"], "\x1e") is None
