from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from contextlab.engine.core.errors import ContextLabError
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, Turn
from tests.conversations import DEMO_CONVERSATION, TAU_BENCH
from tests.invariants import assert_nothing_lost

DEMO = DEMO_CONVERSATION
TAU = TAU_BENCH


@pytest.fixture
def demo_profile(alice):
    return services.profile_create(owner=alice, name="demo", knobs={
        "max_input_length": 4_000, "recent_max_bytes": 4_000, "old_max_bytes": 1_000})


def test_it_replays_a_transcript_turn_by_turn(alice, demo_profile):
    session = services.transcript_import(owner=alice, path=DEMO, profile=demo_profile)
    assert session.status == AgentSession.Status.ACTIVE
    assert session.source["format"] == "openai_messages"
    assert session.system_prompt.startswith("You are a coding agent")
    # A turn ends before each assistant message, plus the final one.
    assistants = 14
    assert Turn.objects.filter(session=session).count() == assistants + 1
    session.refresh_from_db()
    assert session.messages_count == 31
    assert session.messages.filter(truncated_stage__isnull=False).exists()
    assert session.compactions_count >= 1
    assert_nothing_lost(session)


def test_it_imports_an_uploaded_file(alice, small_profile):
    upload = SimpleUploadedFile("demo.json", DEMO.read_bytes(), content_type="application/json")
    session = services.transcript_import(owner=alice, upload=upload, profile=small_profile)
    assert session.title == "demo.json"
    assert session.turns_count == 15
    assert session.source["file"] == "demo.json"


@pytest.mark.skipif(not TAU.exists(), reason="the shared corpus is not present")
def test_it_imports_the_tau_bench_transcript(alice, small_profile):
    session = services.transcript_import(owner=alice, path=TAU, profile=small_profile)
    assert session.source["format"] == "tau_bench"
    assert session.compactions_count >= 1
    assert_nothing_lost(session)


def test_it_refuses_an_unknown_format_before_writing_anything(alice, tmp_path):
    path = tmp_path / "notes.json"
    path.write_text('{"hello": "world"}')
    with pytest.raises(ContextLabError) as info:
        services.transcript_import(owner=alice, path=path)
    assert info.value.field
    assert not AgentSession.objects.exists()


def test_it_refuses_invalid_utf8(alice):
    upload = SimpleUploadedFile("bad.json", b'[{"role": "user", "content": "\xff\xfe"}]')
    with pytest.raises(ContextLabError) as info:
        services.transcript_import(owner=alice, upload=upload)
    assert info.value.field == "file"
    assert not AgentSession.objects.exists()


def test_it_refuses_an_upload_over_the_limit(alice, settings):
    settings.CONTEXTLAB_MAX_UPLOAD_BYTES = 100
    upload = SimpleUploadedFile("big.json", b"[" + b" " * 200 + b"]")
    with pytest.raises(services.PayloadTooLarge):
        services.transcript_import(owner=alice, upload=upload)


def test_it_keeps_only_a_safe_file_name(alice, small_profile):
    upload = SimpleUploadedFile("../../etc/demo.json", DEMO.read_bytes())
    session = services.transcript_import(owner=alice, upload=upload, profile=small_profile)
    assert session.title == "demo.json"


def test_it_removes_a_session_whose_replay_fails(alice):
    # The importer accepts the file, but the engine refuses its 3.5 KB tool
    # output half-way through the replay (this profile takes 1,000 bytes).
    tight = services.profile_create(owner=alice, name="tight", knobs={"max_message_bytes": 1_000})
    with pytest.raises(ContextLabError) as info:
        services.transcript_import(owner=alice, path=DEMO, profile=tight)
    assert info.value.field.startswith("messages[")
    assert not AgentSession.objects.exists()
    assert not Turn.objects.exists()


SWE_AGENT = TAU_BENCH.parents[1] / "swe-agent" / "replay__marshmallow-1867__function_calling_replace_from_source.traj"


@pytest.mark.skipif(not SWE_AGENT.exists(), reason="the shared corpus is not present")
@pytest.mark.parametrize("background", [False, True])
def test_it_counts_the_tool_definitions_the_transcript_records_in_every_turn(alice, demo_profile, background):
    if background:
        session, run = services.transcript_import_enqueue(owner=alice, path=SWE_AGENT, profile=demo_profile)
        assert run is not None
        services.transcript_import_work(run_id=run.pk)
        session.refresh_from_db()
    else:
        session = services.transcript_import(owner=alice, path=SWE_AGENT, profile=demo_profile)
    turns = list(Turn.objects.filter(session=session))
    assert turns
    layers = {turn.trace["payload"]["tokens"]["tools"] for turn in turns}
    # One fixed layer, the same in every turn, and not empty: the agent's tools.
    assert len(layers) == 1 and layers.pop() > 100
    assert_nothing_lost(session)
