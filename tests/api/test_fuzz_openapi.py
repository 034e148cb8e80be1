"""Property-based fuzzing of the JSON API from its own OpenAPI document (spec §3).

Schemathesis reads ``/api/v1/openapi.json`` as served and, for every operation,
sends valid and invalid requests through the Django WSGI application with a
real bearer token. Path parameters are, most of the time, ids of objects that
exist (a session with turns, a compaction run), so the requests reach the
services instead of stopping at a 404. No answer may be a 5xx, and every answer
must be one the document declares, with the declared content type and shape.

Bounded and seeded, so it runs in CI in well under two minutes and a failure is
reproducible.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from typing import Any

import hypothesis.strategies as st
import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    response_schema_conformance,
    status_code_conformance,
)

from contextlab.api.models import ApiToken, hash_token
from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession
from contextlab.support import jobs
from contextlab.wsgi import application
from tests.conversations import answer, tool_turn

# No 5xx, ever; and the answer is one the document declares, in its declared
# content type and shape. The strictness checks (the server refuses what the
# document forbids and accepts what it allows) run against the live server, in
# test_fuzz_live.py; this quick in-process pass keeps the hooks' WSGI path covered.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          ignored_auth]

# A deeper or different run, locally: CONTEXTLAB_FUZZ_EXAMPLES=500 CONTEXTLAB_FUZZ_SEED=7 pytest ...
SEED = int(os.environ.get("CONTEXTLAB_FUZZ_SEED") or 20_260_321)
MAX_EXAMPLES = int(os.environ.get("CONTEXTLAB_FUZZ_EXAMPLES") or 25)
# Known before the schema loads (the configuration names it); its row is created
# per test by ``world``.
TOKEN = "cl_fuzz_" + secrets.token_urlsafe(24)
# The ids of the objects that exist in the current test, for the path hook.
WORLD: dict[str, Any] = {}

# Loaded when the module is collected (the document needs no database), not
# through ``schemathesis.pytest.from_fixture``: that loader sets a private
# attribute of pytest's test node that pytest 9 no longer has.
schema = schemathesis.openapi.from_wsgi(
    "/api/v1/openapi.json", application,
    config=SchemathesisConfig.from_dict({
        "seed": SEED,
        "generation": {"max-examples": MAX_EXAMPLES, "mode": "all", "database": "none"},
        "auth": {"openapi": {"bearer": {"bearer": TOKEN}}},
        "phases": {"stateful": {"enabled": False}},
    }),
)


@schema.hook
def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> Any:
    if not path_parameters or not WORLD:
        return st.just(path_parameters)
    # Mostly objects that exist; sometimes the generated value, for the 404s.
    known = {**path_parameters, **{k: v for k, v in WORLD.items() if k in path_parameters}}
    return st.sampled_from([known, known, known, path_parameters])


@schema.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    # A background compaction or import finishes before the next request, so
    # every run is deterministic and no job outlives its test.
    assert jobs.drain(60)


@pytest.fixture
def world(transactional_db: None) -> Iterator[dict[str, Any]]:
    """The fuzzer's user, token, and a session with turns, a summary and a compaction run.

    A transactional database: the API commits like in production, so a view
    that breaks a transaction shows up as that request's error, not as every
    later request failing inside the test's own transaction.
    """
    owner = User.objects.create_user("fuzzer")
    ApiToken.objects.create(user=owner, name="fuzz", key_hash=hash_token(TOKEN), prefix=TOKEN[:8])
    profile = services.profile_create(owner=owner, name="small", knobs={
        "max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400})
    session = services.session_create(owner=owner, system_prompt="You are a careful coding agent.",
                                      profile=profile, title="fuzzed")
    for i in range(1, 4):
        services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                            *tool_turn(i, output_bytes=1_200)])
        services.session_prepare(session=session)
    run = services.compaction_run(session=session, instruction="Keep the target names.", requested_by=owner)
    WORLD.update(session_id=str(session.pk), number=session.turns.count(), run_id=run.pk)
    yield WORLD
    WORLD.clear()


@schema.parametrize()
# ``world`` is set up once per operation on purpose: the generated requests of
# one operation share its session, like an agent's calls do.
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_it_answers_every_generated_request_without_a_server_error(case: Any, world: dict[str, Any]) -> None:
    case.call_and_validate(checks=CHECKS)


# -- what the fuzzer found, pinned ------------------------------------------------------
# Each of these answered 500 once (some on PostgreSQL only, which cannot store
# NUL in text or JSON; some on SQLite only, which cannot bind an integer past
# 64 bits). They run on whichever database the suite uses.

TOO_BIG = 2**63  # one past the largest integer either database stores


@pytest.mark.parametrize("query", [f"offset={TOO_BIG}", f"offset={10**20}", f"profile={TOO_BIG}"])
def test_it_refuses_a_list_query_past_64_bits(api, alice_session, query):
    response = api.get(f"/api/v1/sessions?{query}")
    assert response.status_code == 400, response.content
    assert response.json()["field"] == query.partition("=")[0]


def test_it_still_pages_at_the_largest_offset(api, alice_session):
    response = api.get(f"/api/v1/sessions?offset={TOO_BIG - 1}")
    assert response.status_code == 200
    assert response.json()["sessions"] == []


def test_it_refuses_turns_after_a_number_past_64_bits(api, alice_session):
    response = api.get(f"/api/v1/sessions/{alice_session.pk}/turns?after={TOO_BIG}")
    assert response.status_code == 400
    assert response.json()["field"] == "after"


@pytest.mark.parametrize(("usage", "field"), [
    ({"prompt_tokens": 5, "details": {"note": "a\x00b"}}, "usage.details.note"),
    ({"prompt_tokens": 5, "details": {"a\x00b": 1}}, "usage.details"),
])
def test_it_refuses_a_usage_report_holding_nul(api, alice_session, usage, field):
    services.messages_append(session=alice_session, messages=tool_turn(1))
    services.session_prepare(session=alice_session)
    response = api.post(f"/api/v1/sessions/{alice_session.pk}/usage", {"turn": 1, "usage": usage})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert alice_session.turns.get(number=1).usage is None


@pytest.mark.parametrize("path", ["usage", "messages"])
def test_it_refuses_a_number_too_large_for_a_float(api, alice_session, path):
    # 1e400 parses to infinity, which neither database accepts in a JSON column.
    services.messages_append(session=alice_session, messages=tool_turn(1))
    services.session_prepare(session=alice_session)
    raw = ('{"turn": 1, "usage": {"prompt_tokens": 1e400}}' if path == "usage"
           else '{"messages": [{"role": "user", "content": "x", "extra": 1e400}]}')
    response = api.post(f"/api/v1/sessions/{alice_session.pk}/{path}", raw=raw)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "body"
    assert "too large" in response.json()["error"]


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "nightly", "timezone": "Europe/\x00Paris"}, "timezone"),
    ({"name": "nightly", "\x00": 1}, "body"),
])
def test_it_refuses_a_profile_holding_nul(api, alice, body, field):
    response = api.post("/api/v1/profiles", body)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert not AgentProfile.objects.filter(owner=alice, name="nightly").exists()


@pytest.mark.parametrize(("profile", "field"), [
    ("small\x00", "profile"),
    ({"name": "inline", "timezone": "UTC\x00"}, "profile.timezone"),
])
def test_it_refuses_a_session_whose_profile_holds_nul(api, alice, profile, field):
    response = api.post("/api/v1/sessions", {"system_prompt": "", "profile": profile})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert not AgentSession.objects.filter(owner=alice).exists()


def test_it_refuses_an_import_form_field_holding_nul(client, alice, alice_token):
    transcript = json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    response = client.post("/api/v1/imports", {"file": SimpleUploadedFile("t.json", transcript.encode()),
                                                "profile": "de\x00fault"},
                           headers={"Authorization": f"Bearer {alice_token}"})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "profile"
    assert not AgentSession.objects.filter(owner=alice).exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite stores NUL in text")
def test_it_refuses_a_transcript_postgresql_cannot_store(client, alice, alice_token):
    transcript = json.dumps([{"role": "user", "content": "a\x00b"}, {"role": "assistant", "content": "ok"}])
    response = client.post("/api/v1/imports", {"file": SimpleUploadedFile("t.json", transcript.encode())},
                           headers={"Authorization": f"Bearer {alice_token}"})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "file"
    assert not AgentSession.objects.filter(owner=alice).exists()  # the half-import is gone
