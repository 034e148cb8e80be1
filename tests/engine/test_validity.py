from __future__ import annotations

import pytest

from contextlab.engine.stages.summary.prompts import SECTION_HEADINGS
from contextlab.engine.stages.summary.validity import check_summary, normalize_summary, split_sections

EN = """\
## Goal
- Fix the failing test in `src/app/models.py`.

## Constraints & Preferences
- Don't change the tests.

## Progress
### Done
- edit_file: `src/app/models.py`
### In Progress
- (none)
### Blocked
- (none)

## Key Decisions
- Use `len(cart.items)`.

## Next Steps
1. Run `pytest -q`.

## Critical Context
- error: `AssertionError: expected 3 got 2`
"""

ZH = """\
## 目标
- 修复 `src/app/models.py` 中的计数错误

## 约束和偏好
- 不要修改测试

## 进展
### 已完成
- 修改了 `src/app/models.py`
### 进行中
- （无）
### 阻塞
- （无）

## 关键决策
- 使用 `len(cart.items)`

## 下一步
1. 运行 `pytest -q`

## 关键上下文
- `AssertionError: expected 3 got 2`
"""


def test_it_accepts_a_complete_english_summary():
    result = check_summary(EN, language="en")
    assert result.valid
    assert result.reasons == [] and result.missing_sections == []


def test_it_accepts_a_complete_chinese_summary():
    assert check_summary(ZH, language="zh").valid


def test_it_names_a_missing_section():
    text = EN.replace("## Key Decisions\n- Use `len(cart.items)`.\n\n", "")
    result = check_summary(text, language="en")
    assert not result.valid
    assert result.missing_sections == ["## Key Decisions"]
    assert result.reasons == ["missing section '## Key Decisions'"]


def test_it_names_every_missing_section_in_order():
    result = check_summary("## Goal\n- x\n\n## Next Steps\n1. y", language="en")
    assert result.missing_sections == [
        "## Constraints & Preferences",
        "## Progress",
        "## Key Decisions",
        "## Critical Context",
    ]
    assert len(result.reasons) == 4


@pytest.mark.parametrize("text", ["", "   \n\t ", None])
def test_it_rejects_an_empty_reply(text):
    result = check_summary(text, language="en")
    assert not result.valid
    assert result.reasons == ["the reply is empty"]


def test_it_rejects_a_reply_without_headings():
    result = check_summary("I summarised the conversation: the user wants a fix.", language="en")
    assert not result.valid
    assert result.reasons == ["the reply has no Markdown headings"]
    assert result.missing_sections == list(SECTION_HEADINGS["en"])


@pytest.mark.parametrize(
    "text",
    [
        "x##y",  # CoPaw accepts this: it only looks for the substring "##"
        "# only a title",
        "Sorry, I can't do that ## Goal",
        "  text ## Goal ## Progress",
    ],
)
def test_it_rejects_what_copaw_would_accept(text):
    assert not check_summary(text, language="en").valid


def test_it_requires_level_two_headings():
    text = EN.replace("## Goal", "### Goal")
    result = check_summary(text, language="en")
    assert result.missing_sections == ["## Goal"]


def test_it_ignores_headings_inside_code_blocks():
    text = EN.replace("## Critical Context\n", "```\n## Critical Context\n```\n")
    result = check_summary(text, language="en")
    assert result.missing_sections == ["## Critical Context"]


def test_it_accepts_a_summary_wrapped_in_a_fence_or_after_a_think_block():
    assert check_summary(f"```markdown\n{EN}```", language="en").valid
    assert check_summary(f"<think>plan the summary</think>\n{EN}", language="en").valid
    assert normalize_summary(f"```md\n{EN}\n```") == EN.strip()


def test_it_tolerates_cosmetic_variants_of_a_heading():
    text = (
        EN.replace("## Goal", "## Goal:")
        .replace("## Constraints & Preferences", "## Constraints and Preferences")
        .replace("## Progress", "##  **Progress**")
        .replace("## Key Decisions", "   ## 4. Key Decisions ##")
    )
    assert check_summary(text, language="en").valid


def test_it_checks_the_headings_of_the_requested_language():
    result = check_summary(ZH, language="en")
    assert not result.valid
    assert "## Goal" in result.missing_sections
    assert not check_summary(EN, language="zh").valid
    assert check_summary(EN, language="zh").missing_sections[0] == "## 目标"


def test_it_accepts_either_language_when_auto():
    assert check_summary(EN, language="auto").valid
    assert check_summary(ZH, language="auto").valid
    # A mixed reply is still complete: each section is there in one language or the other.
    mixed = ZH.replace("## 关键决策", "## Key Decisions")
    assert check_summary(mixed, language="auto").valid


def test_it_reports_missing_sections_in_the_language_the_reply_uses_when_auto():
    partial = "## 目标\n- x\n\n## 进展\n- y"
    result = check_summary(partial, language="auto")
    assert result.missing_sections == ["## 约束和偏好", "## 关键决策", "## 下一步", "## 关键上下文"]


def test_it_splits_sections():
    sections = split_sections(EN)
    assert list(sections) == list(SECTION_HEADINGS["en"])
    assert sections["## Goal"] == "- Fix the failing test in `src/app/models.py`."
    assert sections["## Progress"].startswith("### Done\n- edit_file: `src/app/models.py`")
    sub = split_sections(sections["## Progress"], level=3)
    assert list(sub) == ["### Done", "### In Progress", "### Blocked"]
    assert sub["### Blocked"] == "- (none)"


def test_it_canonicalises_headings_and_keeps_the_rest():
    text = "Intro line\n\n## goal:\n- a\n\n## Notes\n- n\n\n## Goal\n- b\n\n## 目标\n- c"
    sections = split_sections(text)
    assert sections[""] == "Intro line"
    assert sections["## Goal"] == "- a\n- b"
    assert sections["## Notes"] == "- n"
    assert sections["## 目标"] == "- c"


def test_it_splits_a_chinese_summary():
    sections = split_sections(ZH)
    assert list(sections) == list(SECTION_HEADINGS["zh"])
    assert list(split_sections(sections["## 进展"], level=3)) == ["### 已完成", "### 进行中", "### 阻塞"]


def test_it_does_not_split_on_headings_inside_code():
    text = "## Goal\n```\n## not a heading\n```\n- a"
    assert split_sections(text) == {"## Goal": "```\n## not a heading\n```\n- a"}
