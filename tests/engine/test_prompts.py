from __future__ import annotations

import json

import pytest

from contextlab.engine.compactors.base import SummaryRequest
from contextlab.engine.core.messages import (
    MediaBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextlab.engine.stages.summary.prompts import (
    INITIAL_PROMPTS,
    SECTION_HEADINGS,
    SUBSECTION_HEADINGS,
    SYSTEM_PROMPTS,
    UPDATE_PROMPTS,
    build_summary_messages,
    format_history,
    format_message,
    resolve_language,
    wrap_summary,
)

TS = "2026-03-19T10:00:00.000Z"


def _ask(text: str, **kw) -> Message:
    return Message.text("user", text, timestamp=kw.pop("timestamp", TS), **kw)


def test_it_exposes_exactly_the_six_headings_per_language():
    assert SECTION_HEADINGS["en"] == (
        "## Goal",
        "## Constraints & Preferences",
        "## Progress",
        "## Key Decisions",
        "## Next Steps",
        "## Critical Context",
    )
    assert SECTION_HEADINGS["zh"] == (
        "## 目标",
        "## 约束和偏好",
        "## 进展",
        "## 关键决策",
        "## 下一步",
        "## 关键上下文",
    )
    assert SUBSECTION_HEADINGS["en"] == ("### Done", "### In Progress", "### Blocked")
    assert SUBSECTION_HEADINGS["zh"] == ("### 已完成", "### 进行中", "### 阻塞")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_it_puts_every_heading_in_both_templates(lang):
    for prompt in (INITIAL_PROMPTS[lang], UPDATE_PROMPTS[lang]):
        lines = prompt.split("\n")
        for heading in SECTION_HEADINGS[lang] + SUBSECTION_HEADINGS[lang]:
            assert heading in lines


def test_it_states_the_rules_in_english():
    system = SYSTEM_PROMPTS["en"]
    assert "file paths" in system and "URLs" in system and "shell commands" in system
    assert "error messages" in system and "character for character" in system
    assert "Never invent" in system and "never make up something the user said" in system
    update = UPDATE_PROMPTS["en"]
    assert "ONE merged summary" in update
    assert "do not append a second summary" in update
    assert "keep every item in it that is still true" in update
    assert "from In Progress (or Blocked) to Done" in update
    assert "Rewrite Next Steps" in update
    assert "only when the conversation shows it is obsolete" in update


def test_it_states_the_rules_in_chinese():
    system = SYSTEM_PROMPTS["zh"]
    assert "文件路径" in system and "URL" in system and "错误信息" in system and "逐字" in system
    assert "绝不编造" in system and "杜撰用户" in system
    update = UPDATE_PROMPTS["zh"]
    assert "一份合并后" in update and "不要在旧摘要后面再追加" in update
    assert '移到"已完成"' in update and '重写"下一步"' in update


def test_it_builds_an_initial_request():
    request = SummaryRequest([_ask("Please fix src/app/models.py")], None, "en")
    messages = build_summary_messages(request)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM_PROMPTS["en"]
    user = messages[1]["content"]
    assert user.startswith("<conversation>\n[2026-03-19T10:00:00.000Z] user:\n  Please fix src/app/models.py")
    assert "<previous_summary>" not in user
    assert user.endswith(INITIAL_PROMPTS["en"])


def test_it_builds_an_incremental_request_with_the_instruction_last():
    request = SummaryRequest(
        [_ask("now add a docstring")],
        "## Goal\n- fix `src/app/models.py`",
        "en",
        extra_instruction="Focus on the database layer.",
    )
    user = build_summary_messages(request)[1]["content"]
    conversation = user.index("now add a docstring")
    previous = user.index("<previous_summary>\n## Goal\n- fix `src/app/models.py`\n</previous_summary>")
    task = user.index(UPDATE_PROMPTS["en"])
    instruction = user.index("<extra_instruction>\nFocus on the database layer.\n</extra_instruction>")
    assert conversation < previous < task < instruction
    assert INITIAL_PROMPTS["en"] not in user


def test_it_writes_the_request_in_chinese_for_a_chinese_session():
    request = SummaryRequest([_ask("请修复 src/app/models.py 里的计数错误，不要修改测试。")], None, "auto")
    system, user = build_summary_messages(request)
    assert system["content"] == SYSTEM_PROMPTS["zh"]
    for heading in SECTION_HEADINGS["zh"]:
        assert heading in user["content"]
    assert "## Goal" not in user["content"]


def test_it_does_not_reuse_copaw_markers():
    request = SummaryRequest([_ask("hi there")], "## Goal\n- x", "en", extra_instruction="y")
    user = build_summary_messages(request)[1]["content"]
    assert (
        "# conversation" not in user
        and "# previous-summary" not in user
        and "# extra-instruction" not in user
    )
    wrapped = wrap_summary("## Goal\n- x", archive_hint="dialog/2026-03-19.jsonl", language="en")
    assert "Summary of previous conversation" not in wrapped


def test_it_formats_a_message_with_header_and_blocks():
    msg = Message(
        role="assistant",
        name="coder",
        timestamp=TS,
        content=(
            TextBlock("First line.\nSecond line."),
            ThinkingBlock("secret plan"),
            ToolUseBlock("c1", "run_shell", {"command": "pytest -q", "cwd": "/srv/app"}),
        ),
    )
    text = format_message(msg)
    assert text.split("\n") == [
        "[2026-03-19T10:00:00.000Z] assistant(coder):",
        "  First line.",
        "  Second line.",
        '  tool_use run_shell({"command": "pytest -q", "cwd": "/srv/app"})',
    ]
    assert "secret plan" in format_message(msg, include_thinking=True)


def test_it_shows_invalid_json_arguments_as_they_came():
    msg = Message(
        role="assistant",
        timestamp=TS,
        content=(ToolUseBlock("c1", "edit", {}, raw_input='{"path": "a.py",'),),
    )
    assert 'tool_use edit({"path": "a.py",)' in format_message(msg)


def test_it_formats_tool_results_with_errors_and_media():
    msg = Message(
        role="tool",
        timestamp=TS,
        content=(
            ToolResultBlock("c1", "run_shell", "line one\nAssertionError: expected 3 got 2", is_error=True),
            ToolResultBlock(
                "c2", "screenshot", (TextBlock("page"), MediaBlock("image", url="https://x.test/a.png"))
            ),
        ),
    )
    text = format_message(msg)
    assert "  tool_result run_shell [error]:\n    line one\n    AssertionError: expected 3 got 2" in text
    assert "[image: https://x.test/a.png]" in text


def test_it_keeps_only_the_excerpt_of_a_truncated_result_and_says_where_the_rest_is():
    output = (
        "first 100 lines of the log\n<<<TRUNCATED>>>\nThe output has 9000 lines; shown from line 1, 3000 bytes.\n"
        "call `read_file` with file_path=/ws/tool_result/abc.txt start_line=101 to read more"
    )
    block = ToolResultBlock("c1", "run_shell", output)
    with_meta = Message(
        role="tool",
        timestamp=TS,
        content=(block,),
        metadata={"offload": {"c1": {"file_path": "tool_result/abc.txt"}}},
    )
    text = format_message(with_meta)
    assert "first 100 lines of the log" in text
    assert "TRUNCATED" not in text and "read_file" not in text
    assert "the full output is saved at tool_result/abc.txt" in text
    # Without the metadata, the path is read from the notice itself.
    bare = Message(role="tool", timestamp=TS, content=(block,))
    assert "the full output is saved at /ws/tool_result/abc.txt" in format_message(bare)


def test_it_cuts_long_blocks_keeping_head_and_tail():
    long_text = "HEAD " + "x" * 10_000 + " TAIL"
    text = format_message(_ask(long_text), max_chars_per_block=4000)
    assert "HEAD" in text and "TAIL" in text
    assert "characters not shown" in text
    assert len(text) < 4300
    # The default cap is larger than CoPaw's 1,000 characters and keeps newlines.
    medium = "\n".join(f"line {n}" for n in range(300))
    assert format_message(_ask(medium)).count("\n") == 300


def test_it_joins_all_messages_when_uncapped():
    msgs = [_ask("one"), Message.text("assistant", "two", timestamp=TS)]
    assert (
        format_history(msgs)
        == "[2026-03-19T10:00:00.000Z] user:\n  one\n\n[2026-03-19T10:00:00.000Z] assistant:\n  two"
    )
    assert format_history([]) == "(no messages)"


def test_it_keeps_the_oldest_ask_and_the_newest_messages_under_a_cap():
    msgs = [Message.text("system", "be nice", timestamp=TS), _ask("GOAL: migrate the billing service")]
    msgs += [Message.text("assistant", f"step {n} " + "y" * 200, timestamp=TS) for n in range(30)]
    text = format_history(msgs, cap_tokens=2000, counter=len)
    assert "GOAL: migrate the billing service" in text
    assert "step 29" in text
    assert "step 0 " not in text
    shown = sum(1 for n in range(30) if f"step {n} " in text)
    elided = 32 - 1 - shown
    assert f"{elided} of 32 messages are left out" in text
    assert "[… 1 message left out here …]" in text  # the system message before the ask
    assert f"[… {elided - 1} messages left out here …]" in text
    assert text.index("GOAL") < text.index("step 29")


def test_it_always_keeps_the_newest_message_even_over_the_cap():
    msgs = [_ask("goal"), Message.text("assistant", "z" * 5000, timestamp=TS)]
    text = format_history(msgs, cap_tokens=10, counter=len)
    assert "goal" in text and "zzz" in text
    assert "left out" not in text


def test_it_passes_the_cap_through_the_request():
    msgs = [_ask("GOAL first")] + [
        Message.text("assistant", f"m{n} " + "q" * 400, timestamp=TS) for n in range(50)
    ]
    request = SummaryRequest(msgs, None, "en", cap_tokens=600)
    user = build_summary_messages(request)[1]["content"]
    assert "GOAL first" in user and "m49" in user and "m0 " not in user
    assert "messages are left out" in user


@pytest.mark.parametrize(
    ("language", "texts", "expected"),
    [
        ("en", ["请修复这个错误"], "en"),
        ("zh", ["fix it"], "zh"),
        ("zh-CN", ["fix it"], "zh"),
        ("auto", ["Please fix the failing test in src/app/models.py"], "en"),
        ("auto", ["请修复 src/app/models.py 里的 bug，并且不要修改测试"], "zh"),
        ("auto", [], "en"),
    ],
)
def test_it_resolves_the_language(language, texts, expected):
    assert resolve_language(language, [_ask(t) for t in texts]) == expected


def test_it_ignores_tool_output_when_detecting_the_language():
    msgs = [
        _ask("请运行测试"),
        Message(role="tool", timestamp=TS, content=(ToolResultBlock("c", "sh", "error " * 200),)),
    ]
    assert resolve_language("auto", msgs) == "zh"


def test_it_rejects_an_unknown_language():
    with pytest.raises(ValueError, match="expected 'en', 'zh' or 'auto'"):
        resolve_language("fr", [])


def test_it_wraps_the_summary_with_a_pointer_to_the_archive():
    summary = "## Goal\n- fix `src/app/models.py`"
    en = wrap_summary(summary, archive_hint="dialog/2026-03-19.jsonl", language="en")
    assert "dialog/2026-03-19.jsonl" in en and summary in en
    assert en.index("dialog/2026-03-19.jsonl") < en.index(summary) < en.index("not a new request")
    zh = wrap_summary(summary, archive_hint="dialog/2026-03-19.jsonl", language="zh")
    assert "原始消息原样归档在 dialog/2026-03-19.jsonl" in zh
    auto = wrap_summary("## 目标\n- 修复计数错误", archive_hint="dialog/x.jsonl", language="auto")
    assert auto.startswith("# 早前对话的摘要")


def test_it_produces_json_serialisable_openai_messages():
    request = SummaryRequest([_ask("x")], None, "en")
    assert json.loads(json.dumps(build_summary_messages(request)))[0]["role"] == "system"
