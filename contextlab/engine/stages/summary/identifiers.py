"""Identifiers of a conversation, and a check that a summary keeps them.

A summary is only as useful as the names it keeps: the file that was edited,
the command that reproduced the bug, the function that was renamed, the error
that came back, the timeout that was chosen. ``extract_identifiers`` finds
them mechanically so that any summary (the extractive one, an LLM's) can be
checked, and ``keep_identifiers`` makes sure none is lost silently.

What counts, and where it is looked for (the definition the fidelity
benchmark measures against):

* **Where**: the text people wrote (user messages, assistant text) and the
  tool-call arguments of the messages. Tool *output* is not searched: it is
  the environment talking, and it stays in the archive verbatim. Tool-call
  arguments longer than ``MAX_ARGUMENT_CHARS`` or spanning several lines
  (file contents, edit hunks) are left out for the same reason: counting
  every word of a written file would measure how much code a summary
  copies, not whether it kept the names that matter.
* **path**: a path with a directory part (``lib/app/models.py``,
  ``./run.sh``, ``~/.config/x``), a bare file name with a known extension
  (``mix.exs``), or the value of a path argument (``file_path``, ``path``...).
* **command**: the value of a command argument (``command``, ``cmd``,
  ``script``), or a backticked span that starts with a command-line tool
  (``git``, ``pytest``, ``mix``...). Only its first line counts, with
  whitespace collapsed and at most ``MAX_COMMAND_CHARS`` characters (a long
  heredoc is named by its first line).
* **symbol**: function, class and module names: a backticked span that is a
  name (``sync_session/2``, ``Foo.Bar``, ``run()``); in prose, CamelCase
  names with two humps or more, snake_case names, dotted module names
  (``Spotter.Telemetry``) and calls (``setup()``).
* **error**: names ending in Error, Exception or Failure (``KeyError``).
* **number**: numbers with a unit (``30 s``, ``250 ms``, ``4 GB``, ``12%``,
  ``8000 tokens``), and bare numbers of three digits or more (``4711``,
  ``12,800``, ``0.25`` counts too: a decimal).
* **url**, **email**: as written.
* **hash**: hexadecimal runs of 7 to 64 digits mixing digits and letters
  (commit ids, digests).
* **version**: ``v1.2``, ``1.2.3``, ``2.0.0-rc1``.
* **code**: a token of letters and digits mixed (``ZZ9PLZ``, ``t10``,
  ``W2378156``, ``INC-4242``): booking codes, ticket and order ids.
* **quoted**: a short name in quotes (``"Project Falcon"``, ``'blue-green'``).
* **token**: any other whitespace-separated word (its surrounding punctuation
  and terminal colours stripped) with a letter and a digit, a ``/``, ``_``,
  ``@``, ``=``, an inner ``.`` or ``:``, or an inner capital (``try/rescue``,
  ``ash.uuid.generate``, ``--priority=2``, ``iPhone``): the rest of what a
  user could search for.

This is the one definition of "identifier" of ContextLab: the summary index
(``INDEX_FILE``), the loss check of every summary version and the search's
verdict on a compacted message all use it (``text_identifiers``,
``message_identifiers``, ``mentions``), so they cannot disagree. ContextLab's
own file names (the index itself, offloaded ``tool_result/`` files, the
dialog archive) are never a user's identifier (``is_internal``).

A value found under two kinds counts once, under the first (in the order
above). An identifier is *kept* by a text when the text contains it
verbatim, whitespace collapsed; ``base_name_kept`` is the looser measure
that also accepts a path's last part.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from contextlab.engine.core.messages import MediaBlock, Message, TextBlock, ThinkingBlock, ToolUseBlock

KINDS: tuple[str, ...] = ("path", "command", "symbol", "error", "url", "email", "hash", "version", "code",
                          "quoted", "number", "token")
MAX_ARGUMENT_CHARS = 200
MAX_COMMAND_CHARS = 80
# Where the full list of each compaction's identifiers is written (workspace-relative).
INDEX_FILE = "dialog/identifiers.md"
# How much of the summary the appended identifier line may take, at most.
DEFAULT_LINE_CHARS = 1_500

_PATH_ARGS = frozenset({"file_path", "path", "filepath", "filename", "file", "target_file", "notebook_path",
                        "dir", "directory", "cwd"})
_COMMAND_ARGS = frozenset({"command", "cmd", "script"})
# First words of a command line: a backticked span starting with one is a command.
_TOOL_NAMES = (
    "git gh mix iex elixir erl npm npx pnpm yarn node deno bun pip pip3 python python3 pytest uv poetry ruff mypy "
    "black isort tox make cmake cargo rustc go gradle mvn java javac dotnet ls cd cat grep rg sed awk find head "
    "tail wc sort diff patch curl wget docker docker-compose kubectl helm terraform bash sh zsh chmod chown mkdir "
    "rm cp mv touch ln echo export source ps kill bd bundle rails rake ruby gem php composer swift xcodebuild "
    "psql mysql sqlite3 redis-cli ponyc corral ssh scp tar unzip jq sudo apt apt-get brew systemctl journalctl "
    "django-admin manage.py ./manage.py celery daphne uvicorn gunicorn"
)
_TOOLS = frozenset(_TOOL_NAMES.split())

_URL = re.compile(r"https?://[^\s<>\"'`)\]}，。]+")
_CODE_SPAN = re.compile(r"``\s?(.+?)\s?``|`([^`\n]+)`")
_PATH = re.compile(r"(?<![\w/.:@-])(?:~|\.{1,2})?/?(?:[\w.@+-]+/)+[\w.@+-]+")
_FILE_EXT = re.compile(
    r"(?<![\w/.-])[\w@+-][\w.@+-]*\.(?:py|pyi|js|mjs|ts|tsx|jsx|json|jsonl|md|rst|txt|toml|yaml|yml|cfg|ini"
    r"|sh|go|rs|java|kt|c|h|cc|cpp|hpp|rb|php|html|css|scss|sql|lock|log|csv|xml|env|ipynb|ex|exs|heex|eex"
    r"|pony|lua|swift|vue|svelte|dart|scala|clj|hs|ml|zig|nim|tf|proto|gradle|dockerfile)\b"
)
_ERROR = re.compile(r"\b[A-Z][A-Za-z0-9]*(?:Error|Exception|Failure)\b")
_NAME_SPAN = re.compile(r"[A-Za-z_][\w?!]*(?:(?:\.|::|#)[A-Za-z_][\w?!]*)*(?:/\d+|\(\))?")
_CAMEL = re.compile(r"(?<![\w.])[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b")
_SNAKE = re.compile(r"(?<![\w.-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?:/\d+|\(\))?(?![\w-])")
_DOTTED = re.compile(r"(?<![\w.])[A-Z]\w*(?:\.[A-Z]\w*)+\b")
_CALL = re.compile(r"(?<![\w.])[A-Za-z_]\w*\(\)")
_NUMBER = re.compile(
    r"(?<![\w.])\d+(?:[.,]\d+)*\s?(?:ms|µs|us|ns|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?|days?|weeks?"
    r"|KB|KiB|MB|MiB|GB|GiB|TB|kB|B|bytes?|tokens?|px|rem|em|rps|qps|req/s|k|K|M)\b"
    r"|(?<![\w.])\d+(?:\.\d+)?%"
    r"|\d+(?:\.\d+)?\s?(?:毫秒|秒|分钟|小时|天|周|字节)"
)
_BARE_NUMBER = re.compile(r"(?<![\w.,/:-])(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d{3,})(?![\w/:-]|[.,]\d)")
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_HASH = re.compile(r"(?<![\w-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,64}(?![\w-])")
_VERSION = re.compile(r"(?<![\w.-])(?:v\d+(?:\.\d+)*|\d+(?:\.\d+){2,})(?:-[0-9A-Za-z]+(?:\.[0-9A-Za-z]+)*)?(?![\w-]|\.\w)")
# Letters and digits mixed in one token (a hyphen may join parts): booking codes, ticket ids.
_CODE = re.compile(r"(?<![\w./@-])(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*(?![\w/@]|[-.]\w)")
_SCREAMING = re.compile(r"(?<![\w.])[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")
_QUOTED = re.compile(r'"([^"\n]{2,80})"|\u201c([^\u201d\n]{2,80})\u201d|(?<!\w)\'([^\'\n]{2,60})\'(?!\w)')
_TRAILING = ".,;:!?)]}'\""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_TOKEN_EDGE = "\"'`()[]{}<>,;:.!?*#|~"
_TOKEN_LIKE = re.compile(r"(?=.*[A-Za-z])(?:.*\d|.*[/_@=]|.*\w[.:]\w|.*[a-z][A-Z])")
_SPACE = re.compile(r"\s+")
# ContextLab's own files: the index, offloaded tool outputs, the dialog archive. They are
# named in summaries and notices for the model's sake and are never a user's identifier.
_INTERNAL = re.compile(r"^(?:\./)?(?:dialog/identifiers\.md|dialog/[\w.-]+\.jsonl|tool_result/[\w.-]+)$")


@dataclass(frozen=True, slots=True)
class Identifier:
    kind: str  # one of KINDS
    value: str


def _one_line(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def _command(text: str) -> str:
    first = _one_line(text.strip().split("\n", 1)[0])
    if len(first) <= MAX_COMMAND_CHARS:
        return first
    cut = first[:MAX_COMMAND_CHARS]
    space = cut.rfind(" ")
    return cut[:space] if space > MAX_COMMAND_CHARS // 2 else cut


def _is_command(span: str) -> bool:
    first = span.split(None, 1)[0] if span.split() else ""
    return first in _TOOLS or first.startswith("./") and " " in span


def _paths(text: str) -> Iterable[Identifier]:
    for match in _PATH.finditer(text):
        path = match.group(0).rstrip(".,;:")
        last = path.rsplit("/", 1)[-1]
        if re.fullmatch(r"[\d/.:-]+", path):
            continue  # a date or a fraction
        if "." in last.strip(".") or path.count("/") >= 2 or path.startswith(("/", "./", "../", "~/")):
            yield Identifier("path", path)
    for match in _FILE_EXT.finditer(text):
        yield Identifier("path", match.group(0))


def _span_kind(span: str) -> str | None:
    if _is_command(span):
        return "command"
    if _ERROR.fullmatch(span):
        return "error"
    if _NAME_SPAN.fullmatch(span) and not _NUMBER.fullmatch(span) and len(span) >= 3:
        return "symbol"
    return None


def _from_text(text: str) -> Iterable[Identifier]:
    """Identifiers in prose: code spans first (their kind is clearest), then the rest.

    A classified span is not searched again, and paths are taken out before
    names are looked for, so a part of one identifier (``Foo.Bar`` of
    ``Foo.Bar.baz/2``, ``app_test`` of ``test/app_test.exs``) is not a second one.
    """
    original = text
    urls = [match.group(0).rstrip(_TRAILING) for match in _URL.finditer(text)]
    text = _URL.sub(" ", text)
    emails = [match.group(0).rstrip(_TRAILING) for match in _EMAIL.finditer(text)]
    text = _EMAIL.sub(" ", text)
    quoted = [(m.group(1) or m.group(2) or m.group(3) or "").strip() for m in _QUOTED.finditer(text)]

    def span(match: re.Match[str]) -> str:
        value = (match.group(1) or match.group(2) or "").strip()
        kind = _span_kind(value) if 0 < len(value) <= 200 else None
        if kind is None:
            return f" {value} "
        found.append(Identifier(kind, _command(value) if kind == "command" else value))
        return " "

    found: list[Identifier] = []
    rest = _CODE_SPAN.sub(span, text)
    yield from found
    paths = list(_paths(rest))
    yield from paths
    for match in _ERROR.finditer(rest):
        yield Identifier("error", match.group(0))
    names = _PATH.sub(" ", _FILE_EXT.sub(" ", rest))
    for pattern in (_DOTTED, _CAMEL, _SNAKE, _SCREAMING, _CALL):
        for match in pattern.finditer(names):
            yield Identifier("symbol", match.group(0))
    yield from (Identifier("url", url) for url in urls)
    yield from (Identifier("email", email) for email in emails)
    for kind, pattern in (("hash", _HASH), ("version", _VERSION), ("code", _CODE)):
        for match in pattern.finditer(names):
            # Two characters ("q0", "A1") name nothing one would search for again.
            if len(match.group(0)) >= 3:
                yield Identifier(kind, match.group(0))
    yield from (Identifier("quoted", value) for value in quoted if value.strip(_TRAILING + " "))
    for match in _NUMBER.finditer(rest):
        yield Identifier("number", match.group(0))
    for match in _BARE_NUMBER.finditer(_NUMBER.sub(" ", names)):
        yield Identifier("number", match.group(0))
    for word in _ANSI.sub(" ", original).split():
        token = word.strip(_TOKEN_EDGE)
        if 3 <= len(token) <= 200 and _TOKEN_LIKE.match(token):
            yield Identifier("token", token)


def _from_call(use: ToolUseBlock, skipped: dict[str, int]) -> Iterable[Identifier]:
    for key, value in use.input.items():
        if isinstance(value, list) and key in _COMMAND_ARGS and all(isinstance(v, str) for v in value):
            value = " ".join(value)
        if not isinstance(value, str) or not value.strip():
            continue
        if key in _COMMAND_ARGS:
            yield Identifier("command", _command(value))
        elif len(value) > MAX_ARGUMENT_CHARS or "\n" in value.strip():
            skipped["long tool-call argument"] = skipped.get("long tool-call argument", 0) + 1
            continue  # file contents, edit hunks: see the module docstring
        elif key in _PATH_ARGS and len(value.strip()) >= 2:
            yield Identifier("path", value.strip())
        else:
            yield from _from_text(value)


def is_internal(value: str) -> bool:
    """ContextLab's own file names, which summaries and notices mention for the model."""
    return bool(_INTERNAL.match(value.strip()))


def _unique(items: Iterable[Identifier], found: dict[str, Identifier]) -> None:
    for item in items:
        value = item.value.strip()
        if len(value) >= 2 and value not in found and not is_internal(value):
            found[value] = Identifier(item.kind, value)


def text_identifiers(text: str) -> list[Identifier]:
    """The identifiers of one piece of prose, in order of first appearance, each value once."""
    found: dict[str, Identifier] = {}
    _unique(_from_text(text), found)
    return list(found.values())


# What ``message_identifiers`` leaves out, by what it is (the loss check reports these as unchecked).
TOOL_OUTPUT = "tool output"
MEDIA = "image or other media"
THINKING = "assistant thinking"


def message_identifiers(message: Message, skipped: dict[str, int] | None = None) -> list[Identifier]:
    """The identifiers one message contributes (see the module docstring for where they are looked for).

    ``skipped`` counts what was not searched: tool outputs, long tool-call
    arguments, media blocks; a repaired placeholder or a system message counts nowhere.
    """
    skipped = {} if skipped is None else skipped
    found: dict[str, Identifier] = {}
    if message.is_repair or message.role == "system":
        return []
    if message.is_tool_result:
        skipped[TOOL_OUTPUT] = skipped.get(TOOL_OUTPUT, 0) + 1
        return []
    for block in message.content:
        if isinstance(block, TextBlock):
            _unique(_from_text(block.text), found)
        elif isinstance(block, ToolUseBlock):
            _unique(_from_call(block, skipped), found)
        elif isinstance(block, MediaBlock):
            skipped[MEDIA] = skipped.get(MEDIA, 0) + 1
        elif isinstance(block, ThinkingBlock):
            skipped[THINKING] = skipped.get(THINKING, 0) + 1
    return list(found.values())


def extract_identifiers(messages: Sequence[Message]) -> list[Identifier]:
    """The identifiers of ``messages`` in order of first appearance, each value once."""
    found: dict[str, Identifier] = {}
    for message in messages:
        _unique(message_identifiers(message), found)
    return list(found.values())


_GROUPING = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def fold(text: str) -> str:
    """The form ``mentions`` compares in: whitespace collapsed, case folded, and digit
    grouping dropped (``12,800`` and ``12800`` are one number)."""
    return _GROUPING.sub("", normalize(text).casefold())


def mentions(value: str, text: str, *, folded: bool = False) -> bool:
    """Whether ``text`` names ``value``, compared ``fold``-ed (case, whitespace and digit
    grouping aside). ``folded``: ``text`` is already folded (many values looked up in one text).

    The test the loss check and the search both make, so their verdicts agree.
    """
    return fold(value) in (text if folded else fold(text))


def normalize(text: str) -> str:
    """The form texts are compared in: whitespace collapsed."""
    return _one_line(text)


def is_kept(identifier: Identifier, normalized_text: str) -> bool:
    return identifier.value in normalized_text


def base_name_kept(identifier: Identifier, normalized_text: str) -> bool:
    """Kept, or (for a path) its last part is named."""
    if identifier.value in normalized_text:
        return True
    if identifier.kind == "path":
        base = identifier.value.rstrip("/").rsplit("/", 1)[-1]
        return len(base) >= 3 and base in normalized_text
    return False


# -- the post-check ---------------------------------------------------------------------------------

_LABELS: dict[str, dict[str, str]] = {
    "en": {"lead": "Identifiers from the compacted messages", "all": "all listed in",
           "path": "paths", "command": "commands", "symbol": "names", "error": "errors", "number": "numbers",
           "url": "URLs", "email": "emails", "hash": "hashes", "version": "versions", "code": "codes",
           "quoted": "quoted names", "token": "other", "more": "{n} more"},
    "zh": {"lead": "被压缩消息中的标识符", "all": "完整列表见",
           "path": "路径", "command": "命令", "symbol": "名称", "error": "错误", "number": "数值",
           "url": "网址", "email": "邮箱", "hash": "哈希", "version": "版本", "code": "编号",
           "quoted": "引用名称", "token": "其他", "more": "另有 {n} 个"},
}


# How the appended line starts, in every language: a compactor that merges a
# previous summary drops these lines (the index holds their identifiers).
LINE_LEADS: tuple[str, ...] = tuple(labels["lead"] for labels in _LABELS.values())


def line_chars_for_window(max_input_length: int) -> int:
    """The identifier line's budget for a context window: a tenth of it in
    characters (about 2.5 % of its tokens), between 800 and 6,000."""
    return min(6_000, max(800, max_input_length // 10))


def _code(value: str) -> str:
    return f"`{value}`" if "`" not in value else f"`` {value} ``"


@dataclass(frozen=True, slots=True)
class IdentifierCheck:
    """What ``keep_identifiers`` found and did."""

    summary: str
    total: int  # identifiers in the compacted messages
    in_summary: int  # kept by the summary as the compactor wrote it
    appended: int  # added to the summary by the post-check
    indexed: int  # written to the index file (all of them, when any was missing)
    index_entry: str | None  # the text appended to the index file

    @property
    def missing_after(self) -> int:
        """Neither in the summary nor in the index it names (0 whenever the index was written)."""
        return 0 if self.index_entry else self.total - self.in_summary - self.appended


def keep_identifiers(
    summary: str,
    messages: Sequence[Message],
    *,
    version: int,
    language: str = "en",
    line_chars: int = DEFAULT_LINE_CHARS,
) -> IdentifierCheck:
    """Make sure no identifier of ``messages`` is lost by ``summary`` silently.

    Identifiers the summary does not name are appended to its last section as
    one compact line (most specific kinds first, at most ``line_chars``
    characters); when any is still missing, the line names ``INDEX_FILE``,
    and ``index_entry`` holds the complete list of this span's identifiers
    for the caller to append there (the engine stays free of file writes in
    this function, so it can run on any summary, from any compactor).
    """
    identifiers = extract_identifiers(messages)
    text = normalize(summary)
    missing = [i for i in identifiers if not is_kept(i, text)]
    if not missing:
        return IdentifierCheck(summary, len(identifiers), len(identifiers), 0, 0, None)
    labels = _LABELS["zh" if language == "zh" else "en"]
    by_kind: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for item in missing:
        by_kind[item.kind].append(item.value)
    lead = f"- {labels['lead']} ({labels['all']} {INDEX_FILE}): "
    # Room for "; N more" is kept back, so the line never passes its budget.
    budget = max(0, line_chars - len(lead) - len("; " + labels["more"].format(n=len(missing))))
    parts: list[str] = []
    appended = 0
    for kind in ("code", "path", "url", "email", "symbol", "error", "hash", "version", "quoted", "command", "number", "token"):
        taken: list[str] = []
        for value in by_kind[kind]:
            piece = _code(value)
            cost = len(piece) + 2 + (len(labels[kind]) + 3 if not taken else 0)
            if cost > budget:
                continue
            taken.append(piece)
            budget -= cost
        if taken:
            parts.append(f"{labels[kind]} {', '.join(taken)}")
            appended += len(taken)
    left = len(missing) - appended
    line = lead + "; ".join(parts) + (("; " + labels["more"].format(n=left)) if left else "")
    entry_lines = [f"## Summary v{version}: {len(identifiers)} identifier(s) of {len(messages)} message(s)"]
    every: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for item in identifiers:
        every[item.kind].append(item.value)
    for kind in KINDS:
        if every[kind]:
            entry_lines.append(f"- {_LABELS['en'][kind]}: " + ", ".join(_code(v) for v in every[kind]))
    return IdentifierCheck(
        summary=summary.rstrip("\n") + "\n" + line + "\n",
        total=len(identifiers),
        in_summary=len(identifiers) - len(missing),
        appended=appended,
        indexed=len(identifiers),
        index_entry="\n".join(entry_lines) + "\n\n",
    )


def append_index(workspace: str | Path, entry: str) -> str:
    """Append one compaction's entry to the workspace's identifier index; returns its relative path."""
    path = Path(workspace) / INDEX_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(entry)
    return INDEX_FILE
