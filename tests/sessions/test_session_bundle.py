from __future__ import annotations

import io
import json
import zipfile

import pytest

from contextlab.engine.core.errors import MalformedInput
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, SessionMessage
from tests.conversations import answer, tool_turn


def _members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


@pytest.fixture
def busy_session(alice_session):
    for i in range(1, 6):
        services.messages_append(session=alice_session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                 *tool_turn(i, output_bytes=2_500)])
        services.session_prepare(session=alice_session)
    services.usage_report(session=alice_session, turn_number=1, usage={"prompt_tokens": 321})
    services.compaction_run(session=alice_session)
    alice_session.refresh_from_db()
    return alice_session


def test_it_exports_rows_state_and_workspace_files(busy_session):
    members = _members(services.session_export(session=busy_session))
    assert {"session.json", "messages.jsonl", "turns.jsonl", "summaries.jsonl", "offloaded_files.jsonl",
            "compaction_runs.jsonl"} <= members.keys()
    assert any(name.startswith("workspace/dialog/") for name in members)
    assert any(name.startswith("workspace/tool_result/") for name in members)
    manifest = json.loads(members["session.json"])
    assert manifest["id"] == str(busy_session.id)
    assert manifest["engine_state"] == busy_session.engine_state
    assert len(members["messages.jsonl"].splitlines()) == busy_session.messages_count


def test_it_exports_the_same_bytes_twice(busy_session):
    assert services.session_export(session=busy_session) == services.session_export(session=busy_session)


def test_it_imports_a_bundle_back_identically(busy_session, bob):
    bundle = services.session_export(session=busy_session)
    copy = services.session_import_bundle(owner=bob, data=bundle)
    assert copy.id != busy_session.id  # the id is taken, so the copy gets a new one
    assert copy.owner == bob
    assert copy.profile.owner == bob
    again = _members(services.session_export(session=copy))
    original = _members(bundle)
    assert again.keys() == original.keys()
    for name in original:
        if name == "session.json":
            first, second = json.loads(original[name]), json.loads(again[name])
            assert first.pop("id") != second.pop("id")
            assert first == second
        else:
            assert again[name] == original[name], name


def test_it_keeps_the_id_when_it_is_free(busy_session):
    bundle = services.session_export(session=busy_session)
    owner, session_id = busy_session.owner, busy_session.id
    services.session_delete(session=busy_session)
    restored = services.session_import_bundle(owner=owner, data=bundle)
    assert restored.id == session_id
    assert _members(services.session_export(session=restored)) == _members(bundle)
    # The restored session goes on working.
    services.messages_append(session=restored, messages=[answer(99)])
    services.session_prepare(session=restored)


def test_it_refuses_a_path_that_escapes_the_workspace(busy_session):
    members = _members(services.session_export(session=busy_session))
    members["workspace/../../escaped.txt"] = b"nope"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(MalformedInput) as info:
        services.session_import_bundle(owner=busy_session.owner, data=buffer.getvalue())
    assert info.value.field == "file"
    assert AgentSession.objects.count() == 1


def test_it_refuses_a_zip_that_is_not_a_bundle(alice):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(MalformedInput):
        services.session_import_bundle(owner=alice, data=buffer.getvalue())
    assert not AgentSession.objects.exists()
    assert not SessionMessage.objects.exists()
