"""The Responses API adapter on its own: items as chat messages and back, compaction signatures, events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contextlab.gateway.protocols import openai_responses as proto

REASONING = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB-secret"}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "exec_command",
        "arguments": "{\"cmd\": \"ls\"}", "status": "completed"}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "a.txt\nb.txt"}
BODY: dict[str, Any] = {
    "model": "gpt-5-codex", "instructions": "Be brief.", "stream": True, "store": False,
    "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
              {"type": "web_search"}],
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: none."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]},
        REASONING, CALL, OUTPUT,
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Two files."}]},
        {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done."},
        {"type": "local_shell_call", "call_id": "call_3", "action": {"type": "exec", "command": ["pwd"]}},
        {"type": "local_shell_call_output", "call_id": "call_3", "output": "/work"},
        {"type": "future_item", "payload": 1},
        {"role": "user", "content": "Thanks."},
    ],
}


def test_it_reads_items_as_chat_messages():
    chat = proto.to_chat(BODY)
    messages = chat["messages"]
    assert messages[0] == {"role": "system", "content": "Be brief.\n\nSandbox: none."}
    assert [m["role"] for m in messages[1:]] == ["user", "assistant", "tool", "assistant", "tool", "assistant",
                                                 "tool", "developer", "user"]
    assert messages[2]["tool_calls"] == [{"id": "call_1", "type": "function", "function": {
        "name": "exec_command", "arguments": "{\"cmd\": \"ls\"}"}}]
    assert messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"}
    # The answer after the output, and the custom tool call after it, make one assistant message.
    assert messages[4]["content"] == "Two files." and messages[4]["tool_calls"][0]["function"] == {
        "name": "apply_patch", "arguments": "*** Begin Patch"}
    assert messages[6]["tool_calls"][0]["function"]["name"] == "local_shell"
    # An item type this adapter does not know is kept as its JSON, never dropped.
    assert json.loads(messages[-2]["content"].removeprefix("[future_item item] ")) == {
        "type": "future_item", "payload": 1}
    assert "gAAAAB-secret" not in json.dumps(messages)


def test_it_gives_the_items_back_verbatim_when_the_engine_keeps_everything():
    view = proto.manage_view(BODY)
    assert view.chat["tools"][1]["function"]["name"] == "web_search"
    back = view.body(BODY, view.chat["messages"], "upstream-model")
    assert back["input"] == BODY["input"]
    assert back["model"] == "upstream-model"
    assert {k: v for k, v in back.items() if k not in ("input", "model")} == {
        k: v for k, v in BODY.items() if k not in ("input", "model")}


def test_it_gives_back_what_the_engine_kept_cut_and_added():
    view = proto.manage_view(BODY)
    messages = view.chat["messages"]
    # The engine dropped the first exchange, summarised it, and shortened one output.
    managed = [messages[0], {"role": "user", "content": "Summary: the user listed the files."},
               *messages[4:7], {**messages[7], "content": "/wo[cut]"}, *messages[8:]]
    items = view.body(BODY, managed, "m")["input"]
    assert items[0] == BODY["input"][0]  # the developer item, verbatim
    assert items[1] == {"type": "message", "role": "user",
                        "content": [{"type": "input_text", "text": "Summary: the user listed the files."}]}
    assert REASONING not in items and CALL not in items and OUTPUT not in items
    shell_output = next(i for i in items if i.get("type") == "local_shell_call_output")
    assert shell_output == {**BODY["input"][9], "output": "/wo[cut]"}
    assert items[-1] == BODY["input"][-1]


def test_it_keeps_reasoning_with_the_call_it_preceded():
    body = {"input": [{"role": "user", "content": "go"}, REASONING, CALL, OUTPUT]}
    view = proto.manage_view(body)
    assert view.sourced[1].items == [REASONING, CALL]
    assert view.body(body, view.chat["messages"], None)["input"] == body["input"]


@pytest.mark.parametrize(("body", "headers", "endpoint", "kind"), [
    ({"tools": [], "input": [{"role": "user", "content": proto.CODEX_CHECKPOINT_PROMPT + ". Create..."}]}, {},
     proto.ENDPOINT, "local"),
    ({"tools": [CALL], "input": [{"role": "user", "content": "hi"}]},
     {proto.TURN_METADATA_HEADER: json.dumps({"request_kind": "compaction"})}, proto.ENDPOINT, "local"),
    ({"input": [{"role": "user", "content": "hi"}, {"type": "compaction_trigger"}]}, {}, proto.ENDPOINT, "remote"),
    ({"input": [{"role": "user", "content": "hi"}]}, {}, proto.COMPACT_ENDPOINT, "remote"),
    ({"tools": [], "input": [{"role": "user", "content": "hi"}]}, {}, proto.ENDPOINT, ""),
    ({"input": "hi"}, {proto.TURN_METADATA_HEADER: "not json"}, proto.ENDPOINT, ""),
])
def test_it_recognises_codex_compactions(body, headers, endpoint, kind):
    assert proto.compaction_kind(body, headers, endpoint=endpoint) == kind


def test_it_names_the_conversation_from_what_the_agent_sends():
    body = {"prompt_cache_key": "pck-1"}
    assert proto.conversation_key({"thread-id": "t-1", "session-id": "s-1"}, body) == "thread-id:t-1"
    assert proto.conversation_key({"session-id": "s-1"}, body) == "session-id:s-1"
    assert proto.conversation_key({}, body) == "prompt_cache_key:pck-1"
    assert proto.conversation_key({"thread-id": "bad\x00"}, {}) == ""


@pytest.mark.parametrize(("body", "param"), [
    ({"input": {"role": "user"}}, "input"),
    ({"input": [1]}, "input[0]"),
    ({}, "input"),
    ({"input": "hi", "instructions": ["x"]}, "instructions"),
    ({"input": "hi", "tools": {}}, "tools"),
])
def test_it_refuses_what_no_provider_takes(body, param):
    with pytest.raises(proto.BadRequest) as raised:
        proto.check(body)
    assert raised.value.param == param


def _event(kind: str, **fields: Any) -> bytes:
    return json.dumps({"type": kind, **fields}).encode()


def test_it_reads_a_stream_to_its_terminal_event():
    reader = proto.StreamReader()
    reader.feed(_event("response.created", response={"id": "resp_1", "status": "in_progress", "output": []}))
    reader.feed(_event("response.output_item.done", output_index=0, item=CALL))
    assert not reader.finished
    reader.feed(_event("response.completed", response={"id": "resp_1", "status": "completed", "output": [],
                                                      "usage": {"input_tokens": 9}}))
    assert reader.finished and reader.complete
    assert reader.answer.response_id == "resp_1" and reader.answer.usage == {"input_tokens": 9}
    assert reader.answer.reply() == ("", [{"id": "call_1", "type": "function", "function": {
        "name": "exec_command", "arguments": "{\"cmd\": \"ls\"}"}}])


@pytest.mark.parametrize("last", [
    _event("response.failed", response={"id": "r", "status": "failed", "error": {"message": "overloaded"}}),
    _event("response.incomplete", response={"id": "r", "status": "incomplete",
                                            "incomplete_details": {"reason": "max_output_tokens"}}),
    _event("error", code="server_error", message="boom"),
    _event("error", error={"type": "server_error", "code": "server_error", "message": "boom"}),
])
def test_it_tells_a_failed_stream_from_a_finished_one(last):
    reader = proto.StreamReader()
    reader.feed(last)
    assert reader.finished and not reader.complete and reader.answer.error


def test_it_reads_a_remote_compaction_answer_as_an_opaque_summary():
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAB-summary"}
    answer = proto.answer_of(json.dumps({"object": "response.compaction", "output": [item],
                                         "usage": {"input_tokens": 5}}).encode())
    assert answer is not None and answer.complete
    text, calls = answer.reply()
    assert text == proto.opaque_summary_text(item) and not calls
    assert "opaque" in text and "gAAAAB-summary" not in text


# -- reading only the items a conversation did not send last time -----------------------------

def _items() -> Any:
    from hypothesis import strategies as st

    text = st.sampled_from(["a", "b", "ls -la", "done"])
    call_id = st.sampled_from(["c1", "c2", "c3"])
    item = st.one_of(
        st.builds(lambda role, t: {"type": "message", "role": role, "content": [{"type": "input_text", "text": t}]},
                  st.sampled_from(["user", "developer"]), text),
        st.builds(lambda t: {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": t}]},
                  text),
        st.builds(lambda c: {"type": "function_call", "call_id": c, "name": "shell", "arguments": "{}"}, call_id),
        st.builds(lambda c, t: {"type": "function_call_output", "call_id": c, "output": t}, call_id, text),
        st.builds(lambda t: {"type": "reasoning", "encrypted_content": t, "summary": []}, text),
        st.builds(lambda t: {"type": "compaction", "encrypted_content": t}, text),
        st.builds(lambda t: {"type": "odd_item", "note": t}, text),
    )
    return st.lists(item, max_size=12)


def test_reading_only_the_new_items_gives_what_reading_them_all_gives() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=150, deadline=None)
    @given(_items(), _items(), _items(), st.integers(0, 12))
    def check(first: list[dict[str, Any]], more: list[dict[str, Any]], other: list[dict[str, Any]], cut: int) -> None:
        cache = proto.SourcedPrefixes(size=2)
        # A conversation that grows (the model's run of items may go on across calls), then one
        # rewritten from the middle (the agent's own compaction), then a call of another conversation.
        for conversation, items in (("c", first[:1]), ("c", first), ("c", first + more),
                                    ("c", (first + more)[:cut] + other), ("d", first), ("c", first + more)):
            fresh = [json.loads(json.dumps(item)) for item in items]  # a new request: equal items, new objects
            got_messages, got_trailing = cache.read(conversation, fresh)
            want_messages, want_trailing = proto.sourced_messages(fresh)
            assert got_messages == want_messages
            assert got_trailing == want_trailing

    check()
