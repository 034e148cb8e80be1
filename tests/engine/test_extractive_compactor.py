from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contextlab.engine.compactors import build_compactor
from contextlab.engine.compactors.base import Compactor, SummaryRequest
from contextlab.engine.compactors.extractive import CAPS, ExtractiveCompactor
from contextlab.engine.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock
from contextlab.engine.stages.summary.prompts import SECTION_HEADINGS, SUBSECTION_HEADINGS
from contextlab.engine.stages.summary.validity import check_summary, split_sections

PYTEST_FAILURE = """\
F..                                                                      [100%]
=================================== FAILURES ===================================
__________________________________ test_count __________________________________

    def test_count():
>       assert count_items(cart) == 3
E       AssertionError: expected 3 got 2

tests/test_models.py:12: AssertionError
=========================== short test summary info ============================
FAILED tests/test_models.py::test_count - AssertionError: expected 3 got 2
1 failed, 2 passed in 0.12s"""


def _ts(n: int) -> str:
    return f"2026-03-19T10:{n:02d}:00.000Z"


def _call(n: int, call_id: str, tool: str, args: dict, text: str | None = None) -> Message:
    blocks = ((TextBlock(text),) if text else ()) + (ToolUseBlock(call_id, tool, args),)
    return Message(role="assistant", content=blocks, timestamp=_ts(n))


def _result(n: int, call_id: str, tool: str, output: str, *, is_error: bool = False) -> Message:
    return Message(
        role="tool", content=(ToolResultBlock(call_id, tool, output, is_error=is_error),), timestamp=_ts(n)
    )


GOAL = "The item count test fails. Please fix `count_items` in src/app/models.py."


def coding_session() -> list[Message]:
    """User asks for a fix; the test fails; the model reads, edits, and the test passes."""
    return [
        Message.text(
            "user",
            f"{GOAL} Don't change the tests, and always run the suite with `pytest -q` before you finish.",
            timestamp=_ts(0),
        ),
        _call(
            1, "c1", "run_shell", {"command": "pytest -q tests/test_models.py"}, "Let me run the tests first."
        ),
        _result(2, "c1", "run_shell", PYTEST_FAILURE),
        _call(3, "c2", "read_file", {"file_path": "src/app/models.py"}),
        _result(4, "c2", "read_file", "def count_items(cart):\n    return len(cart.items) - 1\n"),
        _call(
            5,
            "c3",
            "edit_file",
            {"file_path": "src/app/models.py", "old": "len(cart.items) - 1", "new": "len(cart.items)"},
            "The root cause is an off-by-one in count_items. I'll use len(cart.items) instead of subtracting 1.",
        ),
        _result(6, "c3", "edit_file", "ok"),
        _call(7, "c4", "run_shell", {"command": "pytest -q tests/test_models.py"}),
        _result(8, "c4", "run_shell", "...\n3 passed in 0.10s"),
        Message.text(
            "assistant",
            "Fixed: all 3 tests pass. Next I will run the full suite with pytest -q.",
            timestamp=_ts(9),
        ),
    ]


def follow_up_session() -> list[Message]:
    return [
        Message.text(
            "user",
            "Now add a docstring to count_items; the page must load in under 200 ms.",
            timestamp=_ts(10),
        ),
        _call(11, "c5", "run_shell", {"command": "pytest -q"}),
        _result(12, "c5", "run_shell", "ModuleNotFoundError: No module named 'app.views'", is_error=True),
        _call(13, "c6", "read_file", {"file_path": "src/app/views.py"}),
    ]


def _summarize(messages, previous=None, language="auto"):
    return ExtractiveCompactor().summarize(SummaryRequest(messages, previous, language))


def _bullets(body: str) -> list[str]:
    return [line for line in body.split("\n") if line.startswith(("- ", "1. ", "2. ", "3. ", "4. ", "5. "))]


def test_it_is_a_compactor_with_a_clear_label():
    compactor = build_compactor("extractive")
    assert isinstance(compactor, Compactor)
    assert compactor.name == "extractive"
    assert compactor.label == "Extractive (offline, no LLM)"


def test_it_summarises_a_coding_session_validly():
    result = _summarize(coding_session())
    text = result.text
    assert check_summary(text, language="en").valid
    assert result.compactor == "extractive" and result.model is None and result.usage is None
    assert result.attempts == 1
    sections = split_sections(text)
    assert list(sections) == list(SECTION_HEADINGS["en"])
    assert GOAL in sections["## Goal"]
    assert "src/app/models.py" in text
    assert "AssertionError: expected 3 got 2" in sections["## Critical Context"]


def test_it_takes_constraints_from_the_users_imperative_sentences():
    sections = split_sections(_summarize(coding_session()).text)
    assert sections["## Constraints & Preferences"] == (
        "- Don't change the tests, and always run the suite with `pytest -q` before you finish."
    )


def test_it_reports_progress_from_tool_calls():
    sections = split_sections(_summarize(coding_session()).text)
    progress = split_sections(sections["## Progress"], level=3)
    assert progress["### Done"].split("\n") == [
        "- read_file: `src/app/models.py`",
        "- edit_file: `src/app/models.py`",
        "- run_shell: `pytest -q tests/test_models.py`",
    ]
    # The failure was fixed by the later run of the same command: not blocked.
    assert progress["### Blocked"] == "- (none)"
    assert progress["### In Progress"] == "- (none)"


def test_it_takes_decisions_and_next_steps_from_the_assistant():
    sections = split_sections(_summarize(coding_session()).text)
    assert "I'll use len(cart.items) instead of subtracting 1." in sections["## Key Decisions"]
    assert sections["## Next Steps"] == "1. Next I will run the full suite with pytest -q."


def test_it_lists_identifiers_as_critical_context():
    context = split_sections(_summarize(coding_session()).text)["## Critical Context"].split("\n")
    assert "- file: `src/app/models.py`" in context
    assert "- command: `pytest -q tests/test_models.py`" in context
    assert "- name: `count_items`" in context
    assert "- error: `AssertionError: expected 3 got 2`" in context
    assert len(context) == len(set(context))


def test_it_reports_failures_and_pending_calls():
    text = _summarize(coding_session()[:3] + follow_up_session()).text
    progress = split_sections(split_sections(text)["## Progress"], level=3)
    assert (
        "- run_shell `pytest -q` failed: ModuleNotFoundError: No module named 'app.views'"
        in progress["### Blocked"]
    )
    assert (
        "run_shell `pytest -q tests/test_models.py` failed: AssertionError: expected 3 got 2"
        in progress["### Blocked"]
    )
    assert "- read_file `src/app/views.py` (waiting for its result)" in progress["### In Progress"]
    steps = split_sections(text)["## Next Steps"]
    assert "Get the result of read_file `src/app/views.py`" in steps


def test_it_merges_incrementally_without_losing_or_repeating_facts():
    first = _summarize(coding_session()).text
    second = _summarize(follow_up_session(), previous=first).text
    assert check_summary(second, language="en").valid
    sections = split_sections(second)
    # Earlier facts survive.
    assert sections["## Goal"].startswith(f"- {GOAL}")
    assert "Later request: Now add a docstring to count_items" in sections["## Goal"]
    assert "AssertionError: expected 3 got 2" in sections["## Critical Context"]
    assert "- edit_file: `src/app/models.py`" in sections["## Progress"]
    assert "I'll use len(cart.items)" in sections["## Key Decisions"]
    # New facts arrive.
    assert "ModuleNotFoundError: No module named 'app.views'" in sections["## Progress"]
    assert "- number: `200 ms`" in sections["## Critical Context"]
    assert "the page must load in under 200 ms." in sections["## Constraints & Preferences"]
    # One document: each heading once, no bullet twice in a section.
    for heading in SECTION_HEADINGS["en"] + SUBSECTION_HEADINGS["en"]:
        assert second.split("\n").count(heading) == 1
    for body in list(sections.values()) + list(split_sections(sections["## Progress"], level=3).values()):
        bullets = _bullets(body)
        assert len(bullets) == len(set(bullets))


def test_it_does_not_change_a_summary_when_the_same_messages_are_merged_again():
    first = _summarize(coding_session()).text
    again = _summarize(coding_session(), previous=first).text
    assert again == first


def test_it_moves_blocked_work_to_done_when_a_later_call_succeeds():
    first = _summarize(coding_session()[:3]).text
    assert "failed: AssertionError: expected 3 got 2" in split_sections(first)["## Progress"]
    second = _summarize(coding_session()[3:], previous=first).text
    progress = split_sections(split_sections(second)["## Progress"], level=3)
    assert progress["### Blocked"] == "- (none)"
    assert "- run_shell: `pytest -q tests/test_models.py`" in progress["### Done"]
    assert "AssertionError: expected 3 got 2" in split_sections(second)["## Critical Context"]


def test_it_keeps_an_llm_written_previous_summary():
    previous = (
        "## Goal\n- Migrate billing to Postgres 16.\n\n## Constraints & Preferences\n- (none)\n\n"
        "## Progress\n### Done\n- [x] Dumped the schema with `pg_dump --schema-only`\n"
        "### In Progress\n- [ ] Port `billing/models.py` to the new schema\n### Blocked\n- (none)\n\n"
        "## Key Decisions\n- **Use logical replication**: zero downtime.\n\n## Next Steps\n1. Port the models.\n\n"
        "## Critical Context\n- DB URL: `postgres://db.internal:5432/billing`\n\n## Open Questions\n- Who owns the cron?"
    )
    messages = [
        _call(20, "d1", "edit_file", {"file_path": "billing/models.py"}),
        _result(21, "d1", "edit_file", "ok"),
    ]
    text = _summarize(messages, previous=previous).text
    assert check_summary(text, language="en").valid
    sections = split_sections(text)
    assert sections["## Goal"] == "- Migrate billing to Postgres 16."
    assert "Dumped the schema with `pg_dump --schema-only`" in sections["## Progress"]
    progress = split_sections(sections["## Progress"], level=3)
    # The in-progress item naming the edited file is now done.
    assert "Port `billing/models.py` to the new schema" in progress["### Done"]
    assert progress["### In Progress"] == "- (none)"
    assert "**Use logical replication**: zero downtime." in sections["## Key Decisions"]
    assert "postgres://db.internal:5432/billing" in sections["## Critical Context"]
    # A section we do not write is still kept, as context.
    assert "Who owns the cron?" in sections["## Critical Context"]
    assert sections["## Next Steps"] == "1. Port the models."


def test_it_stays_bounded_over_many_merges():
    summary = None
    for n in range(40):
        messages = [
            Message.text(
                "user", f"Request {n}: you must keep file_{n}.py under 100 lines.", timestamp=_ts(n % 60)
            ),
            _call(
                n % 60,
                f"k{n}",
                "write_file",
                {"file_path": f"pkg/file_{n}.py"},
                f"I decided to use approach {n}.",
            ),
            _result(n % 60, f"k{n}", "write_file", "ok"),
            _call(n % 60, f"f{n}", "run_shell", {"command": f"make test-{n}"}),
            _result(n % 60, f"f{n}", "run_shell", f"Error: target {n} failed", is_error=True),
        ]
        summary = _summarize(messages, previous=summary).text
        assert check_summary(summary, language="en").valid
    sections = split_sections(summary)
    progress = split_sections(sections["## Progress"], level=3)
    assert len(_bullets(sections["## Goal"])) <= CAPS["goal"]
    assert sections["## Goal"].startswith("- Request 0:")  # the original ask stays on top
    assert len(_bullets(sections["## Constraints & Preferences"])) <= CAPS["constraints"]
    assert len(_bullets(sections["## Key Decisions"])) <= CAPS["decisions"]
    assert len(_bullets(progress["### Blocked"])) <= CAPS["blocked"]
    assert "make test-39" in progress["### Blocked"]  # the most recent are kept
    assert len(summary) < 8000


def test_it_writes_chinese_headings_for_a_chinese_session():
    messages = [
        Message.text(
            "user",
            "请把 config/settings.yaml 里的超时改成 30 秒。不要重启生产服务，必须先在 staging 上验证。",
            timestamp=_ts(0),
        ),
        _call(1, "z1", "read_file", {"path": "config/settings.yaml"}, "我先读取配置文件。"),
        _result(2, "z1", "read_file", "timeout: 10\nretries: 3"),
        _call(
            3,
            "z2",
            "edit_file",
            {"path": "config/settings.yaml"},
            "决定直接修改 timeout 字段，而不是新增覆盖文件。",
        ),
        _result(4, "z2", "edit_file", "Permission denied: config/settings.yaml", is_error=True),
        Message.text("assistant", "写入失败。接下来我会请你确认文件权限。", timestamp=_ts(5)),
    ]
    text = _summarize(messages).text
    assert check_summary(text, language="zh").valid
    sections = split_sections(text)
    assert list(sections) == list(SECTION_HEADINGS["zh"])
    assert "## Goal" not in text
    assert "请把 config/settings.yaml 里的超时改成 30 秒" in sections["## 目标"]
    assert "不要重启生产服务，必须先在 staging 上验证。" in sections["## 约束和偏好"]
    assert "决定直接修改 timeout 字段" in sections["## 关键决策"]
    progress = split_sections(sections["## 进展"], level=3)
    assert "edit_file `config/settings.yaml` 失败：Permission denied" in progress["### 阻塞"]
    assert "- 文件：`config/settings.yaml`" in sections["## 关键上下文"]
    assert "- 数值：`30 秒`" in sections["## 关键上下文"]


def test_it_follows_an_explicit_language():
    text = _summarize(coding_session(), language="zh").text
    assert check_summary(text, language="zh").valid
    assert text.startswith("## 目标\n")


def test_it_is_deterministic():
    texts = {_summarize(coding_session()).text for _ in range(5)}
    assert len(texts) == 1
    first = _summarize(coding_session()).text
    assert len({_summarize(follow_up_session(), previous=first).text for _ in range(5)}) == 1


def test_it_writes_a_valid_summary_of_nothing():
    text = _summarize([]).text
    assert check_summary(text, language="en").valid
    assert "- (none)" in text


_block = st.one_of(
    st.builds(TextBlock, st.text(max_size=200)),
    st.builds(
        ToolUseBlock,
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["run_shell", "read_file", "x"]),
        st.dictionaries(st.sampled_from(["path", "command", "q"]), st.text(max_size=40), max_size=2),
    ),
    st.builds(
        ToolResultBlock,
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["run_shell", "read_file"]),
        st.text(max_size=200),
        st.booleans(),
    ),
)
_message = st.builds(
    Message,
    role=st.sampled_from(["user", "assistant", "tool", "system"]),
    content=st.lists(_block, max_size=3).map(tuple),
    timestamp=st.just("2026-03-19T10:00:00.000Z"),
)


@settings(max_examples=60, deadline=None)
@given(
    messages=st.lists(_message, max_size=8),
    previous=st.one_of(st.none(), st.text(max_size=300)),
    language=st.sampled_from(["en", "zh", "auto"]),
)
def test_it_always_passes_the_validity_check(messages, previous, language):
    text = _summarize(messages, previous=previous, language=language).text
    assert check_summary(text, language=language).valid
    assert text == _summarize(messages, previous=previous, language=language).text


def test_it_never_reports_an_importers_placeholder_result_as_a_failure():
    from contextlab.engine.importers._common import repair

    handoff = _call(1, "h1", "handoff_to_planner", {"task_title": "market study"})
    messages = repair([Message.text("user", "Study the market.", timestamp=_ts(0)), handoff,
                       Message.text("assistant", "The plan is ready.", timestamp=_ts(2))], [])
    assert messages[2].is_repair  # the placeholder the repair pass added

    text = _summarize(messages).text
    progress = split_sections(split_sections(text)["## Progress"], level=3)

    assert "no result was recorded" not in text
    assert "failed" not in text and "Fix:" not in text and "Get the result" not in text
    assert progress["### Blocked"].strip() == "- (none)"
    assert "- handoff_to_planner `market study` (no result recorded)" in progress["### Done"]


def test_it_tells_an_llm_compactor_that_a_placeholder_is_no_failure():
    from contextlab.engine.importers._common import repair
    from contextlab.engine.stages.summary.prompts import format_message

    messages = repair([Message.text("user", "Go.", timestamp=_ts(0)), _call(1, "h1", "handoff", {})], [])

    shown = format_message(messages[-1])

    assert "[error]" not in shown and "no result was recorded" not in shown
    assert "not a failure" in shown
