"""The agent's loop through the HTTP API: append, prepare, report usage, compact, read back."""

from __future__ import annotations

from django.core.files.uploadedfile import SimpleUploadedFile

from tests.conversations import DEMO_CONVERSATION as DEMO
from tests.conversations import answer, tool_turn


def test_it_appends_messages_and_reports_their_fate(api, alice_session):
    response = api.post(f"/api/v1/sessions/{alice_session.id}/messages",
                        {"messages": tool_turn(1, output_bytes=4_000)})
    assert response.status_code == 201
    data = response.json()
    assert data["appended"] == 3
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "tool"]
    assert data["messages"][2]["truncated_stage"] == 1
    assert data["session"]["messages"] == 3


def test_it_runs_the_hook_and_returns_the_exact_payload(api, alice_session):
    api.post(f"/api/v1/sessions/{alice_session.id}/messages", {"messages": tool_turn(1)})
    response = api.post(f"/api/v1/sessions/{alice_session.id}/prepare")
    assert response.status_code == 200
    data = response.json()
    assert data["turn"] == 1
    assert data["messages"][0] == {"role": "system", "content": "You are a careful coding agent."}
    assert data["messages"][-1]["role"] == "tool"
    assert data["trace"]["schema"] == "contextlab.trace/1"
    assert [s["step"] for s in data["trace"]["steps"]][0] == "gate"
    turn = api.get(f"/api/v1/sessions/{alice_session.id}/turns/1").json()
    assert turn["messages"] == data["messages"]
    assert turn["trace"] == data["trace"]


def test_it_counts_the_tools_sent_with_prepare_as_a_budget_layer(api, alice_session):
    tools = [{"type": "function", "function": {"name": "run_shell", "description": "Run a shell command.",
                                               "parameters": {"type": "object", "properties": {
                                                   "command": {"type": "string", "description": "The command."}}}}}]
    api.post(f"/api/v1/sessions/{alice_session.id}/messages", {"messages": tool_turn(1)})
    first = api.post(f"/api/v1/sessions/{alice_session.id}/prepare", {"tools": tools}).json()
    tokens = first["trace"]["payload"]["tokens"]
    assert tokens["tools"] > 10
    # The layer stays for the next turns until a call says otherwise.
    again = api.post(f"/api/v1/sessions/{alice_session.id}/prepare").json()
    assert again["trace"]["payload"]["tokens"]["tools"] == tokens["tools"]
    cleared = api.post(f"/api/v1/sessions/{alice_session.id}/prepare", {"tools": []}).json()
    assert cleared["trace"]["payload"]["tokens"]["tools"] == 0
    bad = api.post(f"/api/v1/sessions/{alice_session.id}/prepare", {"tools": {"name": "run_shell"}})
    assert bad.status_code == 400 and bad.json()["field"] == "tools"


def test_it_records_reported_usage(api, alice_session):
    api.post(f"/api/v1/sessions/{alice_session.id}/messages", {"messages": tool_turn(1)})
    prepared = api.post(f"/api/v1/sessions/{alice_session.id}/prepare").json()
    counted = prepared["trace"]["payload"]["tokens"]["total"]
    response = api.post(f"/api/v1/sessions/{alice_session.id}/usage",
                        {"turn": 1, "usage": {"prompt_tokens": counted + 7, "completion_tokens": 12}})
    assert response.status_code == 200
    data = response.json()
    assert data["reported_prompt_tokens"] == counted + 7
    assert data["difference"] == 7
    assert api.get(f"/api/v1/sessions/{alice_session.id}/turns").json()["turns"][0]["usage"]["completion_tokens"] == 12


def test_it_refuses_usage_for_an_unknown_turn(api, alice_session):
    # The session (the URL) exists: a 404 would tell a client it is gone.
    response = api.post(f"/api/v1/sessions/{alice_session.id}/usage", {"turn": 5, "usage": {"prompt_tokens": 1}})
    assert response.status_code == 422
    assert response.json()["field"] == "turn"


def test_it_previews_and_runs_a_manual_compaction(api, alice_session):
    base = f"/api/v1/sessions/{alice_session.id}"
    for i in range(1, 4):
        api.post(f"{base}/messages", {"messages": [*([answer(i - 1)] if i > 1 else []), *tool_turn(i)]})
    preview = api.post(f"{base}/compact", {"preview": True}).json()["preview"]
    assert preview["compact_ids"] and preview["keep_ids"]
    response = api.post(f"{base}/compact", {"instruction": "Keep the log paths."})
    assert response.status_code == 200
    data = response.json()
    assert data["run"]["status"] == "done"
    assert data["turn"]["trigger"] == "manual"
    assert data["turn"]["outcome"] == "compacted"
    assert data["run"]["turn"] == data["turn"]["number"]
    summaries = api.get(f"{base}/summaries").json()
    assert summaries["current_version"] == 1
    assert summaries["summaries"][0]["compacted_ids"] == preview["compact_ids"]
    assert "## Goal" in summaries["summaries"][0]["text"]


def test_it_pages_turns_with_a_cursor(api, alice_session):
    base = f"/api/v1/sessions/{alice_session.id}"
    api.post(f"{base}/messages", {"messages": tool_turn(1)})
    for _ in range(3):
        api.post(f"{base}/prepare")
    turns = api.get(f"{base}/turns", after="1").json()["turns"]
    assert [t["number"] for t in turns] == [2, 3]
    assert "trace" not in turns[0]


def test_it_imports_an_uploaded_transcript(api, alice):
    upload = SimpleUploadedFile("demo_conversation.json", DEMO.read_bytes(), content_type="application/json")
    response = api.client.post("/api/v1/imports", {"file": upload, "title": "Imported demo"}, headers=api.headers)
    assert response.status_code == 201
    data = response.json()
    assert data["title"] == "Imported demo"
    assert data["source"]["format"] == "openai_messages"
    assert data["turns"] == 15  # a hook run before each of the 14 assistant messages, and one after the last
    assert data["status"] == "active"


def test_it_exports_and_reimports_a_bundle(api, alice_session):
    base = f"/api/v1/sessions/{alice_session.id}"
    api.post(f"{base}/messages", {"messages": tool_turn(1)})
    api.post(f"{base}/prepare")
    bundle = api.get(f"{base}/export")
    assert bundle["Content-Type"] == "application/zip"
    upload = SimpleUploadedFile("bundle.zip", bundle.content, content_type="application/zip")
    response = api.client.post("/api/v1/imports", {"file": upload}, headers=api.headers)
    assert response.status_code == 201
    copy = response.json()
    assert copy["id"] != str(alice_session.id)
    assert copy["turns"] == 1 and copy["messages"] == 3


def test_it_lists_and_creates_profiles(api):
    response = api.post("/api/v1/profiles", {"name": "big", "max_input_length": 200_000})
    assert response.status_code == 201
    assert response.json()["threshold"] == 140_000
    names = [p["name"] for p in api.get("/api/v1/profiles").json()["profiles"]]
    assert names == ["big"]


def test_it_answers_409_while_a_session_is_importing(api, alice_session):
    alice_session.status = "importing"
    alice_session.save()
    response = api.post(f"/api/v1/sessions/{alice_session.id}/messages", {"messages": tool_turn(1)})
    assert response.status_code == 409
    assert response.json()["field"] == "session"
    assert api.post(f"/api/v1/sessions/{alice_session.id}/prepare").status_code == 409


def test_it_keeps_long_names_and_odd_timestamps(api, alice_session):
    message = {"id": "m-1", "name": "n" * 500, "role": "user", "content": [{"type": "text", "text": "hi"}],
               "metadata": {}, "timestamp": "sometime on a Tuesday afternoon, local time, give or take a while"}
    response = api.post(f"/api/v1/sessions/{alice_session.id}/messages", {"messages": [message]})
    assert response.status_code == 201, response.content


def test_it_refuses_an_overlong_message_id(api, alice_session):
    message = {"id": "x" * 300, "name": "u", "role": "user", "content": [{"type": "text", "text": "hi"}],
               "metadata": {}, "timestamp": "2026-01-01 00:00:00.000"}
    response = api.post(f"/api/v1/sessions/{alice_session.id}/messages", {"messages": [message]})
    assert response.status_code == 400
    assert response.json()["field"] == "messages[0].id"
