"""The offline compactor: a six-section summary built from the messages, no LLM.

It is the embedded default when no model is configured and the fallback when
the model fails and the window would overflow. It cannot understand the
conversation, so it only lifts out what can be found mechanically and copies
it verbatim: the user's asks, their imperative sentences, every tool call with
its outcome, decision sentences, the last stated intent, and identifiers
(paths, URLs, commands, numbers with units, error lines).

Rules that keep it trustworthy as a fallback:

* deterministic: the same input gives the same text, byte for byte;
* nothing invented: every bullet is copied from a message or from the
  previous summary, with a fixed label in front at most;
* bounded: each section keeps at most a fixed number of bullets (the most
  recent), so repeated incremental runs do not grow without limit;
* always valid: every heading is written, with "(none)" for empty sections.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from contextlab.engine.compactors.base import SummaryRequest, SummaryResult
from contextlab.engine.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock
from contextlab.engine.memory.working import SENTENCE_BREAK
from contextlab.engine.stages.summary.identifiers import LINE_LEADS as IDENTIFIER_LINE_LEADS
from contextlab.engine.stages.summary.prompts import (
    SECTION_IDS,
    SUBSECTION_IDS,
    TRUNCATION_MARKER,
    canonical_heading,
    heading_id,
    resolve_language,
)
from contextlab.engine.stages.summary.validity import split_sections

# Bullets kept per section, newest last. The goal keeps its first bullet (the
# original ask) on top of these.
CAPS: dict[str, int] = {
    "goal": 6,
    "constraints": 10,
    "done": 12,
    "in_progress": 6,
    "blocked": 6,
    "decisions": 10,
    "next_steps": 5,
}
ARGS_PER_TOOL = 8
CONTEXT_CAPS: dict[str, int] = {
    "file": 15,
    "url": 8,
    "command": 8,
    "name": 10,
    "number": 8,
    "error": 8,
    "other": 15,
}
MAX_ITEM_CHARS = 300
MAX_PREVIOUS_ITEM_CHARS = 600
MAX_ASK_CHARS = 400
# How much of a tool output is scanned for failure markers (head and tail).
_SCAN_CHARS = 20_000

_LABELS: dict[str, dict[str, str]] = {
    "en": {
        "none": "(none)",
        "refinement": "Later request: ",
        "working_on": "Working on: ",
        "resolved": "(resolved) ",
        "pending": " (waiting for its result)",
        "unrecorded": " (no result recorded)",
        "failed": " failed: ",
        "fix": "Fix: ",
        "collect": "Get the result of ",
        "continue": "Continue: ",
        "file": "file",
        "url": "URL",
        "command": "command",
        "name": "name",
        "number": "number",
        "error": "error",
        "sep": ": ",
    },
    "zh": {
        "none": "（无）",
        "refinement": "后续要求：",
        "working_on": "正在处理：",
        "resolved": "（已解决）",
        "pending": "（等待结果）",
        "unrecorded": "（未记录结果）",
        "failed": " 失败：",
        "fix": "解决：",
        "collect": "获取结果：",
        "continue": "继续：",
        "file": "文件",
        "url": "网址",
        "command": "命令",
        "name": "名称",
        "number": "数值",
        "error": "错误",
        "sep": "：",
    },
}
_CATEGORIES: tuple[str, ...] = ("file", "url", "command", "name", "number", "error")
_PLACEHOLDERS = {"(none)", "（无）", "none", "无", "n/a", "-", "(none recorded)", "（未记录）"}
# Every label we might put in front of a copied text, in both languages: the
# dedupe key ignores them so "Later request: X" and "X" count as one item.
_PREFIXES: tuple[str, ...] = tuple(
    sorted(
        {
            labels[k]
            for labels in _LABELS.values()
            for k in ("refinement", "working_on", "resolved", "fix", "collect", "continue")
        },
        key=len,
        reverse=True,
    )
)

# -- patterns -------------------------------------------------------------------------------

_CONSTRAINT = re.compile(
    r"(?i:\b(?:must(?:n't| not)?|don't|do not|never|always|please (?:use|keep|avoid|don't|do not|make sure"
    r"|stick|prefer|write|run|follow)|prefer(?:ably)?|make sure|avoid|should(?:n't| not)?|only use"
    r"|no need to|stick to|keep using)\b)"
    r"|必须|不要|不能|不许|不准|禁止|务必|一定要|始终|总是|永远|只能|只用|优先|尽量|避免|别(?:用|改|动|碰|删)"
    r"|请(?:使用|用|保持|不要|勿|确保|务必|只|始终|一直|别|避免|遵守|按照)"
)
_DECISION = re.compile(
    r"(?i:\b(?:I'll use|I will use|I'm going to use|I am going to use|we'll use|we will use|let's use"
    r"|decided|decide to|decision|instead of|rather than|switch(?:ing|ed)? to|going with|go with|chose"
    r"|choose to|opt(?:ed)? for|root cause|the fix is)\b)"
    r"|决定|改用|改为|换成|而不是|而非|选择|采用|我将使用|我会使用|我会用|根本原因|原因是|修复方法是"
)
_INTENT = re.compile(
    r"(?i:\b(?:next|then|I'll|I will|let me|I'm going to|I am going to|we need to|need to|still need"
    r"|todo|to do|remaining|plan to|will now)\b)"
    r"|接下来|下一步|然后|我将|我会|我来|需要|还要|待办|计划|准备"
)
_LIST_MARK = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+(?:\[[ xX]\]\s+)?")

_URL = re.compile(r"https?://[^\s<>\"'`)\]}，。]+")
_PATH = re.compile(r"(?<![\w/.:@-])(?:~|\.{1,2})?/?(?:[\w.@+-]+/)+[\w.@+-]+")
_FILE_EXT = re.compile(
    r"(?<![\w/.-])[\w@+-][\w.@+-]*\.(?:py|pyi|js|mjs|ts|tsx|jsx|json|jsonl|md|rst|txt|toml|yaml|yml|cfg|ini"
    r"|sh|go|rs|java|kt|c|h|cc|cpp|hpp|rb|php|html|css|scss|sql|lock|log|csv|xml|env|ipynb|dockerfile)\b"
)
_NUMBER_UNIT = re.compile(
    r"(?<![\w.])\d+(?:[.,]\d+)*\s?(?:ms|µs|us|ns|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?|days?|weeks?"
    r"|KB|KiB|MB|MiB|GB|GiB|TB|kB|B|bytes?|tokens?|px|rem|em|rps|qps|req/s|k|K|M)\b"
    r"|(?<![\w.])\d+(?:\.\d+)?%"
    r"|\d+(?:\.\d+)?\s?(?:毫秒|秒|分钟|小时|天|周|字节|行|次|个|条|倍|万)"
)
_CODE_SPAN = re.compile(r"``\s?(.+?)\s?``|`([^`\n]+)`")

_ERROR_LINE = re.compile(
    r"\b[A-Z]\w*(?:Error|Exception|Failure)\b|^[ \t]*(?i:(?:error|fatal|panic)\b)|^[ \t]*FAILED\b"
    r"|^[ \t]*E[ \t]+\S|command not found|No such file or directory|Permission denied"
    r"|(?i:exit (?:code|status):? ?[1-9])",
    re.MULTILINE,
)
_FAILURE_OUTPUT = re.compile(
    r"Traceback \(most recent call last\)|^FAILED\b|\b[1-9]\d* failed\b|^E\s{2,}\S|command not found"
    r"|(?i:^(?:error|fatal)(?:\[\w+\])?:)|(?i:exit (?:code|status):? ?[1-9])|^npm ERR!",
    re.MULTILINE,
)
_COMMAND_TOOL = re.compile(r"(?i)shell|bash|exec|terminal|command|run_?cmd|powershell")
_KEY_ARGS: tuple[str, ...] = (
    "file_path",
    "path",
    "filepath",
    "filename",
    "file",
    "target_file",
    "notebook_path",
    "command",
    "cmd",
    "script",
    "url",
    "uri",
    "query",
    "pattern",
    "q",
    "name",
    "id",
)
_COMMAND_ARGS = {"command", "cmd", "script"}
_ARG_KINDS: dict[str, str] = {
    **dict.fromkeys(_COMMAND_ARGS, "command"),
    **dict.fromkeys(
        ("file_path", "path", "filepath", "filename", "file", "target_file", "notebook_path"), "file"
    ),
    **dict.fromkeys(("url", "uri"), "url"),
}
_LIST_ARGS = ("paths", "files", "file_paths", "urls")


# -- small text helpers -----------------------------------------------------------------------


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = cut.rfind(" ")
    if space > limit * 0.6:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


def _code(text: str) -> str:
    """A Markdown code span that survives backticks inside the text."""
    if "`" not in text:
        return f"`{text}`"
    return f"`` {text} ``"


def _spans(text: str) -> list[str]:
    return [a or b for a, b in _CODE_SPAN.findall(text)]


def _key(item: str) -> str:
    """Dedupe key: case, spacing, list marks and our own labels do not make an item new."""
    text = _LIST_MARK.sub("", item).strip()
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if text.startswith(prefix.strip()):
                text = text[len(prefix.strip()) :].strip()
                changed = True
    return _one_line(text).rstrip(".。;；").casefold()


def _dedupe(items: Iterable[str], *, keep_first: bool = False) -> list[str]:
    """Unique items. By default each sits where it was LAST seen, so a restated
    item counts as recent; ``keep_first`` keeps the first wording and place."""
    seen: dict[str, str] = {}
    for item in items:
        key = _key(item)
        if not key or (keep_first and key in seen):
            continue
        seen.pop(key, None)
        seen[key] = item
    return list(seen.values())


def _sentences(text: str) -> list[str]:
    out: list[str] = []
    for part in SENTENCE_BREAK.split(text):
        sentence = _one_line(_LIST_MARK.sub("", part or ""))
        if len(sentence) >= 3:
            out.append(sentence)
    return out


def _texts(message: Message) -> str:
    return "\n".join(b.text for b in message.content if isinstance(b, TextBlock))


# -- what the messages contain -----------------------------------------------------------------


@dataclass(slots=True)
class _Call:
    tool: str
    arg: str | None
    is_command: bool
    ok: bool | None  # None: no result yet (or none was ever recorded)
    error: str | None = None
    # The result is an importer's placeholder: the source never recorded one.
    unrecorded: bool = False


@dataclass(slots=True)
class _Facts:
    asks: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    intents: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    concluded: bool = False
    context: list[tuple[str, str]] = field(default_factory=list)  # (category, value)


def _key_arg(use: ToolUseBlock) -> tuple[str | None, str]:
    """The argument that says what a call was about, and its kind.

    Kinds: "command", "file", "url", or "other" (a query, a name...).
    """
    args = use.input
    for name in _KEY_ARGS:
        value = args.get(name)
        if isinstance(value, str) and value.strip():
            return _clip(_one_line(value), 160), _ARG_KINDS.get(name, "other")
        if (
            isinstance(value, list)
            and name in _COMMAND_ARGS
            and value
            and all(isinstance(v, str) for v in value)
        ):
            return _clip(" ".join(value), 160), "command"
    for name in _LIST_ARGS:
        value = args.get(name)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return _clip(", ".join(value[:4]), 160), "other"
    for value in args.values():
        if isinstance(value, str) and value.strip() and len(value) <= 160 and "\n" not in value:
            return value.strip(), "other"
    return None, "other"


def _first_error_line(output: str) -> str:
    # One search over the text, not one per line: outputs can be megabytes.
    text = output[:_SCAN_CHARS]
    match = _ERROR_LINE.search(text)
    if match:
        start = text.rfind("\n", 0, match.start()) + 1
        end = text.find("\n", match.end())
        line = text[start : end if end >= 0 else len(text)].strip()
        return _clip(re.sub(r"^E\s+", "", line), 200)
    for line in text.split("\n"):
        if line.strip():
            return _clip(line.strip(), 200)
    return ""


def _looks_failed(output: str) -> bool:
    """Failure markers of a command's output; the head and tail are enough to find them."""
    if len(output) <= 2 * _SCAN_CHARS:
        return bool(_FAILURE_OUTPUT.search(output))
    return bool(_FAILURE_OUTPUT.search(output[:_SCAN_CHARS]) or _FAILURE_OUTPUT.search(output[-_SCAN_CHARS:]))


def _result_text(block: ToolResultBlock) -> str:
    # The excerpt only: the truncation notice is ours, not the tool's output.
    return block.output_text().partition(TRUNCATION_MARKER)[0]


def _identifiers(text: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for url in _URL.findall(text):
        found.append(("url", url.rstrip(".,;:")))
    without_urls = _URL.sub(" ", text)
    for match in _PATH.finditer(without_urls):
        path = match.group(0).rstrip(".,;:")
        last = path.rsplit("/", 1)[-1]
        if re.fullmatch(r"[\d/.:-]+", path):
            continue  # a date or a fraction, not a path
        if "." in last.strip(".") or path.count("/") >= 2 or path.startswith(("/", "./", "../", "~/")):
            found.append(("file", path))
    for match in _FILE_EXT.finditer(without_urls):
        found.append(("file", match.group(0)))
    for value in _spans(text):
        value = value.strip()
        if 2 <= len(value) <= 80 and not _URL.fullmatch(value):
            found.append(("name", value))
    for match in _NUMBER_UNIT.finditer(text):
        found.append(("number", match.group(0)))
    return found


def _collect(messages: Sequence[Message]) -> _Facts:
    facts = _Facts()
    results: dict[str, ToolResultBlock] = {}
    unrecorded: set[str] = set()
    for message in messages:
        for block in message.tool_results:
            results[block.id] = block
            if message.is_repair:
                unrecorded.add(block.id)

    # Results are matched to calls by id, wherever they sit, so a call whose
    # result is outside this slice shows as pending instead of failing.
    for message in messages:
        if message.is_user_turn:
            text = _texts(message)
            if not text.strip() or text.lstrip().startswith("/compact"):
                continue
            facts.asks.append(_clip(_one_line(text), MAX_ASK_CHARS))
            facts.constraints.extend(
                _clip(s, MAX_ITEM_CHARS) for s in _sentences(text) if _CONSTRAINT.search(s)
            )
            facts.context.extend(_identifiers(text))
            facts.concluded = False
        elif message.role == "assistant":
            text = _texts(message)
            sentences = _sentences(text)
            facts.decisions.extend(_clip(s, MAX_ITEM_CHARS) for s in sentences if _DECISION.search(s))
            if text.strip():
                # Only the latest thing the assistant said counts as its intent;
                # an earlier "let me run the tests" is stale once it moved on.
                facts.intents = [_clip(s, MAX_ITEM_CHARS) for s in sentences if _INTENT.search(s)]
            facts.context.extend(_identifiers(text))
            facts.concluded = bool(text.strip()) and not message.tool_uses
            for use in message.tool_uses:
                arg, kind = _key_arg(use)
                if kind == "other" and _COMMAND_TOOL.search(use.name):
                    kind = "command"
                is_command = kind == "command"
                result = results.get(use.id)
                call = _Call(use.name, arg, is_command, None)
                if use.id in unrecorded:
                    # Neither a failure nor a pending call: the recording simply has no result.
                    call.unrecorded = True
                elif result is not None:
                    output = _result_text(result)
                    failed = result.is_error or (is_command and _looks_failed(output))
                    call.ok = not failed
                    if failed:
                        call.error = _first_error_line(output) or None
                facts.calls.append(call)
                if arg and kind != "other":
                    facts.context.append((kind, arg))
                elif arg:
                    facts.context.extend(_identifiers(arg))
                for value in use.input.values():
                    # Other arguments are often file contents or code: only their
                    # URLs are worth keeping.
                    if isinstance(value, str):
                        facts.context.extend(("url", url.rstrip(".,;:")) for url in _URL.findall(value))
    for call in facts.calls:
        if call.error:
            facts.context.append(("error", call.error))
    return facts


# -- previous summary ------------------------------------------------------------------------------


def _items(body: str) -> list[str]:
    """The bullets of a section body; prose lines count as items, wrapped lines are joined."""
    items: list[str] = []
    for raw in body.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if not raw.strip():
            continue
        marked = _LIST_MARK.match(raw)
        if marked:
            items.append(raw[marked.end() :].strip())
        elif raw[:1] in (" ", "\t") and items:
            items[-1] = f"{items[-1]} {raw.strip()}"
        else:
            items.append(raw.strip())
    return [
        _clip(item, MAX_PREVIOUS_ITEM_CHARS)
        for item in items
        # The post-check's identifier line of an earlier span: its identifiers
        # are in the index it names, and carrying it on would grow every summary.
        if item.strip().casefold() not in _PLACEHOLDERS and not item.startswith(IDENTIFIER_LINE_LEADS)
    ]


def _parse_previous(text: str | None) -> dict[str, list[str]]:
    doc: dict[str, list[str]] = {sid: [] for sid in SECTION_IDS + SUBSECTION_IDS}
    if not text or not text.strip():
        return doc
    for heading, body in split_sections(text).items():
        sid = heading_id(heading.lstrip("#").strip()) if heading else None
        if sid == "progress":
            for sub_heading, sub_body in split_sections(body, level=3).items():
                sub = heading_id(sub_heading.lstrip("#").strip()) if sub_heading else None
                # Progress lines with no Done/Blocked heading: status unknown, so
                # they stay "in progress" rather than being claimed done.
                doc[sub if sub in SUBSECTION_IDS else "in_progress"].extend(_items(sub_body))
        elif sid in SECTION_IDS:
            doc[sid].extend(_items(body))
        else:
            # A section we did not ask for (or text before the first heading):
            # still true, so its lines are kept as context rather than dropped.
            doc["critical_context"].extend(_items(body))
    return doc


# -- the compactor ------------------------------------------------------------------------------------

_DONE_ENTRY = re.compile(r"^([A-Za-z_][\w.:-]*)(?::\s+(.+))?$")
_DONE_ARGS = re.compile(r"(?:``\s?.+?\s?``|`[^`]+`)(?:, (?:``\s?.+?\s?``|`[^`]+`))*")
# Our own Blocked / In Progress wording for a call ("tool `arg` failed: …",
# "tool `arg` (waiting for its result)"), recognised in a previous summary.
_CALL_ITEM = re.compile(
    r"^([A-Za-z_][\w.:-]*) (``\s?.+?\s?``|`[^`]+`)(?= failed: | 失败：| \(waiting for its result\)|（等待结果）)"
)


class _Done:
    """Done entries: one bullet per tool listing its key arguments, plus free text."""

    def __init__(self) -> None:
        self.order: list[tuple[str, str]] = []  # ("tool", name) or ("text", item)
        self.args: dict[str, list[str]] = {}

    def add_item(self, item: str) -> None:
        entry = _DONE_ENTRY.match(item)
        if entry and (entry.group(2) is None or _DONE_ARGS.fullmatch(entry.group(2))):
            self.add_call(entry.group(1), _spans(entry.group(2) or ""))
            return
        self._touch(("text", item))

    def add_call(self, tool: str, args: Sequence[str]) -> None:
        self._touch(("tool", tool))
        known = self.args.setdefault(tool, [])
        for arg in args:
            if arg in known:
                known.remove(arg)
            known.append(arg)
        del known[: max(0, len(known) - ARGS_PER_TOOL)]

    def _touch(self, entry: tuple[str, str]) -> None:
        if entry[0] == "text":
            key = _key(entry[1])
            self.order = [e for e in self.order if e[0] != "text" or _key(e[1]) != key]
        elif entry in self.order:
            self.order.remove(entry)
        self.order.append(entry)

    def render(self, cap: int) -> list[str]:
        lines: list[str] = []
        for kind, value in self.order[-cap:]:
            if kind == "text":
                lines.append(value)
            elif self.args.get(value):
                lines.append(f"{value}: {', '.join(_code(a) for a in self.args[value])}")
            else:
                lines.append(value)
        return lines


def _call_item(call: _Call) -> str:
    return f"{call.tool} {_code(call.arg)}" if call.arg else call.tool


def _context_category(item: str) -> str:
    for labels in _LABELS.values():
        for category in _CATEGORIES:
            if item.startswith(labels[category] + labels["sep"]):
                return category
    return "other"


class ExtractiveCompactor:
    """Builds the summary from the messages themselves; offline and deterministic."""

    name = "extractive"
    label = "Extractive (offline, no LLM)"

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        started = time.perf_counter()
        text = self.build(request)
        return SummaryResult(
            text=text,
            compactor=self.name,
            model=None,
            latency_ms=(time.perf_counter() - started) * 1000,
            usage=None,
            raw_request={
                "compactor": self.name,
                "language": request.language,
                "messages": len(request.messages),
                "incremental": bool((request.previous_summary or "").strip()),
            },
            raw_response=None,
            attempts=1,
        )

    def build(self, request: SummaryRequest) -> str:
        language = resolve_language(request.language, request.messages)
        labels = _LABELS[language]
        facts = _collect(request.messages)
        previous = _parse_previous(request.previous_summary)

        # Goal: the original ask stays first; every later ask is a refinement.
        goal_items = list(previous["goal"])
        asks = list(facts.asks)
        if not goal_items and asks:
            goal_items.append(asks.pop(0))
        goal_items.extend(labels["refinement"] + ask for ask in asks)
        goal = _dedupe(goal_items, keep_first=True)
        goal = goal[:1] + goal[1:][-(CAPS["goal"] - 1) :]

        constraints = _dedupe(previous["constraints"] + facts.constraints)[-CAPS["constraints"] :]
        decisions = _dedupe(previous["decisions"] + facts.decisions)[-CAPS["decisions"] :]

        # Progress. A call that later succeeded with the same tool and argument
        # is done, whatever failed before it.
        successes = {(c.tool, c.arg) for c in facts.calls if c.ok}
        success_args = {c.arg for c in facts.calls if c.ok and c.arg}
        done = _Done()
        for item in previous["done"]:
            done.add_item(item)

        def resolved(item: str) -> bool:
            return any(span in success_args for span in _spans(item))

        def same_call_succeeded(item: str) -> bool:
            # Our own wording for that very call: the new success in Done says it all.
            call = _CALL_ITEM.match(item)
            return call is not None and (call.group(1), _spans(call.group(2))[0]) in successes

        blocked: list[str] = []
        in_progress: list[str] = []
        for item in previous["blocked"]:
            if not resolved(item):
                blocked.append(item)
            elif not same_call_succeeded(item):
                done.add_item(labels["resolved"] + item)
        for item in previous["in_progress"]:
            if not resolved(item):
                in_progress.append(item)
            elif not same_call_succeeded(item):
                done.add_item(item)

        pending: list[_Call] = []
        new_blocked: list[_Call] = []
        for index, call in enumerate(facts.calls):
            if call.unrecorded:
                done.add_item(_call_item(call) + labels["unrecorded"])
            elif call.ok:
                done.add_call(call.tool, [call.arg] if call.arg else [])
            elif call.ok is None:
                pending.append(call)
            else:
                later = facts.calls[index + 1 :]
                if not any(c.ok and (c.tool, c.arg) == (call.tool, call.arg) for c in later):
                    new_blocked.append(call)
        blocked.extend(
            _call_item(c) + labels["failed"] + (c.error or "?")
            for c in new_blocked
            if (c.tool, c.arg) not in successes
        )
        in_progress.extend(_call_item(c) + labels["pending"] for c in pending)
        if facts.asks and not facts.concluded:
            in_progress.append(labels["working_on"] + facts.asks[-1])
        blocked = _dedupe(blocked)[-CAPS["blocked"] :]
        in_progress = _dedupe(in_progress)[-CAPS["in_progress"] :]

        # Next steps: what was said to come next, then whatever is unfinished.
        steps = list(facts.intents)
        steps.extend(labels["fix"] + item for item in blocked[-3:])
        steps.extend(labels["collect"] + _call_item(c) for c in pending)
        if facts.asks and not facts.concluded and not facts.intents:
            steps.append(labels["continue"] + facts.asks[-1])
        next_steps = _dedupe(steps)[: CAPS["next_steps"]] or previous["next_steps"][: CAPS["next_steps"]]

        context = self._context(previous["critical_context"], facts.context, labels)

        out = [
            self._section(canonical_heading("goal", language), goal, labels),
            self._section(canonical_heading("constraints", language), constraints, labels),
        ]
        progress = [
            canonical_heading("progress", language),
            self._section(canonical_heading("done", language), done.render(CAPS["done"]), labels),
            self._section(canonical_heading("in_progress", language), in_progress, labels),
            self._section(canonical_heading("blocked", language), blocked, labels),
        ]
        out.append("\n".join(progress))
        out.append(self._section(canonical_heading("decisions", language), decisions, labels))
        out.append(
            self._section(canonical_heading("next_steps", language), next_steps, labels, numbered=True)
        )
        out.append(self._section(canonical_heading("critical_context", language), context, labels))
        return "\n\n".join(out) + "\n"

    @staticmethod
    def _section(
        heading: str, items: Sequence[str], labels: dict[str, str], *, numbered: bool = False
    ) -> str:
        if not items:
            return f"{heading}\n- {labels['none']}"
        if numbered:
            lines = [f"{n}. {item}" for n, item in enumerate(items, 1)]
        else:
            lines = [f"- {item}" for item in items]
        return heading + "\n" + "\n".join(lines)

    @staticmethod
    def _context(previous: list[str], found: list[tuple[str, str]], labels: dict[str, str]) -> list[str]:
        new_items: list[str] = []
        seen_values: set[str] = set()
        for category, value in found:
            value = _one_line(value)
            # A value already listed under a more specific category (a command
            # that also looks like a path, a code span that is a path) once is enough.
            if not value or value in seen_values:
                continue
            seen_values.add(value)
            new_items.append(f"{labels[category]}{labels['sep']}{_code(value)}")
        # One line per value: a value seen under two categories (a backticked
        # `pytest -q` first taken for a name, later run as a command) keeps its
        # newest category.
        latest: dict[str, str] = {}
        for item in _dedupe(previous + new_items):
            spans = _spans(item)
            value_key = spans[0] if _context_category(item) != "other" and spans else _key(item)
            latest.pop(value_key, None)
            latest[value_key] = item
        merged = list(latest.values())
        by_category: dict[str, list[str]] = {c: [] for c in (*_CATEGORIES, "other")}
        for item in merged:
            by_category[_context_category(item)].append(item)
        ordered: list[str] = []
        for category, items in by_category.items():
            ordered.extend(items[-CONTEXT_CAPS[category] :])
        return ordered
