"""Tool calls round-trip: the reply's tool_calls join the session, the next call's results pair with them."""

from __future__ import annotations

import json

from contextlab.gateway.models import GatewayExchange, GatewaySession
from contextlab.sessions.models import AgentSession
from tests.gateway.provider import Answer, scripted

SYSTEM = {"role": "system", "content": "You are a build agent with a shell."}
TOOLS = [{"type": "function", "function": {"name": "run_shell", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def _script(provider):
    provider.responder = scripted(
        Answer(content=None, tool_calls=[("run_shell", {"command": "make release"}),
                                         ("run_shell", {"command": "make test"})]),
        Answer(content="Checking the log.", tool_calls=[("run_shell", {"command": "tail build.log"})]),
        Answer("The linker cannot find tax_rate()."),
    )


def test_it_round_trips_tool_calls(openai_client, provider):
    _script(provider)
    messages = [SYSTEM, {"role": "user", "content": "Why does the release build fail?"}]
    while True:
        message = openai_client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS,
                                                        tool_choice="auto").choices[0].message
        messages.append(message)
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            command = json.loads(call.function.arguments)["command"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"$ {command}\nerror: tax_rate"})
    assert messages[-1].content == "The linker cannot find tax_rate()."

    # The provider saw each call paired with its results, tools forwarded every time.
    last = provider.chat_requests[-1].body
    assert last["tools"] == TOOLS and last["tool_choice"] == "auto"
    roles = [m["role"] for m in last["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant", "tool"]
    assert [c["id"] for c in last["messages"][2]["tool_calls"]] == \
        [m["tool_call_id"] for m in last["messages"][3:5]]

    # One session, every message ingested once, nothing pending.
    session = AgentSession.objects.get()
    assert session.messages.count() == len(messages) - 1
    assert not session.engine_state.get("pending_calls")
    assert list(GatewayExchange.objects.order_by("created").values_list("identity", flat=True)) == \
        ["new", "continued", "continued"]


def test_it_round_trips_streamed_tool_calls(openai_client, provider):
    _script(provider)
    messages: list = [SYSTEM, {"role": "user", "content": "Why does the release build fail?"}]
    for _ in range(3):
        calls: dict[int, dict] = {}
        text = []
        for chunk in openai_client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS,
                                                           stream=True):
            delta = chunk.choices[0].delta
            text.append(delta.content or "")
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": "", "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                entry["id"] = call.id or entry["id"]
                entry["function"]["name"] += (call.function.name or "") if call.function else ""
                entry["function"]["arguments"] += (call.function.arguments or "") if call.function else ""
        # Built by hand, the way streaming agents do: no refusal/annotations keys, "" for no text.
        messages.append({"role": "assistant", "content": "".join(text), "tool_calls": list(calls.values())}
                        if calls else {"role": "assistant", "content": "".join(text)})
        messages.extend({"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls.values())
    assert messages[-1]["content"] == "The linker cannot find tax_rate()."
    assert AgentSession.objects.count() == 1
    assert GatewaySession.objects.get().history_length == len(messages) - 1


def test_it_recognises_a_reply_that_a_framework_re_serialised(openai_client, provider):
    """LangChain-style echo: arguments re-dumped, content "" instead of null, no ids order change."""
    _script(provider)
    messages: list = [SYSTEM, {"role": "user", "content": "Why does the release build fail?"}]
    for _ in range(3):
        reply = openai_client.chat.completions.create(model="gpt-4o", messages=messages,
                                                      tools=TOOLS).choices[0].message
        echo: dict = {"role": "assistant", "content": reply.content or ""}
        if reply.tool_calls:
            echo["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": json.dumps(json.loads(c.function.arguments), indent=1)}}
                for c in reply.tool_calls]
        messages.append(echo)
        messages.extend({"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in reply.tool_calls or [])
    assert AgentSession.objects.count() == 1
    assert set(GatewayExchange.objects.values_list("identity", flat=True)) == {"new", "continued"}
