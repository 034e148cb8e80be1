"""A session driven through the gateway is an ordinary session on the dashboard."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import Client

from contextlab.sessions.models import AgentSession
from tests.gateway.provider import tool_loop

SYSTEM = {"role": "system", "content": "You are a build agent."}
TOOLS = [{"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object"}}}]


def test_it_shows_the_session_and_its_traced_turns(openai_client, provider, alice_browser):
    provider.responder = tool_loop("run_shell", final="The build is green.")
    messages: list = [SYSTEM, {"role": "user", "content": "Is the build green?"}]
    while True:
        message = openai_client.chat.completions.create(model="gpt-4o", messages=messages,
                                                        tools=TOOLS).choices[0].message
        messages.append(message)
        if not message.tool_calls:
            break
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "all tests passed"}
                     for c in message.tool_calls]
    session = AgentSession.objects.get()

    listing = alice_browser.get("/")
    assert listing.status_code == 200 and "gateway · Is the build green?" in listing.content.decode()
    page = alice_browser.get(f"/sessions/{session.pk}/")
    assert page.status_code == 200
    assert "gateway · Is the build green?" in page.content.decode()
    turns = list(session.turns.order_by("number"))
    assert [t.number for t in turns] == [1, 2]
    for turn in turns:
        assert turn.trace["steps"] and turn.trace["outcome"]
        assert turn.usage is not None
        assert alice_browser.get(f"/sessions/{session.pk}/turns/{turn.number}/").status_code == 200


def test_it_shows_nothing_to_another_user(openai_client, provider, bob):
    openai_client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    browser = Client()
    browser.force_login(User.objects.get(username="bob"))
    assert browser.get(f"/sessions/{AgentSession.objects.get().pk}/").status_code == 404
