"""Working memory, operation history and file-state tracking (seed 004).

Everything here is read off a message list heuristically, with no LLM:

* ``extract_working_memory``: the goal (the first user ask), constraints
  (imperative and preference sentences of the user) and subtasks (todo-tool
  calls such as ``write_todos``/``TodoWrite``, else a numbered plan the
  assistant wrote, plus each user ask with its status).
* ``OperationHistory``: every tool call with a one-line argument summary, its
  outcome (``is_error``, exit codes, tracebacks, "Error:" replies), its
  duration when the timestamps are real, and the subtask it served.
* ``FileTracker`` / ``stale_reads``: which files were read and written, and
  which reads show an old version because the file was written later in the
  session (seed 004's "文件幻读": the model edits from a view that is out of date).
"""

from __future__ import annotations

import datetime as dt
import posixpath
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from contextlab.engine.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock

# -- describing a call -----------------------------------------------------------------------------

MAX_ARG_CHARS = 120
_PATH_KEYS = ("file_path", "path", "filepath", "filename", "file", "target_file", "notebook_path", "file_name")
_DESCRIBE_KEYS = ("command", "cmd", "script", *_PATH_KEYS, "url", "uri", "query", "pattern", "q", "dir", "name", "id")
_EDITOR_COMMANDS = {"view", "create", "str_replace", "insert", "undo_edit"}
_COMMAND_TOOL = re.compile(r"(?i)bash|shell|exec|terminal|command|run_?cmd|powershell|sh$")


def one_line(text: str, limit: int = MAX_ARG_CHARS) -> str:
    flat = re.sub(r"\s+", " ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def describe_call(use: ToolUseBlock) -> str:
    """What a call was about in a few words: the command, path, URL or query."""
    args = use.input
    command = args.get("command")
    path = next((args[k] for k in _PATH_KEYS if isinstance(args.get(k), str) and args[k]), None)
    if isinstance(command, str) and command in _EDITOR_COMMANDS and path:
        return one_line(f"{command} {path}")  # str_replace_editor view /a/b.c
    for key in _DESCRIBE_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return one_line(value)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return one_line(" ".join(value))
    todos = args.get("todos")
    if isinstance(todos, list):
        return f"{len(todos)} todo item(s)"
    for value in args.values():
        if isinstance(value, str) and value.strip():
            return one_line(value)
    return ""


def is_command_tool(name: str) -> bool:
    return bool(_COMMAND_TOOL.search(name))


_SUBCOMMAND_TOOLS = {"git", "cargo", "mix", "go", "docker", "bd", "node", "npx", "kubectl", "make", "python", "python3"}
# Package managers are interchangeable for "what worked instead": npm install
# failing and pnpm install working is one lesson about installing.
_PACKAGE_MANAGERS = {"npm", "pnpm", "yarn", "bun", "pip", "pip3", "uv", "poetry", "apt", "apt-get", "brew", "conda"}


def command_program(command: str) -> str:
    """What a shell command runs: the first program of its last ``&&``/``;``
    step that is not ``cd``/``export``, plus the subcommand for tools that
    have one (``git push``, ``mix test``, ``apt-get install``)."""
    steps: list[list[str]] = [[]]
    piped = False
    for token in _shell_tokens(command):
        if token in ("&&", "||", ";", "&", "\n"):
            steps.append([])
            piped = False
        elif token in ("|", "|&"):
            piped = True  # later pipe stages filter the output; the step is about its first program
        elif not piped:
            steps[-1].append(token)
    for words in reversed(steps):
        words = [w for w in words if not re.match(r"^[A-Za-z_]\w*=", w)]
        if words and words[0] in ("sudo", "env", "time", "nohup"):
            words = words[1:]
        if not words or words[0] in ("cd", "export", "echo", "true", "source", "."):
            continue
        program = posixpath.basename(words[0])
        operand = next((w for w in words[1:] if not w.startswith("-")), None)
        if program in _PACKAGE_MANAGERS:
            return f"package-manager {operand or ''}".strip()
        return f"{program} {operand}" if program in _SUBCOMMAND_TOOLS and operand else program
    return one_line(command, 60)


# -- outcome of a call -----------------------------------------------------------------------------

_EXIT_CODE = re.compile(
    r"(?i)(?:exit(?:ed)? (?:with )?(?:code|status)|return(?:ed)? (?:code|status)|returncode|exit_code)"
    r"[\s:=]*(-?\d+)"
)
_FIRST_LINE_FAILURE = re.compile(
    r"^(?:ERROR|Error|error|FATAL|Fatal|fatal)\b[:\s]|^Traceback \(most recent call last\)"
    r"|^No replacement was performed|^Invalid `|^Parameter `|^Exception\b"
)
_COMMAND_FAILURE = re.compile(
    r"Traceback \(most recent call last\)|command not found|^E: |^npm ERR!|^FAILED\b|\b[1-9]\d* failed\b",
    re.MULTILINE,
)
_ERROR_LINE = re.compile(
    r"\b[A-Z]\w*(?:Error|Exception)\b|\bError\b|\berror:|^[ \t]*(?i:error|fatal|panic)\b|^[ \t]*FAILED\b|^E: "
    r"|\*\*\* |command not found|No such file or directory|Permission denied|No replacement was performed"
    r"|did not appear verbatim|^npm ERR!",
    re.MULTILINE,
)
# Only when no line says what went wrong: "[The command completed with exit code 2.]".
_EXIT_LINE = re.compile(r"(?i:exit (?:code|status):? ?[1-9])")
_SCAN = 20_000


@dataclass(frozen=True)
class Outcome:
    ok: bool | None  # None: no result recorded
    error: str | None = None
    exit_code: int | None = None


def _first_error_line(text: str) -> str | None:
    """The line that says what went wrong, searched in the head, then the tail."""
    for pattern in (_ERROR_LINE, _EXIT_LINE):
        for source in (text[:_SCAN], text[-_SCAN:]):
            match = pattern.search(source)
            if match:
                start = source.rfind("\n", 0, match.start()) + 1
                end = source.find("\n", match.end())
                line = source[start : end if end >= 0 else len(source)].strip()
                if len(line) < 12 and line.endswith(":") and end >= 0:
                    # A bare "ERROR:" heading: the next line says what the error is.
                    following = next((x for x in source[end + 1 :].split("\n", 3) if x.strip()), "")
                    line = f"{line} {following.strip()}"
                return one_line(line, 200)
    for line in text[:_SCAN].split("\n"):
        if line.strip():
            return one_line(line, 200)
    return None


def _exit_one_answers(use: ToolUseBlock | None) -> bool:
    command = use.input.get("command") if use is not None else None
    if not isinstance(command, str) or not is_command_tool(use.name if use else ""):
        return False
    return command_program(command).split(" ")[0] in ("grep", "egrep", "fgrep", "rg", "diff", "cmp", "test", "[")


def call_outcome(use: ToolUseBlock | None, result: ToolResultBlock | None) -> Outcome:
    """ok / failed for one call, from its result.

    Order of evidence: the result's ``is_error`` flag; an exit code printed
    near the end ("[The command completed with exit code 2.]", "Exit code 1");
    a first line that is an error reply ("ERROR:", "Error:", a traceback, an
    editor's "No replacement was performed"); for shell-like tools, failure
    markers anywhere (tracebacks, "command not found", apt's "E:").
    """
    if result is None:
        return Outcome(None)
    text = result.output_text()
    tail = text[-2_000:]
    codes = _EXIT_CODE.findall(tail)
    exit_code = int(codes[-1]) if codes else None
    first = next((line.strip() for line in text[:2_000].split("\n") if line.strip()), "")
    failed = result.is_error
    if not failed and exit_code is not None:
        # grep/diff answer "no match"/"differs" with exit code 1: an answer, not an error.
        failed = exit_code != 0 and not (exit_code == 1 and _exit_one_answers(use))
    elif not failed:
        failed = bool(_FIRST_LINE_FAILURE.search(first))
        name = use.name if use is not None else result.name
        if not failed and is_command_tool(name):
            failed = bool(_COMMAND_FAILURE.search(text[:_SCAN]) or _COMMAND_FAILURE.search(tail))
    if not failed:
        return Outcome(True, None, exit_code)
    return Outcome(False, _first_error_line(text) or (f"exit code {exit_code}" if exit_code else "failed"), exit_code)


# -- working memory ---------------------------------------------------------------------------------

SubtaskStatus = Literal["open", "done", "failed"]
_CONSTRAINT = re.compile(
    r"(?i:\b(?:must(?:n't| not)?|don't|do not|never|always|please|prefer(?:ably)?|make sure|avoid|should(?:n't| not)?"
    r"|only use|no need to|stick to|keep using|without|i (?:want|need|like|prefer)|i'd (?:like|rather))\b)"
    r"|必须|不要|不能|禁止|务必|一定要|始终|总是|只能|只用|优先|尽量|避免|请|我喜欢|我希望|别"
)
# Where one sentence ends and the next begins (Western and CJK punctuation, line
# breaks); shared with the extractive compactor so both cut a message alike.
SENTENCE_BREAK = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])|\n+")
_NUMBERED = re.compile(r"^\s*(?:(\d{1,2})[.)]|step\s+(\d{1,2})\s*[:.)-]|第(\d{1,2})步[:：]?)\s*(.+)$", re.IGNORECASE)
_PLAN_CUE = re.compile(r"(?i)\b(?:plan|steps?|i will|i'll|let me|we need to|next|approach|todo)\b|计划|步骤|接下来|首先")
_TODO_TOOL = re.compile(r"(?i)^(?:write_?todos?|todo_?write|update_?todos?|todos?)$")
_TODO_STATUS: dict[str, SubtaskStatus] = {
    "completed": "done", "complete": "done", "done": "done", "finished": "done",
    "failed": "failed", "error": "failed", "blocked": "failed", "cancelled": "failed", "canceled": "failed",
}
GOAL_CHARS = 300
MAX_CONSTRAINTS = 20


@dataclass(frozen=True)
class Subtask:
    title: str
    status: SubtaskStatus
    evidence: tuple[str, ...]  # message ids
    source: str = "user"  # "todo", "plan" or "user"


@dataclass(frozen=True)
class WorkingMemory:
    goal: str
    constraints: list[str]
    subtasks: list[Subtask]

    def render(self) -> str:
        """A compact text form for a prompt or the dashboard."""
        marks = {"open": "[ ]", "done": "[x]", "failed": "[!]"}
        lines = [f"Goal: {self.goal or '(none)'}"]
        if self.constraints:
            lines.append("Constraints:")
            lines.extend(f"- {c}" for c in self.constraints)
        if self.subtasks:
            lines.append("Subtasks:")
            lines.extend(f"- {marks[s.status]} {s.title}" for s in self.subtasks)
        return "\n".join(lines)


def is_request(message: Message) -> bool:
    """A message a person wrote: user role, no tool results, not our own summary/recollection/meta."""
    if not message.is_user_turn or message.name in ("summary", "recollection"):
        return False
    meta = message.metadata
    if meta.get("layer") in ("summary", "recollection", "eviction") or meta.get("is_meta") or meta.get("compact_summary"):
        return False
    return bool(text_of(message).strip())


def text_of(message: Message) -> str:
    return "\n".join(b.text for b in message.content if isinstance(b, TextBlock))


def sentences(text: str) -> list[str]:
    return [one_line(s, 400) for s in SENTENCE_BREAK.split(text) if s and len(s.strip()) >= 3]


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().rstrip(".。;；!！").casefold()


def _todo_items(use: ToolUseBlock) -> list[tuple[str, SubtaskStatus, str]]:
    """(title, status, status as written) of each item of a todo-tool call."""
    todos = use.input.get("todos")
    out: list[tuple[str, SubtaskStatus, str]] = []
    if not isinstance(todos, list):
        return out
    for item in todos:
        if isinstance(item, str):
            out.append((one_line(item, 160), "open", ""))
        elif isinstance(item, dict):
            title = next((item[k] for k in ("content", "title", "task", "description", "text")
                          if isinstance(item.get(k), str) and item[k].strip()), None)
            if title:
                raw = str(item.get("status", "")).lower()
                out.append((one_line(title, 160), _TODO_STATUS.get(raw, "open"), raw))
    return out


def _plan_items(text: str) -> list[str]:
    items: list[str] = []
    expected = 1
    for line in text.split("\n"):
        match = _NUMBERED.match(line)
        if not match:
            continue
        number = int(next(g for g in match.groups()[:3] if g))
        if number == expected:
            items.append(one_line(re.sub(r"[*_`]+", "", match.group(4)), 160))
            expected += 1
        elif number == 1:  # a new list starts: the latest plan wins
            items, expected = [one_line(match.group(4), 160)], 2
    return items if len(items) >= 2 else []


def extract_working_memory(messages: Sequence[Message]) -> WorkingMemory:
    asks = [(i, m) for i, m in enumerate(messages) if is_request(m)]
    goal = one_line(text_of(asks[0][1]), GOAL_CHARS) if asks else ""
    constraints: dict[str, str] = {}
    for _, msg in asks:
        for sentence in sentences(text_of(msg)):
            if len(sentence) <= 300 and _CONSTRAINT.search(sentence):
                constraints.pop(_norm(sentence), None)  # a restated constraint counts as recent
                constraints[_norm(sentence)] = sentence
    subtasks: list[Subtask] = []
    todo_evidence: dict[str, list[str]] = {}
    latest_todos: list[tuple[str, SubtaskStatus]] = []
    plan: tuple[list[str], str] | None = None
    for msg in messages:
        if msg.role != "assistant":
            continue
        for use in msg.tool_uses:
            if _TODO_TOOL.match(use.name):
                items = _todo_items(use)
                if items:
                    latest_todos = [(t, st) for t, st, _ in items]
                    for title, _, _ in items:
                        todo_evidence.setdefault(_norm(title), []).append(msg.id)
        text = text_of(msg)
        if text and (msg.tool_uses or _PLAN_CUE.search(text)):
            steps = _plan_items(text)
            if steps:
                plan = (steps, msg.id)
    if latest_todos:
        subtasks.extend(Subtask(t, s, tuple(dict.fromkeys(todo_evidence.get(_norm(t), []))), "todo")
                        for t, s in latest_todos)
    elif plan is not None:
        subtasks.extend(Subtask(t, "open", (plan[1],), "plan") for t in plan[0])
    subtasks.extend(_ask_subtasks(messages, asks))
    return WorkingMemory(goal=goal, constraints=list(constraints.values())[-MAX_CONSTRAINTS:], subtasks=subtasks)


def _ask_subtasks(messages: Sequence[Message], asks: list[tuple[int, Message]]) -> list[Subtask]:
    """One subtask per user ask: done when its turn ended with a plain assistant
    answer, failed when it ended on a failed tool call, else open."""
    out: list[Subtask] = []
    results = _results_by_call(messages)
    for n, (start, ask) in enumerate(asks):
        end = asks[n + 1][0] if n + 1 < len(asks) else len(messages)
        evidence = [ask.id]
        status: SubtaskStatus = "open"
        last_ok: bool | None = None
        concluded: str | None = None
        for msg in messages[start + 1 : end]:
            if msg.role != "assistant":
                continue
            if msg.tool_uses:
                concluded = None
                for use in msg.tool_uses:
                    last_ok = call_outcome(use, results.get(use.id)).ok
            elif text_of(msg).strip():
                concluded = msg.id
        if concluded is not None:
            status = "done"
            evidence.append(concluded)
        elif last_ok is False:
            status = "failed"
        out.append(Subtask(one_line(text_of(ask), 120), status, tuple(evidence), "user"))
    return out


# -- operation history ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    index: int
    call_id: str
    name: str
    arguments: str
    message_id: str  # the assistant message holding the call
    result_message_id: str | None
    ok: bool | None
    error: str | None = None
    exit_code: int | None = None
    duration_ms: float | None = None
    subtask: str | None = None

    @property
    def status(self) -> str:
        return "ok" if self.ok else ("pending" if self.ok is None else "failed")


def _results_by_call(messages: Iterable[Message]) -> dict[str, ToolResultBlock]:
    return {b.id: b for m in messages for b in m.tool_results}


def _parse_time(value: str) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass
class OperationHistory:
    operations: list[Operation] = field(default_factory=list)

    @classmethod
    def from_messages(cls, messages: Sequence[Message]) -> OperationHistory:
        """Every tool call in order; each attributed to the todo item in progress
        at the time (todo-tool sessions) or to the user ask of its turn."""
        result_msgs: dict[str, Message] = {}
        for msg in messages:
            for block in msg.tool_results:
                result_msgs.setdefault(block.id, msg)
        results = _results_by_call(messages)
        ops: list[Operation] = []
        current_ask: str | None = None
        in_progress: str | None = None
        for msg in messages:
            if is_request(msg):
                current_ask = one_line(text_of(msg), 120)
            if msg.role != "assistant":
                continue
            for use in msg.tool_uses:
                if _TODO_TOOL.match(use.name) and _todo_items(use):
                    # The item marked in progress owns the calls that follow.
                    in_progress = next((t for t, _, raw in _todo_items(use) if raw == "in_progress"), None)
                result = results.get(use.id)
                outcome = call_outcome(use, result)
                owner = result_msgs.get(use.id)
                ops.append(Operation(
                    index=len(ops), call_id=use.id, name=use.name, arguments=describe_call(use),
                    message_id=msg.id, result_message_id=owner.id if owner else None, ok=outcome.ok,
                    error=outcome.error, exit_code=outcome.exit_code, duration_ms=_duration(msg, owner),
                    subtask=in_progress or current_ask,
                ))
        return cls(ops)

    def failures(self) -> list[Operation]:
        return [op for op in self.operations if op.ok is False]

    def by_subtask(self, title: str) -> list[Operation]:
        return [op for op in self.operations if op.subtask == title]

    def render(self, last: int = 10) -> str:
        return "\n".join(
            f"[{op.index}] {op.name} {op.arguments} -> {op.status}" + (f" ({op.error})" if op.error else "")
            for op in self.operations[-last:]
        )


def _duration(call_msg: Message, result_msg: Message | None) -> float | None:
    # Importers that had no timestamps mark them as inferred: a difference of
    # two invented times is not a duration.
    if result_msg is None or call_msg.metadata.get("timestamp_inferred") or result_msg.metadata.get("timestamp_inferred"):
        return None
    start, end = _parse_time(call_msg.timestamp), _parse_time(result_msg.timestamp)
    if start is None or end is None or end < start:
        return None
    return (end - start).total_seconds() * 1000.0


# -- file-state tracking ---------------------------------------------------------------------------

FileEventKind = Literal["read", "write"]
_READ_TOOLS = re.compile(r"(?i)^(?:read|read_?file|file_?read|view(?:_file)?|open(?:_file)?|notebook_?read|cat)$")
_WRITE_TOOLS = re.compile(
    r"(?i)^(?:write|write_?file|file_?write|edit|multi_?edit|edit_?file|str_replace|create(?:_file)?|insert"
    r"|append(?:_?file)?|notebook_?edit|apply_?patch|replace(?:_in_file)?)$"
)
_EDITOR_TOOL = re.compile(r"(?i)^(?:str_replace_editor|str_replace_based_edit_tool|text_editor|editor)$")
_OPEN_FILE = re.compile(r"\(Open file: ([^)\n]+)\)")
_CURRENT_DIR = re.compile(r"\(Current directory: ([^)\n]+)\)")
_SHELL_READERS = {"cat", "head", "tail", "less", "more", "nl", "bat"}
_SHELL_WRITERS = {"touch", "rm", "tee"}
_REDIRECTS = {">", ">>", "&>", ">|", "&>>", "1>", "1>>"}
_SEPARATORS = {"&&", "||", ";", "|", "&", "\n", ";;", "|&"}


@dataclass(frozen=True)
class FileEvent:
    kind: FileEventKind
    path: str
    tool: str
    call_id: str
    message_id: str  # the assistant message holding the call
    result_message_id: str | None
    position: int  # index of the call's message
    result_position: int | None
    ok: bool | None


@dataclass(frozen=True)
class StaleRead:
    read_message_id: str  # the message holding the (now outdated) read result
    path: str
    written_by_message_id: str  # the assistant message whose call wrote the file afterwards
    read_tool: str = ""
    write_tool: str = ""


def _resolve(path: str, cwd: str | None) -> str:
    path = path.strip().strip("'\"")
    if cwd and not path.startswith(("/", "~")):
        path = posixpath.join(cwd, path)
    return posixpath.normpath(path) if path else path


def same_file(a: str, b: str) -> bool:
    """Equal paths, or a relative path that names the tail of an absolute one."""
    if a == b:
        return True
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return not short.startswith("/") and long_.endswith("/" + short)


def _shell_tokens(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: fall back to plain splitting
        return command.split()


def shell_file_events(command: str, cwd: str | None) -> tuple[list[tuple[FileEventKind, str]], str | None]:
    """Reads and writes a shell command makes (cat/head/tail, sed -i, redirects,
    tee, touch, rm), and the working directory after its ``cd``s."""
    events: list[tuple[FileEventKind, str]] = []
    segment: list[str] = []

    def flush() -> None:
        nonlocal cwd
        if not segment:
            return
        words = list(segment)
        segment.clear()
        # Redirect targets first: `cat a > b` reads a and writes b.
        plain: list[str] = []
        skip = False
        for i, word in enumerate(words):
            if skip:
                skip = False
                continue
            if word in _REDIRECTS and i + 1 < len(words):
                target = words[i + 1]
                if not target.startswith(("&", "/dev/")):
                    events.append(("write", _resolve(target, cwd)))
                skip = True
            elif word in ("<<", "<<-", "<<<", "<", "2>", "2>>") and i + 1 < len(words):
                skip = True
            elif not (word.isdigit() and i + 1 < len(words) and words[i + 1] in _REDIRECTS):
                plain.append(word)
        while plain and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", plain[0]):
            plain.pop(0)  # VAR=value before the program
        if plain and plain[0] in ("sudo", "env", "time", "nohup", "export"):
            if plain[0] == "export":
                return
            plain.pop(0)
        if not plain:
            return
        program, args = posixpath.basename(plain[0]), plain[1:]
        if program == "cd":
            where = next((a for a in args if not a.startswith("-")), None)
            if where:
                cwd = _resolve(where, cwd)
            return
        operands = [a for a in args if not a.startswith("-")]
        if program in _SHELL_READERS:
            values = {"-n", "-c", "--lines", "--bytes"}
            keep = [a for j, a in enumerate(args) if not a.startswith("-") and not (j and args[j - 1] in values)]
            events.extend(("read", _resolve(a, cwd)) for a in keep)
        elif program == "sed":
            in_place = any(a == "-i" or a.startswith(("-i", "--in-place")) for a in args)
            has_script_flag = "-e" in args or "-f" in args
            files = operands if has_script_flag else operands[1:]
            kind: FileEventKind = "write" if in_place else "read"
            events.extend((kind, _resolve(a, cwd)) for a in files)
        elif program in _SHELL_WRITERS:
            events.extend(("write", _resolve(a, cwd)) for a in operands)
        elif program in ("mv", "cp") and len(operands) >= 2:
            events.append(("write", _resolve(operands[-1], cwd)))
            if program == "mv":
                events.extend(("write", _resolve(a, cwd)) for a in operands[:-1])

    for token in _shell_tokens(command):
        if token in _SEPARATORS:
            flush()
        else:
            segment.append(token)
    flush()
    return events, cwd


@dataclass
class FileTracker:
    """Reads and writes by path, in session order."""

    events: list[FileEvent] = field(default_factory=list)

    @classmethod
    def from_messages(cls, messages: Sequence[Message]) -> FileTracker:
        results: dict[str, tuple[int, Message, ToolResultBlock]] = {}
        for index, msg in enumerate(messages):
            for block in msg.tool_results:
                results.setdefault(block.id, (index, msg, block))
        tracker = cls()
        cwd: str | None = None
        open_file: str | None = None
        for index, msg in enumerate(messages):
            if msg.role != "assistant":
                continue
            for use in msg.tool_uses:
                found = results.get(use.id)
                result = found[2] if found else None
                outcome = call_outcome(use, result)
                found_events, cwd, opened = call_file_events(use, cwd, open_file)
                if opened is not None:
                    open_file = opened
                for kind, path in found_events:
                    tracker.events.append(FileEvent(
                        kind=kind, path=path, tool=use.name, call_id=use.id, message_id=msg.id,
                        result_message_id=found[1].id if found else None, position=index,
                        result_position=found[0] if found else None, ok=outcome.ok))
                if result is not None:
                    # SWE-agent style observations end with the open file and the
                    # shell's directory: later `edit` calls act on that file.
                    text = result.output_text()[-600:]
                    opened_match = _OPEN_FILE.findall(text)
                    if opened_match and opened_match[-1].strip() != "n/a":
                        open_file = _resolve(opened_match[-1], cwd)
                    dir_match = _CURRENT_DIR.findall(text)
                    if dir_match:
                        cwd = dir_match[-1].strip()
        return tracker

    def reads(self) -> list[FileEvent]:
        return [e for e in self.events if e.kind == "read"]

    def writes(self) -> list[FileEvent]:
        return [e for e in self.events if e.kind == "write"]

    def stale_reads(self) -> list[StaleRead]:
        """Reads whose file a successful call wrote after the model saw the read's result."""
        stale: list[StaleRead] = []
        writes = [w for w in self.writes() if w.ok]
        for read in self.reads():
            if read.ok is not True or read.result_message_id is None or read.result_position is None:
                continue
            later = next((w for w in writes if w.position > read.result_position and same_file(read.path, w.path)), None)
            if later is not None:
                stale.append(StaleRead(read.result_message_id, read.path, later.message_id, read.tool, later.tool))
        return stale


@dataclass
class LiveFileTracker:
    """The file tracker fed one tool result at a time, as a session runs.

    ``observe`` returns the reads that the call just made stale: a read whose
    file a later successful call wrote. Each read is reported once. The state
    is plain data so a session can store and restore it.
    """

    cwd: str | None = None
    open_file: str | None = None
    # path -> [(message id of the read result, tool name)]
    reads: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def observe(self, use: ToolUseBlock, call_message_id: str, result: ToolResultBlock,
                result_message_id: str) -> list[StaleRead]:
        outcome = call_outcome(use, result)
        events, self.cwd, opened = call_file_events(use, self.cwd, self.open_file)
        if opened is not None:
            self.open_file = opened
        stale: list[StaleRead] = []
        if outcome.ok:
            for kind, path in events:
                if kind == "read":
                    self.reads.setdefault(path, []).append((result_message_id, use.name))
                    continue
                for read_path in [p for p in self.reads if same_file(p, path)]:
                    for read_id, read_tool in self.reads.pop(read_path):
                        if read_id != result_message_id:
                            stale.append(StaleRead(read_id, read_path, call_message_id, read_tool, use.name))
        text = result.output_text()[-600:]
        opened_match = _OPEN_FILE.findall(text)
        if opened_match and opened_match[-1].strip() != "n/a":
            self.open_file = _resolve(opened_match[-1], self.cwd)
        dir_match = _CURRENT_DIR.findall(text)
        if dir_match:
            self.cwd = dir_match[-1].strip()
        return stale

    def to_dict(self) -> dict[str, Any]:
        return {"cwd": self.cwd, "open_file": self.open_file,
                "reads": {k: [list(item) for item in v] for k, v in self.reads.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LiveFileTracker:
        return cls(cwd=data.get("cwd"), open_file=data.get("open_file"),
                   reads={k: [(str(a), str(b)) for a, b in v] for k, v in (data.get("reads") or {}).items()})


def call_file_events(
    use: ToolUseBlock, cwd: str | None, open_file: str | None
) -> tuple[list[tuple[FileEventKind, str]], str | None, str | None]:
    """(events, new cwd, newly opened file) for one call, given the shell's
    directory and the editor's open file before it."""
    args = use.input
    path_value = next((args[k] for k in _PATH_KEYS if isinstance(args.get(k), str) and args[k].strip()), None)
    path = _resolve(path_value, cwd) if path_value else None
    name = use.name
    if _EDITOR_TOOL.match(name):
        command = args.get("command")
        if path and command == "view":
            return [("read", path)], cwd, None
        if path and command in _EDITOR_COMMANDS:
            return [("write", path)], cwd, None
        return [], cwd, None
    if _READ_TOOLS.match(name):
        return ([("read", path)] if path else []), cwd, (path if name.lower() in ("open", "open_file") else None)
    if _WRITE_TOOLS.match(name):
        # SWE-agent's edit/insert act on the open file and name no path.
        target = path or open_file
        opened = path if name.lower() in ("create", "create_file") else None
        return ([("write", target)] if target else []), cwd, opened
    command = args.get("command") or args.get("cmd")
    if isinstance(command, str) and is_command_tool(name):
        events, new_cwd = shell_file_events(command, cwd)
        return events, new_cwd, None
    return [], cwd, None


def stale_reads(messages: Sequence[Message]) -> list[StaleRead]:
    return FileTracker.from_messages(messages).stale_reads()
