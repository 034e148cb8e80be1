"""ContextLabClient against a real server (pytest-django's live_server), over HTTP."""

from __future__ import annotations

import importlib.util
import io
from contextlib import redirect_stdout

import pytest

from contextlab.client import ApiError, ContextLabClient
from contextlab.sessions.models import AgentSession
from tests.conversations import DEMO_CONVERSATION, REPO, answer, tool_turn


@pytest.fixture
def cl(live_server, alice_token) -> ContextLabClient:
    return ContextLabClient(live_server.url, alice_token, timeout=30)


def test_it_runs_an_agent_turn(cl):
    session = cl.create_session("You are terse.", profile={"name": "tiny", "max_input_length": 4_000})
    cl.add_messages(session["id"], tool_turn(1))
    turn = cl.prepare(session["id"])
    assert turn.turn == 1
    assert turn.messages[0] == {"role": "system", "content": "You are terse."}
    assert turn.outcome == "no_action"
    assert turn.payload_tokens > 0
    usage = cl.report_usage(session["id"], turn.turn, {"prompt_tokens": turn.payload_tokens})
    assert usage["difference"] == 0
    assert [t["number"] for t in cl.turns(session["id"])] == [1]
    cl.add_messages(session["id"], [answer(1), *tool_turn(2)])
    preview = cl.compact(session["id"], preview=True)["preview"]
    assert preview["compact_ids"] and preview["keep_ids"]
    result = cl.compact(session["id"], "Keep every path.")
    assert result["run"]["status"] == "done"
    assert result["turn"]["outcome"] == "compacted"
    assert cl.summaries(session["id"])[0]["version"] == 1


def test_it_raises_the_servers_error_and_field(cl):
    session = cl.create_session("")
    with pytest.raises(ApiError) as info:
        cl.add_messages(session["id"], [{"role": "tool", "tool_call_id": "nobody", "content": "x"}])
    assert info.value.status == 400
    assert info.value.field == "messages[0].tool_call_id"
    assert "orphan" in str(info.value)


def test_it_raises_on_a_bad_token(live_server, db):
    with pytest.raises(ApiError) as info:
        ContextLabClient(live_server.url, "cl_wrong").sessions()
    assert info.value.status == 401
    assert info.value.field == "Authorization"


def test_it_uploads_a_transcript(cl):
    session = cl.import_transcript(DEMO_CONVERSATION, title="uploaded")
    assert session["title"] == "uploaded"
    assert session["turns"] == 15


def test_the_agent_loop_example_runs_against_the_server(live_server, alice_token):
    spec = importlib.util.spec_from_file_location("agent_loop", REPO / "examples" / "agent_loop.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with redirect_stdout(out):
        assert module.main(["--url", live_server.url, "--token", alice_token, "--turns", "30",
                            "--window", "8000"]) == 0
    printed = out.getvalue()
    assert "turn   30" in printed
    assert "<- compacted" in printed
    session = AgentSession.objects.get()
    assert session.turns_count == 30
    assert session.compactions_count >= 1


def test_it_reviews_a_compaction_through_the_api(cl, settings):
    # The dry run is a background job: on the server's own pool, with no worker process to start.
    settings.CONTEXTLAB_JOBS_MODE = "embedded"
    session = cl.create_session("You are terse.", profile={"name": "review", "max_input_length": 4_000})
    sid = session["id"]
    cl.add_messages(sid, [*tool_turn(1), answer(1), *tool_turn(2)])
    pins = cl.pin(sid, fact="must keep: the DB is /srv/db.sqlite")
    assert pins["facts"] == ["must keep: the DB is /srv/db.sqlite"]
    assert cl.pins(sid) == pins
    run = cl.wait_for_run(sid, cl.dry_run(sid, "keep every path")["id"])
    assert run["kind"] == "dry_run" and run["status"] == "draft", run
    draft = run["draft"]
    assert "must keep: the DB is /srv/db.sqlite" in draft["summary"] and draft["compact_ids"]
    assert cl.summaries(sid) == []  # nothing committed by the dry run
    accepted = cl.accept_draft(sid, run["id"])
    assert accepted["run"]["status"] == "accepted" and accepted["turn"]["outcome"] == "compacted"
    assert cl.summaries(sid)[0]["text"] == draft["summary"]
    with pytest.raises(ApiError) as info:
        cl.accept_draft(sid, run["id"])  # accepted already: there is no draft to accept
    assert info.value.status == 409
    cl.add_messages(sid, [answer(2), *tool_turn(3)])
    other = cl.wait_for_run(sid, cl.dry_run(sid)["id"])
    assert cl.discard_draft(sid, other["id"])["run"]["status"] == "discarded"
    assert len(cl.summaries(sid)) == 1
    assert cl.pin(sid, fact="must keep: the DB is /srv/db.sqlite", remove=True)["facts"] == []
