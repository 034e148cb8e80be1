"""A read whose file is written later is flagged in the message fate and the LLM view."""

from __future__ import annotations

from django.urls import reverse

from contextlab.sessions import services


def _call(call_id: str, name: str, args: str) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]}


def test_it_flags_a_stale_read_in_the_fate_and_the_llm_view(alice_client, alice_session) -> None:
    services.messages_append(session=alice_session, messages=[
        {"role": "user", "content": "fix the bug in src/app.py"},
        _call("c-read", "read_file", '{"file_path": "src/app.py"}'),
        {"role": "tool", "tool_call_id": "c-read", "content": "def main():\n    return 1\n"},
        _call("c-write", "write_file", '{"file_path": "src/app.py", "content": "def main():\\n    return 2\\n"}'),
        {"role": "tool", "tool_call_id": "c-write", "content": "written"},
    ])
    services.session_prepare(session=alice_session)
    alice_session.refresh_from_db()

    messages = alice_client.get(reverse("cl-session-messages", args=[alice_session.pk]))
    assert b"stale: src/app.py was written later" in messages.content

    llm = alice_client.get(reverse("cl-session-llm", args=[alice_session.pk]))
    assert b"chip--stale" in llm.content and b"src/app.py changed since this read" in llm.content
