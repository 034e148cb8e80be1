"""CoPaw 1.0.2 / ReMe 0.3.1.8 context management, reproduced on purpose, quirks included.

This module is the core of the ``copaw`` policy. It re-implements, from the behaviour recorded in
``reference/copaw-reme-behaviour.md`` and checked against ``reme-vectors-shared.json`` (both
produced by running the real code), what ReMe's ``ToolResultCompactor``, ``truncate_text_output``,
``AsMsgHandler`` (token estimate, ``context_check``, ``format_msgs_to_str``) and CoPaw's
``MemoryCompactionHook`` do to an agent's context. Replaying a session through it shows a CoPaw user
exactly what their agent saw, byte for byte. The ``contextlab`` policy is where the flaws are fixed;
here they are features, and "fixing" one breaks the replay.

Messages are AgentScope ``Msg`` dicts: ``{"id", "name", "role", "content", "metadata",
"timestamp"}``, where ``content`` is a string or a list of blocks (``text``, ``thinking``,
``tool_use`` with ``id``/``name``/``input``/``raw_input``, ``tool_result`` with ``id``/``name``/
``output`` as a string or a list of blocks, ``image``/``audio``/``video``, ...).

The one deliberate difference from ReMe: nothing here mutates the caller's messages. ReMe rewrites
``block["output"]`` in place; :func:`compact_tool_results` returns new message dicts instead (the
values it did not change are shared with the input, so treat the result as read-only).

Quirks reproduced (numbers in brackets are the reference's sections):

* Tokens are ``int(utf8_bytes / divisor + 0.5)`` per block, summed; no per-message overhead, no
  tokenizer. JSON and log output is undercounted about 2x. [2.1]
* Truncation cuts raw UTF-8 bytes and decodes with ``errors="ignore"``: a character split by the
  cut is dropped silently, the cut is not moved to a line boundary, and the notice still claims
  ``max_bytes`` were covered. The notice follows the excerpt with no newline in between. [1.4]
* A single over-long last line (``start_line == total_lines``) is cut with no notice at all; the
  compactor has saved the full text to disk, but nothing points to it, and the next pass saves the
  remnant again as a new file. [1.4, 1.5]
* ``total_lines`` is ``count("\\n") + 1``, so a trailing newline adds an empty line the hint can
  point at; a cut with no newline in it hints ``start_line + 1`` and skips the unread tail of the
  line; an overshooting hint is clamped to ``total_lines``. [1.3, 1.4]
* A 100-byte slack applies before a first cut and before a re-cut, so re-truncating to a larger
  limit is a no-op. Re-truncation rewrites only "covers the next N bytes" and "start_line=N" by
  regex (no clamp); total lines, start line and file path stay. [1.3, 1.5]
* The trailing run of tool-result messages is always "recent", whatever ``recent_n`` is; the only
  name-based exemption is ``read_file`` whose ``raw_input`` contains ".md" (a substring test). [1.2]
* ``context_check`` compacts when ``total == threshold`` (strict ``<`` to keep all), stops at the
  first message that does not fit (no skipping), pulls a result's ``tool_use`` message in but never
  the reverse, so the kept set can be non-contiguous and mis-aligned; a message larger than the
  reserve at the tail compacts everything with ``is_valid`` True. A tool_use message needed by
  several results of one message is charged once per result. [2.4]
* ``threshold <= reserve`` means nothing is ever compacted (ReMe's caught assertion). [2.3]
* The summariser sees messages newest first up to a token cap, each block flattened and cut to
  1000 characters, tool output only up to the marker; a summary is "valid" if it contains "##". [3]
* CoPaw's fallback on an invalid split keeps the last 3 messages (fewer until tool ids align),
  ignoring the token budget. [2.5]
* The summary goes back into the prompt as a user message with no newline between the summary and
  the closing sentence. Dialog archive dates come from the local-time timestamp. [4]
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, TypeAlias
from uuid import uuid4

logger = logging.getLogger(__name__)

# An AgentScope Msg as a dict (not the dataclass contextlab.engine.core.messages.Message).
AgentScopeMsg: TypeAlias = Mapping[str, Any]

TRUNCATION_MARKER = "<<<TRUNCATED>>>"
# ReMe's file_utils.DEFAULT_MAX_BYTES (50 KiB); CoPaw configures 50 000 and passes it explicitly.
DEFAULT_MAX_BYTES = 51200
# Both the compactor and the re-truncation leave outputs alone when they are at most this much over.
SLACK_BYTES = 100
DEFAULT_DIVISOR = 3.75
# count_str_token's fallback, used when the counter returns 0, divides by 3.75 whatever divisor the
# counter was configured with.
_FALLBACK_DIVISOR = 3.75
MEDIA_TOKENS_WHEN_EMPTY = 10
FORMATTER_MAX_CHARS = 1000
_MEDIA_TYPES = ("image", "audio", "video")

_STARTS_AT_RE = re.compile(r"starts at line (\d+)")
_COVERS_RE = re.compile(r"covers the next \d+ bytes")
_READ_MORE_RE = re.compile(r"start_line=\d+ to read more")

SUMMARY_WRAPPER = (
    "# Summary of previous conversation\n"
    "\n"
    "Previous conversation logs are offloaded to dialog/YYYY-MM-DD.jsonl (or nearby date files). "
    "Here is the summary:\n"
    "\n"
    "{summary}\n"
    "The above is a summary of previous conversation, use it as context to maintain continuity."
)


# --------------------------------------------------------------------------- token estimate


def _utf8_len(text: str) -> int:
    # surrogatepass: a lone surrogate from a broken transcript must not crash a token count.
    return len(text.encode("utf-8", errors="surrogatepass"))


def rule_estimate_tokens(text: str, divisor: float = DEFAULT_DIVISOR) -> int:
    """ReMe's ``RuleTokenCounter`` / CoPaw's estimate counter: ``int(bytes / divisor + 0.5)``."""
    return int(_utf8_len(text) / divisor + 0.5)


def estimate_text_tokens(text: str, divisor: float = DEFAULT_DIVISOR) -> int:
    """Tokens of one string as ``AsMsgHandler.count_str_token`` counts them.

    ``""`` is 0. A counter result of 0 trips an assertion in ReMe, which falls back to
    ``int(bytes / 3.75)``; for every divisor CoPaw allows (2 to 5) that is 0 again, so the
    fallback changes nothing but ReMe's log (it logs the whole text as a warning).
    """
    if not text:
        return 0
    tokens = rule_estimate_tokens(text, divisor)
    if tokens == 0:
        return int(_utf8_len(text) / _FALLBACK_DIVISOR)
    return tokens


def _media_tokens(block: Mapping[str, Any], divisor: float) -> int:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        # Inline data is charged by length, not by what the model would really spend on it.
        data = source.get("data") or ""
        return len(data) // 4 if data else MEDIA_TOKENS_WHEN_EMPTY
    url = source.get("url") or ""
    return estimate_text_tokens(url, divisor) if url else MEDIA_TOKENS_WHEN_EMPTY


def _tool_result_output(output: Any, divisor: float) -> tuple[str, int]:
    """The text the summariser sees for a tool result, and its tokens (``stat_message`` rules)."""
    if isinstance(output, str):
        return output, estimate_text_tokens(output, divisor)
    if not isinstance(output, list):
        return "", 0
    parts: list[str] = []
    tokens = 0
    for part in output:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind == "text":
            text = part.get("text") or ""
            parts.append(text)
            tokens += estimate_text_tokens(text, divisor)
        elif kind in _MEDIA_TYPES:
            tokens += _media_tokens(part, divisor)
            source = part.get("source") or {}
            if source.get("type") != "base64":
                parts.append(f"[{kind}] {source.get('url') or ''}")
        elif kind == "file":
            path = part.get("path") or part.get("url") or ""
            parts.append(f"[file] {part.get('name', path)}: {path}")
            tokens += estimate_text_tokens(path, divisor)
        # Other part types count 0 (ReMe logs a warning and skips them).
    return "\n".join(parts), tokens


def _tool_input_text(block: Mapping[str, Any]) -> str:
    tool_input = block.get("input", "")
    try:
        return json.dumps(tool_input, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(tool_input)


def _blocks(message: AgentScopeMsg) -> list[Mapping[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, Mapping)]


def estimate_block_tokens(message: AgentScopeMsg, divisor: float = DEFAULT_DIVISOR) -> list[tuple[str, int]]:
    """``(block type, tokens)`` for every block ``stat_message`` counts; unknown types are left out."""
    content = message.get("content")
    if isinstance(content, str):
        return [("text", estimate_text_tokens(content, divisor))]
    stats: list[tuple[str, int]] = []
    for block in _blocks(message):
        kind = block.get("type", "unknown")
        if kind == "text":
            stats.append((kind, estimate_text_tokens(block.get("text") or "", divisor)))
        elif kind == "thinking":
            stats.append((kind, estimate_text_tokens(block.get("thinking") or "", divisor)))
        elif kind in _MEDIA_TYPES:
            stats.append((kind, _media_tokens(block, divisor)))
        elif kind == "tool_use":
            # The parsed input, re-serialised, is what is charged; raw_input is ignored.
            name = block.get("name") or ""
            stats.append((kind, estimate_text_tokens(name + _tool_input_text(block), divisor)))
        elif kind == "tool_result":
            stats.append((kind, _tool_result_output(block.get("output", ""), divisor)[1]))
    return stats


def estimate_message_tokens(message: AgentScopeMsg, divisor: float = DEFAULT_DIVISOR) -> int:
    """``stat_message(...).total_tokens``: the sum of the block estimates, nothing added."""
    return sum(tokens for _, tokens in estimate_block_tokens(message, divisor))


# --------------------------------------------------------------------------- truncation


def _cut_bytes(text: str, max_bytes: int) -> str:
    # A character split by the cut is dropped, so the excerpt can be 1-3 bytes short.
    return text.encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore")


def _truncate_fresh(
    text: str, start_line: int, total_lines: int, max_bytes: int, file_path: str | None
) -> str:
    """First cut of a text that carries no marker yet (ReMe's ``_truncate_fresh``)."""
    if len(text.encode("utf-8")) <= max_bytes:
        return text
    excerpt = _cut_bytes(text, max_bytes)
    next_line = start_line + max(1, excerpt.count("\n"))
    if next_line <= total_lines:
        read_from = next_line
    elif start_line < total_lines:
        read_from = total_lines
    else:
        # ReMe treats a last line longer than the limit as out of scope: cut, and say nothing.
        return excerpt
    return (
        f"{excerpt}{TRUNCATION_MARKER}\n"
        "The output above was truncated.\n"
        f"The full content is saved to the file and contains {total_lines} lines in total.\n"
        f"This excerpt starts at line {start_line} and covers the next {max_bytes} bytes.\n"
        f"If the current content is not enough, call `read_file` with file_path={file_path or ''} "
        f"start_line={read_from} to read more."
    )


def _retruncate(text: str, max_bytes: int) -> str:
    """Cut an already-truncated text again, rewriting its notice in place (ReMe's ``_retruncate``)."""
    original, old_notice = text.split(TRUNCATION_MARKER, 1)
    original_bytes = original.encode("utf-8")
    if len(original_bytes) <= max_bytes + SLACK_BYTES:
        return text
    start_match = _STARTS_AT_RE.search(old_notice)
    if start_match is None:
        return text
    excerpt = original_bytes[:max_bytes].decode("utf-8", errors="ignore")
    # Unlike the first cut, nothing clamps this to the total line count.
    next_line = int(start_match.group(1)) + max(1, excerpt.count("\n"))
    if _COVERS_RE.search(old_notice) is None:
        return text
    notice = _COVERS_RE.sub(f"covers the next {max_bytes} bytes", old_notice)
    notice = _READ_MORE_RE.sub(f"start_line={next_line} to read more", notice)
    return excerpt + TRUNCATION_MARKER + notice


def truncate_text_output(
    text: str,
    start_line: int = 1,
    total_lines: int = 0,
    max_bytes: int = DEFAULT_MAX_BYTES,
    file_path: str | None = None,
) -> str:
    """ReMe's ``truncate_text_output``: a fresh cut, or a re-cut when the marker is already there.

    ``start_line``, ``total_lines`` and ``file_path`` only matter for a fresh cut; a re-cut reads
    them from the old notice. Empty text or ``max_bytes <= 0`` returns the text unchanged, and so
    does any error (as in ReMe, e.g. a lone surrogate that cannot be encoded).
    """
    if not text or max_bytes <= 0:
        return text
    try:
        if TRUNCATION_MARKER in text:
            return _retruncate(text, max_bytes)
        return _truncate_fresh(text, start_line, total_lines, max_bytes, file_path)
    except Exception:
        logger.warning("truncate_text_output failed; returning the text unchanged", exc_info=True)
        return text


# --------------------------------------------------------------------------- tool-result compaction


def _has_tool_result(message: AgentScopeMsg) -> bool:
    return any(block.get("type") == "tool_result" for block in _blocks(message))


def _markdown_protected_ids(messages: Sequence[AgentScopeMsg]) -> set[str]:
    """Ids of ``read_file`` calls whose raw arguments mention ".md" (ReMe's skills rule).

    Only ``raw_input`` is looked at, and only as a substring, so ``.mdx`` and ``x.md.bak`` match and
    a call with no ``raw_input`` does not. (A non-string raw_input, which would make ReMe abandon
    the scan, is simply not protected here.)
    """
    protected: set[str] = set()
    for message in messages:
        for block in _blocks(message):
            if block.get("type") != "tool_use" or not block.get("id"):
                continue
            raw_input = block.get("raw_input")
            name = block.get("name")
            if (
                isinstance(name, str)
                and name.lower() == "read_file"
                and isinstance(raw_input, str)
                and ".md" in raw_input.lower()
            ):
                protected.add(block["id"])
    return protected


def _truncate_output_text(
    content: str, max_bytes: int, directory: Path, file_name: Callable[[str], str] | None = None
) -> str:
    """ReMe's ``ToolResultCompactor._truncate`` for one string; returns ``content`` itself if kept."""
    if not content:
        return content
    try:
        if TRUNCATION_MARKER in content:
            # Already cut on an earlier pass: re-cut from the notice, no new file.
            return truncate_text_output(content, max_bytes=max_bytes)
        if len(content.encode("utf-8")) <= max_bytes + SLACK_BYTES:
            return content
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{file_name(content) if file_name else uuid4().hex}.txt"
        # The full original, raw: no header, so read_file line numbers match the notice.
        path.write_bytes(content.encode("utf-8"))
        return truncate_text_output(content, 1, content.count("\n") + 1, max_bytes, file_path=str(path))
    except Exception:
        logger.warning("could not compact a tool result; leaving it unchanged", exc_info=True)
        return content


def _compact_output(
    output: Any, max_bytes: int, directory: Path, file_name: Callable[[str], str] | None = None
) -> Any:
    """A tool result's output after compaction; the same object when nothing changed."""
    if isinstance(output, str):
        return _truncate_output_text(output, max_bytes, directory, file_name)
    if not isinstance(output, list):
        return output
    new_output: list[Any] | None = None
    for position, part in enumerate(output):
        # Each text part is cut (and saved) on its own; images, files, ... are left alone.
        if not isinstance(part, Mapping) or part.get("type") != "text":
            continue
        text = part.get("text") or ""
        cut = _truncate_output_text(text, max_bytes, directory, file_name)
        if cut is not text:
            if new_output is None:
                new_output = list(output)
            new_output[position] = {**part, "text": cut}
    return output if new_output is None else new_output


def compact_tool_results(
    messages: list[dict[str, Any]],
    *,
    recent_n: int,
    old_max_bytes: int,
    recent_max_bytes: int,
    tool_result_dir: str | os.PathLike[str],
    file_name: Callable[[str], str] | None = None,
) -> list[dict[str, Any]]:
    """ReMe's ``ToolResultCompactor``: cut every tool result to the limit its position gives it.

    Messages in the trailing run of tool-result messages, or among the last ``recent_n``, get
    ``recent_max_bytes``; older ones get ``old_max_bytes``, except results of ``read_file`` calls
    whose ``raw_input`` mentions ".md", which always get ``recent_max_bytes``. A result first cut
    has its full original saved to ``<tool_result_dir>/<uuid4 hex>.txt`` (or the name ``file_name``
    gives its text: a replay wants names that do not change between runs). Returns new message dicts
    and never changes the caller's; unchanged values are shared with the input. It does not clean
    up old files: call :func:`cleanup_expired_files` afterwards, as ReMe does.
    """
    try:
        trailing_run = 0
        for message in reversed(messages):
            if not _has_tool_result(message):
                break
            trailing_run += 1
        split_index = max(0, len(messages) - max(trailing_run, recent_n))
        protected = _markdown_protected_ids(messages)
        directory = Path(tool_result_dir)

        result: list[dict[str, Any]] = []
        for index, message in enumerate(messages):
            content = message.get("content")
            new_content: list[Any] | None = None
            if isinstance(content, list):
                limit = recent_max_bytes if index >= split_index else old_max_bytes
                for position, block in enumerate(content):
                    if not isinstance(block, Mapping) or block.get("type") != "tool_result":
                        continue
                    output = block.get("output")
                    if not output:
                        continue
                    block_limit = recent_max_bytes if block.get("id") in protected else limit
                    new_output = _compact_output(output, block_limit, directory, file_name)
                    if new_output is not output:
                        if new_content is None:
                            new_content = list(content)
                        new_content[position] = {**block, "output": new_output}
            new_message = dict(message)
            if new_content is not None:
                new_message["content"] = new_content
            result.append(new_message)
        return result
    except Exception:
        # ReMe returns its input on any error; ours was never changed.
        logger.warning("tool-result compaction failed; messages left unchanged", exc_info=True)
        return list(messages)


def cleanup_expired_files(
    tool_result_dir: str | os.PathLike[str], retention_days: int, now: datetime | None = None
) -> int:
    """Delete ``*.txt`` files in ``tool_result_dir`` last modified before ``now - retention_days``.

    ReMe compares local naive times and, on Linux, the modification time; nothing but ``.txt``
    directly in the folder is considered. Returns how many files were deleted.
    """
    directory = Path(tool_result_dir)
    if not directory.is_dir():
        return 0
    now = now or datetime.now()
    cutoff = now - timedelta(days=retention_days)
    deleted = 0
    for path in directory.glob("*.txt"):
        try:
            modified = datetime.fromtimestamp(path.stat().st_mtime, tz=now.tzinfo)
            if modified < cutoff and path.is_file():
                path.unlink()
                deleted += 1
        except FileNotFoundError:
            pass  # removed by someone else between the listing and the unlink
        except OSError:
            logger.warning("could not delete expired tool result %s", path, exc_info=True)
    return deleted


# --------------------------------------------------------------------------- context check


def _tool_ids(messages: Iterable[AgentScopeMsg], kind: str) -> set[str]:
    return {
        block["id"]
        for message in messages
        for block in _blocks(message)
        if block.get("type") == kind and block.get("id")
    }


def _tool_ids_aligned(messages: Sequence[AgentScopeMsg]) -> bool:
    # ReMe's validate_tool_ids_alignment and CoPaw's check_valid_messages: set equality only.
    return _tool_ids(messages, "tool_use") == _tool_ids(messages, "tool_result")


def context_check(
    messages: Sequence[AgentScopeMsg], *, threshold: int, reserve: int, divisor: float = DEFAULT_DIVISOR
) -> tuple[list[int], list[int], bool]:
    """ReMe's ``AsMsgHandler.context_check``, without ReMeLight's ``threshold > reserve`` guard.

    Returns (indices to compact, indices to keep, is_valid). This is what the reference vectors
    exercise; CoPaw's hook goes through the guarded :func:`check_context`.
    """
    if not messages:
        return [], [], True
    tokens = [estimate_message_tokens(message, divisor) for message in messages]
    everything = list(range(len(messages)))
    if sum(tokens) < threshold:
        return [], everything, True

    tool_use_at: dict[str, int] = {}
    for index, message in enumerate(messages):
        for block in _blocks(message):
            if block.get("type") == "tool_use" and block.get("id"):
                tool_use_at[block["id"]] = index  # a duplicated id keeps the last index

    kept: set[int] = set()
    accumulated = 0
    for index in range(len(messages) - 1, -1, -1):
        if index in kept:  # already pulled in as a tool_use dependency
            continue
        if accumulated + tokens[index] > reserve:
            break  # no skipping past a big message to older small ones
        dependencies: set[int] = set()
        extra = 0
        for block in _blocks(messages[index]):
            if block.get("type") != "tool_result" or not block.get("id"):
                continue
            use_index = tool_use_at.get(block["id"])
            if use_index is not None and use_index != index and use_index not in kept:
                dependencies.add(use_index)
                # Charged per result, so one tool_use message answered twice here counts twice.
                extra += tokens[use_index]
        if accumulated + tokens[index] + extra > reserve:
            break
        kept.add(index)
        kept |= dependencies
        accumulated += tokens[index] + extra

    to_compact = [index for index in everything if index not in kept]
    to_keep = [index for index in everything if index in kept]
    is_valid = _tool_ids_aligned([messages[index] for index in to_keep])
    return to_compact, to_keep, is_valid


def check_context(
    messages: Sequence[AgentScopeMsg], *, threshold: int, reserve: int, divisor: float = DEFAULT_DIVISOR
) -> tuple[list[int], list[int], bool]:
    """ReMeLight's ``check_context``, the guarded entry point the hooks call: (indices to compact, indices to keep, is_valid).

    ``ContextChecker`` asserts ``threshold > reserve``; ReMeLight catches the failure and compacts
    nothing, with ``is_valid`` False. So once the system prompt and summary eat the budget down to
    the reserve, compaction silently never happens. Otherwise see :func:`context_check`.
    """
    if threshold <= reserve:
        return [], list(range(len(messages))), False
    return context_check(messages, threshold=threshold, reserve=reserve, divisor=divisor)


def copaw_fallback_keep(messages: Sequence[AgentScopeMsg], keep_recent: int = 3) -> int:
    """How many trailing messages CoPaw's hook keeps when ``context_check`` says the split is invalid.

    It starts at ``keep_recent`` (``COPAW_MEMORY_COMPACT_KEEP_RECENT``) and decrements until
    ``messages[-keep:]`` has aligned tool ids, whatever their tokens. 0 means CoPaw compacts every
    message. The value is not clamped to ``len(messages)``, as in CoPaw.
    """
    keep = keep_recent
    while keep > 0 and not _tool_ids_aligned(messages[-keep:]):
        keep -= 1
    return keep


# --------------------------------------------------------------------------- summary input and output


def _flatten(text: str, max_chars: int = FORMATTER_MAX_CHARS) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= max_chars else text[:max_chars] + "..."


def _format_block(block: Mapping[str, Any], include_thinking: bool, divisor: float) -> str:
    kind = block.get("type")
    if kind == "text":
        text = block.get("text") or ""
        return f"[text]: {_flatten(text)}" if text else ""
    if kind == "thinking":
        thinking = block.get("thinking") or ""
        return f"[think]: {_flatten(thinking)}" if include_thinking and thinking else ""
    if kind in _MEDIA_TYPES:
        # Emitted even when empty (base64 data has no URL): "[image]: ".
        source = block.get("source") or {}
        return f"[{kind}]: {source.get('url') or ''}"
    if kind == "tool_use":
        return f"[tool_use]: {block.get('name') or ''} params={_flatten(_tool_input_text(block))}"
    if kind == "tool_result":
        output, _ = _tool_result_output(block.get("output", ""), divisor)
        if not output:
            return ""
        # Only the excerpt: the notice and its file path never reach the summariser.
        shown = output.split(TRUNCATION_MARKER, 1)[0]
        return f"[tool_result]: {block.get('name') or ''} output={_flatten(shown)}"
    return ""


def format_message_for_summary(
    message: AgentScopeMsg, *, include_thinking: bool = True, divisor: float = DEFAULT_DIVISOR
) -> str:
    """One message as ``AsMsgStat.format`` writes it: a header line, then one line per block."""
    name = message.get("name") or message.get("role") or ""
    timestamp = message.get("timestamp") or ""
    lines = [f"[{timestamp}] {name}:" if timestamp else f"{name}:"]
    content = message.get("content")
    if isinstance(content, str):
        if content:
            lines.append(f"[text]: {_flatten(content)}")
    else:
        for block in _blocks(message):
            line = _format_block(block, include_thinking, divisor)
            if line:
                lines.append(line)
    return "\n".join(lines)


def format_messages_for_summary(
    messages: Sequence[AgentScopeMsg],
    *,
    cap_tokens: int,
    include_thinking: bool = True,
    divisor: float = DEFAULT_DIVISOR,
) -> str:
    """The conversation text the compactor and summariser receive (``format_msgs_to_str``).

    Newest first, each formatted message is added while the running estimate stays within
    ``cap_tokens``; the first that does not fit ends the walk (older messages are still compacted,
    just never shown to the summariser). The newest message is always included.
    """
    parts: list[str] = []
    running = 0
    for index in range(len(messages) - 1, -1, -1):
        formatted = format_message_for_summary(
            messages[index], include_thinking=include_thinking, divisor=divisor
        )
        tokens = estimate_text_tokens(formatted, divisor)
        if index != len(messages) - 1 and running + tokens > cap_tokens:
            break
        parts.append(formatted)
        running += tokens
    parts.reverse()
    return "\n\n".join(parts)


def is_valid_summary(text: str) -> bool:
    """ReMe's ``_is_valid_summary``: non-blank and containing "##" anywhere (``"x##y"`` passes)."""
    return bool(text and text.strip()) and "##" in text


def wrap_summary(summary: str) -> str:
    """The user-role message CoPaw puts before the live messages to carry the summary."""
    return SUMMARY_WRAPPER.format(summary=summary)


# --------------------------------------------------------------------------- configuration arithmetic


def calculate_threshold(max_input_length: int, ratio: float) -> int:
    """CoPaw 1.0.2's trigger: ``int(max_input_length * memory_compact_ratio)`` (131072, 0.75 -> 98304)."""
    return int(max_input_length * ratio)


def reme_threshold(max_input_length: int, ratio: float) -> int:
    """ReMe's ``int(L * r * 0.95)``: its own trigger, and the summariser cap CoPaw also gets."""
    return int(max_input_length * ratio * 0.95)


def calculate_reserve(max_input_length: int, ratio: float) -> int:
    """CoPaw 1.0.2's reserve: ``int(max_input_length * memory_reserve_ratio)`` (131072, 0.1 -> 13107)."""
    return int(max_input_length * ratio)


def dialog_date_for(timestamp: str) -> str:
    """The ``dialog/<date>.jsonl`` a message is archived to: the timestamp's first token.

    AgentScope stamps messages in process-local time, so that is the date used; a message with no
    timestamp goes to today's local date.
    """
    tokens = (timestamp or "").split()
    return tokens[0] if tokens else date.today().isoformat()
