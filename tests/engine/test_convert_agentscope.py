"""AgentScope ``Msg`` dict conversion (CoPaw / ReMe)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from contextlab.engine.convert.agentscope import from_agentscope, normalise_timestamp, to_agentscope
from contextlab.engine.convert.openai import from_openai
from contextlab.engine.core.errors import InvalidMessages
from contextlab.engine.core.messages import (
    MediaBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    check_sequence,
)


def copaw_session() -> list[dict[str, Any]]:
    return [
        {"id": "m1", "name": "user", "role": "user", "content": "Read notes.md", "metadata": {},
         "timestamp": "2026-03-19 23:59:59.900"},
        {"id": "m2", "name": "Friday", "role": "assistant", "content": [
            {"type": "thinking", "thinking": "use read_file"},
            {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"file_path": "notes.md"},
             "raw_input": '{"file_path": "notes.md"}'},
        ], "metadata": {}, "timestamp": "2026-03-20 00:00:00.100"},
        {"id": "m3", "name": "system", "role": "system", "content": [
            {"type": "tool_result", "id": "call_1", "name": "read_file",
             "output": [{"type": "text", "text": "# Notes\n- buy milk"}]},
        ], "metadata": {}, "timestamp": "2026-03-20 00:00:00.300"},
        {"id": "m4", "name": "Friday", "role": "assistant", "content": [{"type": "text", "text": "Buy milk."}],
         "metadata": {"finished": True}, "timestamp": "2026-03-20 00:00:01.000"},
    ]


def test_it_maps_copaw_tool_results_to_tool_messages() -> None:
    msgs = from_agentscope(copaw_session())

    assert [m.role for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[2].content == (ToolResultBlock(id="call_1", name="read_file", output=(TextBlock("# Notes\n- buy milk"),)),)
    assert msgs[2].metadata["agentscope"]["role"] == "system"
    assert msgs[1].tool_uses[0] == ToolUseBlock(
        id="call_1", name="read_file", input={"file_path": "notes.md"}, raw_input='{"file_path": "notes.md"}'
    )
    assert [m.id for m in msgs] == ["m1", "m2", "m3", "m4"]
    assert msgs[1].name == "Friday"
    check_sequence(msgs)


def test_it_round_trips_agentscope_records() -> None:
    data = copaw_session()
    assert to_agentscope(from_agentscope(copy.deepcopy(data))) == data


def test_it_stores_timestamps_in_utc_and_gives_the_original_back() -> None:
    msgs = from_agentscope(copaw_session())
    # AgentScope's naive local time is taken as UTC; the date does not shift.
    assert msgs[0].timestamp == "2026-03-19T23:59:59.900Z"
    assert msgs[1].timestamp == "2026-03-20T00:00:00.100Z"
    assert to_agentscope(msgs)[0]["timestamp"] == "2026-03-19 23:59:59.900"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2026-03-19 23:59:59.900", "2026-03-19T23:59:59.900Z"),
        ("2026-03-19T23:59:59", "2026-03-19T23:59:59.000Z"),
        ("2026-03-20T08:00:00+08:00", "2026-03-20T00:00:00.000Z"),
        ("2026-02-12T15:43:07.997Z", "2026-02-12T15:43:07.997Z"),
        (0, "1970-01-01T00:00:00.000Z"),
        ("yesterday", None),
        ("", None),
        (None, None),
    ],
)
def test_it_normalises_timestamps(raw: Any, expected: str | None) -> None:
    assert normalise_timestamp(raw) == expected


def test_it_gives_user_role_results_back_as_user() -> None:
    data = [
        {"id": "a", "name": "Friday", "role": "assistant", "content": [
            {"type": "tool_use", "id": "c", "name": "ls", "input": {}}], "metadata": {}, "timestamp": ""},
        {"id": "b", "name": "user", "role": "user", "content": [
            {"type": "tool_result", "id": "c", "name": "ls", "output": "x"},
            {"type": "text", "text": "and then?"}], "metadata": {}, "timestamp": "2026-01-01 00:00:00.000"},
    ]
    msgs = from_agentscope(copy.deepcopy(data))

    assert [m.role for m in msgs] == ["assistant", "tool", "user"]
    assert [m.id for m in msgs] == ["a", "b", "b#1"]
    back = to_agentscope(msgs)
    assert len(back) == 2  # the two pieces of record "b" go back together
    assert back[1] == data[1]
    assert back[0]["timestamp"] == ""


def test_it_writes_tool_messages_as_system_by_default() -> None:
    msgs = from_openai([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "out"},
    ])
    back = to_agentscope(msgs)

    assert back[0]["content"] == "hi"
    assert back[2]["role"] == "system"
    assert back[2]["content"] == [{"type": "tool_result", "id": "c", "name": "ls", "output": "out"}]
    assert back[1]["content"][0]["raw_input"] == "{}"
    # Our UTC timestamp in AgentScope's format.
    assert len(back[0]["timestamp"]) == len("2026-03-19 23:59:59.900")


def test_it_reads_media_sources() -> None:
    data = [{"id": "x", "name": "user", "role": "user", "metadata": {}, "timestamp": "2026-01-01 00:00:00.000",
             "content": [
                 {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                 {"type": "audio", "source": {"type": "base64", "media_type": "audio/wav", "data": "UklG"}},
             ]}]
    msg = from_agentscope(copy.deepcopy(data))[0]
    assert msg.content == (
        MediaBlock(kind="image", url="https://x.test/a.png"),
        MediaBlock(kind="audio", media_type="audio/wav", data="UklG"),
    )
    assert to_agentscope([msg]) == data


def test_it_rejects_an_orphan_tool_result() -> None:
    data = copaw_session()[2:]
    with pytest.raises(InvalidMessages) as info:
        from_agentscope(data)
    assert info.value.field == "messages[0].content[0].id"


def test_it_accepts_results_of_calls_from_an_earlier_batch() -> None:
    msgs = from_agentscope(copaw_session()[2:], known_calls={"call_1": "read_file"})
    assert msgs[0].role == "tool"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([{"id": "1", "name": "x", "role": "tool", "content": "x"}], "messages[0].role"),
        ([{"id": "1", "name": "x", "role": "user", "content": 5}], "messages[0].content"),
        ([{"id": "1", "name": "x", "role": "user", "content": [{"type": "html"}]}], "messages[0].content[0].type"),
        ([{"id": "1", "name": 3, "role": "user", "content": "x"}], "messages[0].name"),
        ([{"id": "1", "name": "x", "role": "user", "content": "x", "metadata": []}], "messages[0].metadata"),
        ([{"id": "1", "name": "x", "role": "assistant", "content": [
            {"type": "tool_use", "id": "c", "name": "f", "input": {}, "raw_input": 7}]}], "messages[0].content[0].raw_input"),
        ([{"id": "1", "name": "x", "role": "user", "content": [{"type": "image", "source": 3}]}],
         "messages[0].content[0].source"),
        ([7], "messages[0]"),
    ],
)
def test_it_names_the_field_of_malformed_messages(data: list[Any], field: str) -> None:
    with pytest.raises(InvalidMessages) as info:
        from_agentscope(data)
    assert info.value.field == field
