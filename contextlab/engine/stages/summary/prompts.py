"""Prompts for the summary LLM, the transcript it reads, and the summary wrapper.

Everything a compactor sends to a model is built here, so the OpenAI compactor,
the manual ``/compact`` preview and the dashboard's "exact request" view all
show the same text.

The wording is ours. What is deliberately different from CoPaw/ReMe:

* the transcript keeps newlines and allows 4,000 characters per block (ReMe
  flattens every block to one line of at most 1,000 characters, so stack
  traces and diffs arrive mangled);
* a tool result cut by stage-1/2 truncation still tells the summariser where
  the full output lives (ReMe drops the notice, path included);
* when the transcript must be shortened, the oldest user request is always
  kept and the gap is stated, instead of silently losing the head;
* the update prompt insists on one merged document, never two summaries.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from contextlab.engine.core.messages import (
    MediaBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

if TYPE_CHECKING:
    from contextlab.engine.compactors.base import SummaryRequest

TextCounter = Callable[[str], int]
"""Counts the tokens of a string (the engine passes its exact tiktoken counter)."""

LANGUAGES: tuple[str, ...] = ("en", "zh")

TRUNCATION_MARKER = "<<<TRUNCATED>>>"

# -- section headings ---------------------------------------------------------------

SECTION_IDS: tuple[str, ...] = (
    "goal",
    "constraints",
    "progress",
    "decisions",
    "next_steps",
    "critical_context",
)
SUBSECTION_IDS: tuple[str, ...] = ("done", "in_progress", "blocked")

SECTION_HEADINGS: dict[str, tuple[str, ...]] = {
    "en": (
        "## Goal",
        "## Constraints & Preferences",
        "## Progress",
        "## Key Decisions",
        "## Next Steps",
        "## Critical Context",
    ),
    "zh": (
        "## 目标",
        "## 约束和偏好",
        "## 进展",
        "## 关键决策",
        "## 下一步",
        "## 关键上下文",
    ),
}
"""The six required ``## `` headings per language, in document order."""

SUBSECTION_HEADINGS: dict[str, tuple[str, ...]] = {
    "en": ("### Done", "### In Progress", "### Blocked"),
    "zh": ("### 已完成", "### 进行中", "### 阻塞"),
}
"""The ``### `` headings inside Progress (written by us, not required by the validity check)."""


def _heading_key(title: str) -> str:
    """Normalise a heading title for comparison.

    Models vary the cosmetics ("## Goal:", "## 1. Goal", "## **Goal**",
    "Constraints and Preferences"); none of that changes which section it is,
    so the validity check and the section splitter should not care.
    """
    key = unicodedata.normalize("NFKC", title).strip()
    key = re.sub(r"^\d+\s*[.)、]\s*", "", key)
    key = key.strip("*_` \t").rstrip(":：").strip("*_` \t")
    key = re.sub(r"\s+", " ", key).casefold()
    return key.replace(" and ", " & ").replace("与", "和")


_HEADING_IDS: dict[str, str] = {}
for _lang in LANGUAGES:
    for _sid, _heading in zip(SECTION_IDS, SECTION_HEADINGS[_lang], strict=True):
        _HEADING_IDS[_heading_key(_heading[3:])] = _sid
    for _sid, _heading in zip(SUBSECTION_IDS, SUBSECTION_HEADINGS[_lang], strict=True):
        _HEADING_IDS[_heading_key(_heading[4:])] = _sid
_HEADING_LANG: dict[str, str] = {
    _heading_key(h.lstrip("#").strip()): lang
    for lang in LANGUAGES
    for h in SECTION_HEADINGS[lang] + SUBSECTION_HEADINGS[lang]
}


def heading_id(title: str) -> str | None:
    """The section id ("goal", "done", ...) a heading title stands for, in either language."""
    return _HEADING_IDS.get(_heading_key(title))


def heading_language(title: str) -> str | None:
    """The language ("en" or "zh") of one of our headings, else None."""
    return _HEADING_LANG.get(_heading_key(title))


def canonical_heading(section_id: str, language: str) -> str:
    """The heading line ("## Goal", "### 已完成") of a section id in a language."""
    lang = language if language in LANGUAGES else "en"
    if section_id in SECTION_IDS:
        return SECTION_HEADINGS[lang][SECTION_IDS.index(section_id)]
    return SUBSECTION_HEADINGS[lang][SUBSECTION_IDS.index(section_id)]


# -- prompt text --------------------------------------------------------------------------

SYSTEM_PROMPTS: dict[str, str] = {
    "en": """\
You keep the working memory of a software agent whose conversation no longer fits in its context window. \
The older messages are being taken out of the context, and the summary you write is all the agent will have \
left of them. The agent will pick the work up again from your summary alone, so write it for that reader: \
precise, factual and short.

Rules:
- Use exactly the section headings of the template, in the same order, each as a Markdown heading at the \
start of its own line. Write every section; when a section has nothing to say, write "- (none)".
- Copy exact details character for character: file paths, function, class and variable names, numbers with \
their units, URLs, shell commands, versions, IDs and error messages. Do not paraphrase or shorten them; put \
them in `backticks`.
- State only what the conversation (and the previous summary, if there is one) actually says. Never invent \
facts, results, file contents or decisions, and never make up something the user said. Mark anything \
uncertain as uncertain.
- Keep the user's requirements in the user's own terms; quote short requests.
- Prefer short bullets to prose. Be as brief as possible without losing a fact the agent will need.
- Reply with the summary only, in Markdown: no preamble, no closing remarks, no code fence around it.
- You are not continuing the task: do not answer the user, do not call tools, do not propose code \
beyond what the conversation contains.""",
    "zh": """\
你负责维护一个软件智能体的工作记忆：它的对话已经超出了上下文窗口。较早的消息正在被移出上下文，\
你写的摘要将是智能体对这些消息仅存的记录。智能体之后只凭这份摘要继续工作，所以请为这位读者而写：\
准确、如实、简短。

规则：
- 严格使用模板中的章节标题，顺序不变，每个标题作为 Markdown 标题单独占一行、从行首开始。\
每个章节都要写；某个章节没有内容时写"- （无）"。
- 原样逐字保留关键细节：文件路径、函数名、类名、变量名、带单位的数字、URL、shell 命令、版本号、ID \
和错误信息。不要改写或缩写，并用 `反引号` 标出。
- 只陈述对话（以及已有的上一版摘要）中确实出现的内容。绝不编造事实、结果、文件内容或决定，\
也绝不杜撰用户说过的话。不确定的内容要注明不确定。
- 用户的要求按用户自己的说法记录；简短的要求可以直接引用。
- 多用简短的条目，少用大段文字。在不丢失智能体所需事实的前提下尽量简短。
- 只输出 Markdown 格式的摘要本身：不要开场白，不要结束语，不要用代码块包起来。
- 你不是在继续执行任务：不要回答用户，不要调用工具，不要给出对话中没有的代码。""",
}

_TEMPLATES: dict[str, str] = {
    "en": """\
## Goal
- What the user wants to achieve, in their words. Later changes to the request go in further bullets.

## Constraints & Preferences
- Requirements, limits and preferences the user stated (tools, style, things to avoid), or "- (none)".

## Progress
### Done
- Finished work and its concrete outcome (files changed, commands that passed).
### In Progress
- Work that was started but is not finished, and where it stands.
### Blocked
- Problems that stop the work, each with its exact error message, or "- (none)".

## Key Decisions
- The decision: why it was taken, and what it replaced, if anything.

## Next Steps
1. The next concrete actions, in order.

## Critical Context
- Exact details the agent will need again: paths, names, values, URLs, commands, error messages, IDs.""",
    "zh": """\
## 目标
- 用户想达成什么，用用户自己的说法。之后对需求的修改另起条目。

## 约束和偏好
- 用户提出的要求、限制和偏好（工具、风格、需要避免的做法），没有则写"- （无）"。

## 进展
### 已完成
- 已完成的工作及其具体结果（改动的文件、通过的命令）。
### 进行中
- 已开始但尚未完成的工作，以及当前进行到哪一步。
### 阻塞
- 阻碍工作的问题，每条附上原样的错误信息，没有则写"- （无）"。

## 关键决策
- 做了什么决定：原因是什么，取代了什么做法（如有）。

## 下一步
1. 接下来要做的具体操作，按顺序列出。

## 关键上下文
- 智能体之后还会用到的确切细节：路径、名称、数值、URL、命令、错误信息、ID。""",
}

INITIAL_PROMPTS: dict[str, str] = {
    "en": (
        "Write the first summary of the conversation inside <conversation>. "
        "Follow this template (replace the hints with the actual content):\n\n" + _TEMPLATES["en"]
    ),
    "zh": (
        "请为 <conversation> 中的对话撰写第一版摘要。"
        "按下面的模板输出（把提示文字替换成实际内容）：\n\n" + _TEMPLATES["zh"]
    ),
}

UPDATE_PROMPTS: dict[str, str] = {
    "en": """\
<previous_summary> is the summary of everything that happened before the messages in <conversation>. \
Write the next version of that same document: ONE merged summary that covers both. Do not write a \
summary of the new messages only, and do not append a second summary after the first.
- Start from the previous summary and keep every item in it that is still true, with its exact details.
- Add the new goals, constraints, progress, decisions and context from the conversation.
- Move work that is now finished from In Progress (or Blocked) to Done.
- Rewrite Next Steps so that they match where the work stands now.
- Remove an item only when the conversation shows it is obsolete or wrong; never drop an identifier that \
may still be needed.
- Each section appears once, and no item is listed twice.

Follow this template (replace the hints with the actual content):

"""
    + _TEMPLATES["en"],
    "zh": """\
<previous_summary> 是 <conversation> 中这些消息之前所有内容的摘要。请写出这同一份文档的下一版：\
一份合并后、同时覆盖两部分内容的摘要。不要只总结新消息，也不要在旧摘要后面再追加一份摘要。
- 以上一版摘要为基础，保留其中仍然成立的每一条内容，确切细节保持原样。
- 加入对话中新的目标、约束、进展、决策和上下文。
- 把现在已经完成的工作从"进行中"（或"阻塞"）移到"已完成"。
- 重写"下一步"，使其与当前的工作状态一致。
- 只有当对话表明某条内容已过时或有误时才删除它；可能仍会用到的标识信息绝不删除。
- 每个章节只出现一次，同一条内容不要重复列出。

按下面的模板输出（把提示文字替换成实际内容）：

"""
    + _TEMPLATES["zh"],
}

_EXTRA_INSTRUCTION_INTRO: dict[str, str] = {
    "en": (
        "An additional instruction from the operator for this summary. Follow it, while keeping the "
        "required headings and the rules above:"
    ),
    "zh": "操作者对这次摘要的附加要求。请遵循它，同时保留规定的章节标题并遵守上述规则：",
}


def build_summary_messages(
    request: SummaryRequest,
    *,
    counter: TextCounter | None = None,
    max_chars_per_block: int = 4000,
) -> list[dict[str, str]]:
    """The OpenAI chat messages asking for a summary: one system and one user message.

    The user message holds, in this order: the conversation as a transcript,
    the previous summary (incremental mode only), the task with the template in
    the request's language, and the operator's extra instruction if any. The
    instruction comes last so it is the freshest thing the model reads.
    """
    language = resolve_language(request.language, request.messages)
    history = format_history(
        request.messages,
        max_chars_per_block=max_chars_per_block,
        cap_tokens=request.cap_tokens,
        counter=counter,
    )
    previous = (request.previous_summary or "").strip()
    parts = [f"<conversation>\n{history}\n</conversation>"]
    if previous:
        parts.append(f"<previous_summary>\n{previous}\n</previous_summary>")
        parts.append(UPDATE_PROMPTS[language])
    else:
        parts.append(INITIAL_PROMPTS[language])
    extra = (request.extra_instruction or "").strip()
    if extra:
        parts.append(
            f"{_EXTRA_INSTRUCTION_INTRO[language]}\n<extra_instruction>\n{extra}\n</extra_instruction>"
        )
    return [
        {"role": "system", "content": SYSTEM_PROMPTS[language]},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


# -- transcript ---------------------------------------------------------------------------


def approx_tokens(text: str) -> int:
    """A cheap token estimate (about 4 UTF-8 bytes per token).

    Used only when the caller gives no counter: the cap merely decides how much
    history the summariser gets to read, never what the agent keeps, so an
    estimate is acceptable here.
    """
    return (len(text.encode("utf-8")) + 3) // 4


def _clip(text: str, limit: int) -> str:
    """Cut ``text`` to about ``limit`` characters, keeping its head and its tail.

    The tail matters as much as the head: a failing command prints its error
    last. The cut is stated so the summariser knows text is missing.
    """
    if limit <= 0 or len(text) <= limit:
        return text
    head = (limit * 2) // 3
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[… {omitted} characters not shown …]\n{text[len(text) - tail :]}"


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line if line else line for line in text.split("\n"))


def _offload_path(message: Message, block: ToolResultBlock, notice: str) -> str | None:
    """Where the full output of a truncated tool result lives, if we can tell.

    ``metadata["offload"]`` is the truncation step's record: either one record
    or a mapping of tool-result id → record, each with ``file_path`` (or
    ``path``). Without it, the path is read back from the notice itself, which
    always says ``file_path=…``.
    """
    record: Any = message.metadata.get("offload")
    if isinstance(record, Mapping) and isinstance(record.get(block.id), Mapping):
        record = record[block.id]
    elif isinstance(record, Sequence) and not isinstance(record, str):
        matches = [
            r for r in record if isinstance(r, Mapping) and block.id in (r.get("id"), r.get("tool_use_id"))
        ]
        record = matches[0] if matches else None
    if isinstance(record, Mapping):
        for key in ("file_path", "path", "file"):
            value = record.get(key)
            if isinstance(value, str) and value:
                return value
    found = re.search(r"file_path\s*=\s*[\"'`]?([^\s\"'`,]+)", notice)
    return found.group(1) if found else None


def _format_tool_result(message: Message, block: ToolResultBlock, limit: int) -> str:
    if message.is_repair:
        # An importer's placeholder: reading it as an error would make the
        # summary report a failure the agent never had.
        return (f"tool_result {block.name or '?'}: (the recorded session holds no result for this call; "
                "not a failure)")
    status = " [error]" if block.is_error else ""
    lines = [f"tool_result {block.name or '?'}{status}:"]
    if isinstance(block.output, str):
        text = block.output
    else:
        pieces: list[str] = []
        for part in block.output:
            if isinstance(part, TextBlock):
                pieces.append(part.text)
            else:
                pieces.append(_media_line(part))
        text = "\n".join(pieces)
    notice = ""
    if TRUNCATION_MARKER in text:
        # Only the excerpt before the notice is content; the notice itself is
        # instructions for the agent, replaced here by a plain pointer.
        text, _, notice = text.partition(TRUNCATION_MARKER)
    body = _clip(text.rstrip(), limit)
    if body:
        lines.append(_indent(body, "  "))
    else:
        lines.append("  (no output)")
    if notice:
        where = _offload_path(message, block, notice)
        if where:
            lines.append(f"  [output cut in the live context; the full output is saved at {where}]")
        else:
            lines.append("  [output cut in the live context; the rest is not shown]")
    return "\n".join(lines)


def _media_line(block: MediaBlock) -> str:
    if block.url:
        return f"[{block.kind}: {block.url}]"
    return f"[{block.kind}: inline {block.media_type or 'data'}]"


def format_message(
    message: Message, *, max_chars_per_block: int = 4000, include_thinking: bool = False
) -> str:
    """One message as transcript text: a ``[timestamp] role(name):`` header, then its blocks."""
    who = f"{message.role}({message.name})" if message.name else message.role
    header = f"[{message.timestamp}] {who}:" if message.timestamp else f"{who}:"
    lines = [header]
    for block in message.content:
        if isinstance(block, TextBlock):
            if block.text.strip():
                lines.append(_indent(_clip(block.text.strip("\n"), max_chars_per_block), "  "))
        elif isinstance(block, ThinkingBlock):
            if include_thinking and block.thinking.strip():
                lines.append("  (thinking)")
                lines.append(_indent(_clip(block.thinking.strip("\n"), max_chars_per_block), "    "))
        elif isinstance(block, ToolUseBlock):
            if block.input or not block.raw_input:
                args = json.dumps(block.input, ensure_ascii=False)
            else:
                # Arguments the model emitted as invalid JSON: show them as they came.
                args = block.raw_input
            lines.append(f"  tool_use {block.name}({_clip(args, max_chars_per_block)})")
        elif isinstance(block, ToolResultBlock):
            lines.append(_indent(_format_tool_result(message, block, max_chars_per_block), "  "))
        else:
            lines.append("  " + _media_line(block))
    if len(lines) == 1:
        lines.append("  (empty)")
    return "\n".join(lines)


def _oldest_user_ask(messages: Sequence[Message]) -> int | None:
    for index, message in enumerate(messages):
        if message.is_user_turn and message.plain_text().strip():
            return index
    return None


def format_history(
    messages: Sequence[Message],
    *,
    max_chars_per_block: int = 4000,
    cap_tokens: int | None = None,
    counter: TextCounter | None = None,
    include_thinking: bool = False,
) -> str:
    """The conversation as a readable transcript for the summariser.

    With ``cap_tokens``, the newest messages that fit are kept (the newest one
    always, even alone over the cap), the oldest user request is always kept
    because it states the goal, and every gap is marked with the number of
    messages left out.
    """
    if not messages:
        return "(no messages)"
    blocks = [
        format_message(m, max_chars_per_block=max_chars_per_block, include_thinking=include_thinking)
        for m in messages
    ]
    if cap_tokens is None:
        return "\n\n".join(blocks)

    count = counter or approx_tokens
    anchor = _oldest_user_ask(messages)
    keep: set[int] = set()
    used = 0
    if anchor is not None:
        keep.add(anchor)
        used += count(blocks[anchor])
    tail_kept = 0
    for index in range(len(blocks) - 1, -1, -1):
        if index == anchor:
            continue
        cost = count(blocks[index])
        if used + cost > cap_tokens and tail_kept:
            # Stop at the first message that does not fit: the transcript stays a
            # contiguous tail instead of a patchwork of small messages.
            break
        keep.add(index)
        used += cost
        tail_kept += 1

    elided = len(blocks) - len(keep)
    if not elided:
        return "\n\n".join(blocks)
    out = [
        f"(Transcript shortened to fit the summary budget: {elided} of {len(blocks)} messages are "
        "left out; the oldest user request is kept.)"
    ]
    gap = 0
    for index, block in enumerate(blocks):
        if index in keep:
            if gap:
                out.append(f"[… {gap} message{'s' if gap != 1 else ''} left out here …]")
                gap = 0
            out.append(block)
        else:
            gap += 1
    if gap:
        out.append(f"[… {gap} message{'s' if gap != 1 else ''} left out here …]")
    return "\n\n".join(out)


# -- language -----------------------------------------------------------------------------

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN_WORD = re.compile(r"[A-Za-z]+")


def is_mostly_cjk(text: str) -> bool:
    """True when CJK characters make up at least half of the text's words.

    One Chinese character carries about as much as one English word, so
    characters are weighed against Latin words, not letters: "请修复
    src/app/models.py 里的 bug" counts as Chinese.
    """
    cjk = len(_CJK.findall(text))
    if not cjk:
        return False
    words = len(_LATIN_WORD.findall(text))
    return cjk >= words


def resolve_language(language: str | None, messages: Sequence[Message]) -> str:
    """The language ("en" or "zh") to summarise in, for a profile's "en", "zh" or "auto".

    "auto" looks at what people wrote (user asks and assistant text), not at
    tool output, whose logs and code are English in any conversation.
    """
    lang = (language or "auto").strip().lower().replace("_", "-")
    if lang.startswith("zh"):
        return "zh"
    if lang.startswith("en"):
        return "en"
    if lang != "auto":
        raise ValueError(f"unknown summary language {language!r}; expected 'en', 'zh' or 'auto'")
    spoken: list[str] = []
    for message in messages:
        if message.role in ("user", "assistant") and not message.is_tool_result:
            spoken.extend(b.text for b in message.content if isinstance(b, TextBlock))
    return "zh" if is_mostly_cjk("\n".join(spoken)) else "en"


def summary_language(language: str | None, fixed: str | None, messages: Sequence[Message]) -> str:
    """The language a session's summary is written in.

    The profile's "en" or "zh" when it names one; for "auto", ``fixed`` (the
    language the session's first summary was written in) once there is one,
    and only before that a detection from ``messages``. Re-detecting at every
    compaction would switch the headings when one span happens to be mostly
    Chinese and the next mostly English, and every diff would then read
    "everything removed, everything added".
    """
    if (language or "auto").strip().lower() == "auto" and fixed in LANGUAGES:
        return fixed
    return resolve_language(language, messages)


def language_of_summary(text: str | None) -> str | None:
    """The language of a summary we wrote, from its headings (None when it has none of ours)."""
    for line in (text or "").splitlines():
        if line.startswith("#"):
            found = heading_language(line.lstrip("#").strip())
            if found:
                return found
    return None


# -- the summary as the agent sees it -------------------------------------------------------

_WRAPPERS: dict[str, tuple[str, str]] = {
    "en": (
        "# Summary of the earlier conversation\n\n"
        "The messages before this point were taken out of the context to save space and condensed "
        "into the summary below. The original messages are archived unchanged in {archive}; read that "
        "file when you need an exact detail the summary does not give (newer messages are nearer the "
        "end of the file).",
        "(End of the summary. It records work already done, it is not a new request: carry on from the "
        "messages that follow.)",
    ),
    "zh": (
        "# 早前对话的摘要\n\n"
        "为节省上下文空间，此前的消息已移出上下文，并浓缩为下面的摘要。原始消息原样归档在 {archive}；"
        "需要摘要里没有的确切细节时，请读取该文件（越新的消息越靠近文件末尾）。",
        "（摘要到此结束。它记录的是已经完成的工作，不是新的请求：请接着下面的消息继续。）",
    ),
}


def wrap_summary(summary: str, *, archive_hint: str, language: str) -> str:
    """The summary as injected into the LLM payload, with a pointer to the dialog archive.

    ``archive_hint`` names the archive file(s), e.g. ``dialog/2026-03-19.jsonl``.
    With ``language="auto"`` the wrapper follows the language of the summary.
    """
    lang = language.strip().lower()
    if lang.startswith("zh"):
        lang = "zh"
    elif lang.startswith("en"):
        lang = "en"
    else:
        lang = "zh" if is_mostly_cjk(summary) else "en"
    intro, outro = _WRAPPERS[lang]
    return f"{intro.format(archive=archive_hint)}\n\n{summary.strip()}\n\n{outro}"
