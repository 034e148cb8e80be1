"""What every transcript importer shares: reading the file safely, the
``Transcript`` result and how it is finished (``finish_transcript``,
``repaired_transcript``), and the repair pass that turns a recorded session into
a sequence a provider would accept.

Recorded sessions are messy in ways a live API never is: results stored after a
later message, calls that never got a result (a hand-off, a final ``finish``, a
session cut off), the same call id used twice. The repair pass fixes each of
these without dropping any real content and says what it did in ``warnings``.
"""

from __future__ import annotations

import datetime as dt
import io
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

from contextlab.engine.core.errors import MalformedInput, UnknownFormat
from contextlab.engine.core.messages import (
    REPAIR_KEY,
    Block,
    Message,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    check_sequence,
)
from contextlab.engine.core.schemas import check_tools
from contextlab.engine.core.unicode import repaired
from contextlab.engine.importers.json_stream import (
    PARSED_FACTOR,
    PARSED_SLACK,
    JsonSyntaxError,
    ParseBudget,
    StreamParser,
    bounded_lines,
    load_line,
)

__all__ = ["PARSED_FACTOR", "PARSED_SLACK", "ParseBudget"]
NO_RESULT_TEXT = "[no result was recorded for this call]"
KNOWN_FORMATS: tuple[str, ...] = (
    "claude_code",
    "openhands",
    "swe_agent",
    "tau_bench",
    "langgraph",
    "deerflow_sse",
    "reme_list",
    "openai_request",
    "openai_messages",
    "anthropic_messages",
    "agentscope_messages",
    "contextlab_messages",
)


def unknown_format(what: str) -> UnknownFormat:
    return UnknownFormat(
        f"unrecognised transcript format ({what}); known formats: {', '.join(KNOWN_FORMATS)}", field="file"
    )


@dataclass
class Transcript:
    format: str
    messages: list[Message]
    system_prompt: str | None
    warnings: list[str]
    source_path: str
    # Session-level facts that belong to no message: tool schemas, the task and
    # reward of a benchmark run, how many records of each skipped kind there were.
    metadata: dict[str, Any] = field(default_factory=dict)
    # The tool definitions the transcript records as sent with its requests
    # (OpenAI chat form), which a replay passes to the engine's tools layer.
    tools: list[dict[str, Any]] = field(default_factory=list)


# -- reading ----------------------------------------------------------------------------


@dataclass
class SseEvent:
    index: int
    line: int  # 1-based line of the event's first line
    event: str
    data: Any


@dataclass
class Source:
    """A transcript file read and parsed once, shared by detection and import."""

    path: str
    kind: Literal["json", "jsonl", "sse"]
    value: Any = None  # kind json
    records: list[tuple[int, Any]] = field(default_factory=list)  # kind jsonl: (0-based line, value)
    events: list[SseEvent] = field(default_factory=list)  # kind sse
    mtime: str | None = None


_PEEK = 64 * 1024
# What one record of JSON Lines costs besides its value: the (line, value) tuple and its place in the list.
_RECORD_COST = 64 + 32 + 8


def read_source(path: str | Path, budget: ParseBudget | None = None) -> Source:
    """The file at ``path`` parsed, everything it holds within ``budget`` (by default, one set by the
    file's size, for a file read on its own)."""
    file_path = Path(path)
    try:
        stat = file_path.stat()
        budget = budget or ParseBudget.for_size(stat.st_size)
        mtime = dt.datetime.fromtimestamp(stat.st_mtime, tz=dt.UTC)
        with file_path.open("rb") as fh:
            source = Source(
                path=str(file_path),
                kind="json",
                mtime=mtime.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            )
            # Nothing is read whole: a JSON document is parsed as it is read, JSON
            # Lines and event streams a line at a time, so the import holds the
            # parsed values and one piece of the file, never the file's bytes
            # and its text besides them.
            first = _first_char(fh)
            fh.seek(0)
            if not first:
                raise MalformedInput("the file is empty", field="file")
            if first in b"[{":
                _read_json_or_lines(fh, source, budget)
                return source
            head = fh.read(_PEEK).lstrip(b"\xef\xbb\xbf").lstrip()
            fh.seek(0)
            if head.startswith((b"event:", b"data:", b":")):
                source.kind = "sse"
                source.events = _parse_sse(_text_lines(fh, budget), budget)
                return source
    except OSError as exc:
        raise MalformedInput(f"cannot read {file_path}: {exc.strerror or exc}", field="file") from None
    raise unknown_format("the file is not JSON, JSON Lines or a server-sent event stream")


def _first_char(fh: BinaryIO) -> bytes:
    """The first byte of ``fh`` that is not whitespace (or a byte order mark), b"" when there is none."""
    start = True
    while piece := fh.read(_PEEK):
        if start:
            piece, start = piece.removeprefix(b"\xef\xbb\xbf"), False
        rest = piece.lstrip(b" \t\r\n")
        if rest:
            return rest[:1]
    return b""


def _read_json_or_lines(fh: BinaryIO, source: Source, budget: ParseBudget) -> None:
    """One JSON document, or JSON Lines (a complete value on the first line, more on later lines)."""
    spent = budget.spent
    parser = StreamParser(fh, budget=budget, where="in the file")
    try:
        parser.at_end()  # past leading blank lines, to the line the value starts on
        start = parser.line()
        value = parser.value()
        one_line = parser.line() == start and not parser.next_on_same_line()
        if parser.at_end():
            source.value = repaired(value)
            return
        if not one_line:
            raise parser.extra_data()
        del value, parser
        # The first line is read again with the others.
        budget.release(budget.spent - spent)
        fh.seek(0)
        source.kind = "jsonl"
        source.records = _read_jsonl(fh, budget)
    except JsonSyntaxError as exc:
        raise MalformedInput(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
                             field="file") from None


def _text_lines(fh: BinaryIO, budget: ParseBudget) -> Iterator[str]:
    """The decoded lines of ``fh`` without their line breaks, one at a time, each within the line limit."""
    for number, offset, raw_line in bounded_lines(fh, budget):
        yield _decoded_line(raw_line, offset, bom=number == 1)


def _read_jsonl(fh: BinaryIO, budget: ParseBudget) -> list[tuple[int, Any]]:
    """The records of JSON Lines, each line parsed as it is read: a line past the budget's line
    limit is refused before it is read whole, and every value counts against ``budget``."""
    records: list[tuple[int, Any]] = []
    for number, offset, raw_line in bounded_lines(fh, budget):
        if not raw_line.strip():
            continue
        where = f"at line {number}"
        try:
            value = load_line(raw_line, where=where, budget=budget, offset=offset)
        except JsonSyntaxError as exc:
            raise MalformedInput(f"invalid JSON at line {number + exc.lineno - 1}, column {exc.colno}: {exc.msg}",
                                 field="file") from None
        budget.spend(_RECORD_COST, where)
        records.append((number - 1, repaired(value)))
    return records


def _decoded_line(raw: bytes, offset: int, *, bom: bool) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedInput(f"not valid UTF-8 at byte {offset + exc.start}", field="file") from None
    text = text[:-1] if text.endswith("\n") else text
    return text[1:] if bom and text.startswith("\ufeff") else text


def _event_data(payload: str, where: str, first_line: int, budget: ParseBudget) -> Any:
    """An event's JSON data, within the file's budget."""
    parser = StreamParser(io.BytesIO(payload.encode("utf-8", "surrogatepass")), budget=budget, where=where)
    try:
        value = parser.value()
        if not parser.at_end():
            raise parser.extra_data()
    except JsonSyntaxError as exc:
        raise MalformedInput(f"invalid JSON at line {exc.lineno + first_line - 1}, column {exc.colno}: {exc.msg}",
                             field="file") from None
    return repaired(value)


def _parse_sse(lines: Iterable[str], budget: ParseBudget) -> list[SseEvent]:
    events: list[SseEvent] = []
    name = ""
    data_lines: list[str] = []
    # The data lines of the event being read count against the budget until it is parsed.
    pending = 0
    start = 0

    def flush() -> None:
        nonlocal pending
        if not data_lines and not name:
            return
        payload = "\n".join(data_lines)
        where = f"in event {len(events)} (line {start})"
        value = None
        if payload.strip():
            value = _event_data(payload, where, start + 1, budget)
        budget.release(pending)
        pending = 0
        events.append(SseEvent(index=len(events), line=start, event=name or "message", data=value))

    # Lines end at "\n" only, never at what splitlines() also takes: JSON text may
    # hold raw U+2028 and friends.
    for number, raw_line in enumerate(lines, start=1):
        line = raw_line.rstrip("\r")
        if not line:
            flush()
            name, data_lines = "", []
            continue
        if line.startswith(":"):
            continue  # an SSE comment
        if not name and not data_lines:
            start = number
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "event":
            name = value
        elif key == "data":
            data_lines.append(value)
            pending += sys.getsizeof(value)
            budget.spend(sys.getsizeof(value), f"in event {len(events)} (line {start})")
    flush()
    return events


# -- building messages ------------------------------------------------------------------


class Timeline:
    """Timestamps for sources that lack some: carry the last known time forward.

    A message without a time of its own gets the latest time seen before it (or
    the session's start time), flagged ``timestamp_inferred``.
    """

    def __init__(self, start: str | None) -> None:
        # The file's modification time when the source has no time at all:
        # deterministic for a given file, and never in the future.
        self.last = start or "1970-01-01T00:00:00.000Z"

    def stamp(self, value: str | None) -> tuple[str, bool]:
        if value:
            self.last = value
            return value, False
        return self.last, True


def make_message(
    role: Role,
    content: list[Block] | tuple[Block, ...],
    *,
    msg_id: str,
    fmt: str,
    index: int,
    timestamp: tuple[str, bool],
    name: str | None = None,
    **metadata: Any,
) -> Message:
    meta: dict[str, Any] = {"source_index": index, "source_format": fmt}
    if timestamp[1]:
        meta["timestamp_inferred"] = True
    meta.update({k: v for k, v in metadata.items() if v is not None})
    return Message(role=role, content=tuple(content), id=msg_id, name=name, timestamp=timestamp[0], metadata=meta)


def numbered_ids(base: str, count: int) -> Iterator[str]:
    """Ids for the messages one source record yields: the record's id, then id#1, id#2, ..."""
    for n in range(count):
        yield base if n == 0 else f"{base}#{n}"


# -- finishing --------------------------------------------------------------------------


def lift_system_prompt(messages: list[Message], meta: dict[str, Any]) -> str | None:
    """Take a leading text-only system message out of the list as the system prompt.

    The engine counts the system prompt apart from the messages (it is never
    compacted), so it must not also sit in the list.
    """
    if messages and messages[0].role == "system" and all(isinstance(b, TextBlock) for b in messages[0].content):
        first = messages.pop(0)
        meta["system_source_index"] = first.metadata.get("source_index")
        return first.plain_text()
    return None


def finish_transcript(
    fmt: str, messages: list[Message], warnings: list[str], source: Source, metadata: dict[str, Any],
    *, tools: list[dict[str, Any]] | None = None,
) -> Transcript:
    """The transcript of a format whose system prompt, if any, is the first message.

    The prompt is lifted out of ``messages`` (noted in ``metadata``) before the
    rest is repaired, so the repair never sees it.
    """
    system_prompt = lift_system_prompt(messages, metadata)
    return repaired_transcript(fmt, messages, warnings, source, metadata, system_prompt=system_prompt, tools=tools)


def repaired_transcript(
    fmt: str,
    messages: list[Message],
    warnings: list[str],
    source: Source,
    metadata: dict[str, Any],
    *,
    system_prompt: str | None,
    tools: list[dict[str, Any]] | None = None,
) -> Transcript:
    """The transcript of the repaired ``messages``, for formats that give the system
    prompt apart from them (or not at all); ``warnings`` gets what the repair did."""
    return Transcript(
        format=fmt,
        messages=repair(messages, warnings),
        system_prompt=system_prompt,
        warnings=warnings,
        source_path=source.path,
        metadata=metadata,
        tools=tools or [],
    )


def recorded_tools(value: Any, where: str, warnings: list[str]) -> list[dict[str, Any]]:
    """Tool definitions a transcript records, checked as the chat API takes them.

    A list the engine would refuse is left out with a warning rather than
    failing the import: the messages are still worth replaying.
    """
    if value is None:
        return []
    try:
        return check_tools(value)
    except MalformedInput as exc:
        warnings.append(f"{where}: the recorded tool definitions were not used ({exc.message})")
        return []


# -- repair -----------------------------------------------------------------------------


def _split_results(messages: list[Message]) -> list[Message]:
    """One message per tool result, the normal form the repair pass works on."""
    out: list[Message] = []
    for msg in messages:
        results = msg.tool_results
        if len(results) <= 1 and (not results or len(msg.content) == 1):
            out.append(msg)
            continue
        rest = [b for b in msg.content if not isinstance(b, ToolResultBlock)]
        ids = numbered_ids(msg.id, len(results) + (1 if rest else 0))
        for result in results:
            out.append(Message(role="tool", content=(result,), id=next(ids), name=msg.name,
                               timestamp=msg.timestamp, metadata=dict(msg.metadata)))
        if rest:
            role: Role = "user" if msg.role == "tool" else msg.role
            out.append(Message(role=role, content=tuple(rest), id=next(ids), name=msg.name,
                               timestamp=msg.timestamp, metadata=dict(msg.metadata)))
    return out


def _rename_call(block: ToolUseBlock, new_id: str) -> ToolUseBlock:
    return ToolUseBlock(id=new_id, name=block.name, input=block.input, raw_input=block.raw_input)


def repair(messages: list[Message], warnings: list[str]) -> list[Message]:
    """Make a recorded session a valid provider sequence, saying what changed.

    * duplicate message ids get a ``#dupN`` suffix;
    * a call id used again is renamed ``id#N``; results pair with the earliest
      call of that id still waiting for one;
    * a result stored away from its call moves right after the call's group;
    * a call that never got a result gets a synthetic error result;
    * a result with no call anywhere becomes a user message (flagged), never dropped.
    """
    msgs = _split_results(messages)

    # Message ids.
    seen_ids: set[str] = set()
    for pos, msg in enumerate(msgs):
        if msg.id in seen_ids:
            n = 2
            while f"{msg.id}#dup{n}" in seen_ids:
                n += 1
            new_id = f"{msg.id}#dup{n}"
            warnings.append(f"duplicate message id {msg.id!r} (source index {_where(msg)}): renamed {new_id!r}")
            msgs[pos] = _replace_id(msg, new_id)
        seen_ids.add(msgs[pos].id)

    # Call ids: rename reuse, remember where each call sits.
    used: set[str] = set()
    calls_by_original: dict[str, list[str]] = defaultdict(list)
    call_pos: dict[str, int] = {}
    for pos, msg in enumerate(msgs):
        if not msg.tool_uses:
            continue
        changed = False
        blocks: list[Block] = []
        for block in msg.content:
            if isinstance(block, ToolUseBlock):
                original = block.id
                new_id = original
                n = 2
                while new_id in used:
                    new_id = f"{original}#{n}"
                    n += 1
                if new_id != original:
                    warnings.append(
                        f"duplicate tool call id {original!r} (source index {_where(msg)}): renamed {new_id!r}"
                    )
                    block = _rename_call(block, new_id)
                    changed = True
                used.add(new_id)
                calls_by_original[original].append(new_id)
                call_pos[new_id] = pos
            blocks.append(block)
        if changed:
            msgs[pos] = msg.replace_content(blocks)

    # Pair each result with a call.
    answered: set[str] = set()
    paired: dict[int, str] = {}  # result position -> call id it answers
    for pos, msg in enumerate(msgs):
        results = msg.tool_results
        if not results:
            continue
        original = results[0].id
        candidates = [c for c in calls_by_original.get(original, []) if c not in answered]
        before = [c for c in candidates if call_pos[c] < pos]
        chosen = before[0] if before else (candidates[0] if candidates else None)
        if chosen is not None:
            answered.add(chosen)
            paired[pos] = chosen

    # Rebuild the sequence.
    results_for: dict[int, list[int]] = defaultdict(list)  # call message position -> result positions
    for pos, call_id in paired.items():
        results_for[call_pos[call_id]].append(pos)
    out: list[Message] = []
    for pos, msg in enumerate(msgs):
        if pos in paired:
            continue
        if msg.tool_results:
            out.append(_orphan_to_user(msg, calls_by_original, warnings))
            continue
        out.append(msg)
        if not msg.tool_uses:
            continue
        group = sorted(results_for.get(pos, []))
        for result_pos in group:
            result_msg = msgs[result_pos]
            call_id = paired[result_pos]
            # Results of other calls in between do not count: they are the ones that move.
            if result_pos < pos or any(p not in paired for p in range(pos + 1, result_pos)):
                warnings.append(
                    f"tool result for call {call_id!r} (source index {_where(result_msg)}) was stored "
                    f"{'before its call' if result_pos < pos else 'after other messages'}; "
                    f"moved right after the call (source index {_where(msg)})"
                )
            result = result_msg.tool_results[0]
            if result.id != call_id:
                result_msg = result_msg.replace_content(
                    [ToolResultBlock(id=call_id, name=result.name, output=result.output, is_error=result.is_error)]
                )
            out.append(result_msg)
        answered_here = {paired[p] for p in group}
        for use in msg.tool_uses:
            if use.id in answered_here:
                continue
            warnings.append(
                f"tool call {use.id!r} ({use.name}, source index {_where(msg)}) has no recorded result; "
                "added a synthetic error result"
            )
            out.append(
                Message(
                    role="tool",
                    content=(ToolResultBlock(id=use.id, name=use.name, output=NO_RESULT_TEXT, is_error=True),),
                    id=f"{msg.id}#no-result-{use.id}",
                    timestamp=msg.timestamp,
                    metadata={
                        "source_index": msg.metadata.get("source_index"),
                        "source_format": msg.metadata.get("source_format"),
                        "synthetic": True,
                        # Summaries must not read the placeholder as the agent's own failure.
                        REPAIR_KEY: "no_result",
                    },
                )
            )
    check_sequence(out, allow_pending_tail=False)
    return out


def _where(msg: Message) -> Any:
    return msg.metadata.get("source_index", "?")


def _replace_id(msg: Message, new_id: str) -> Message:
    return Message(role=msg.role, content=msg.content, id=new_id, name=msg.name,
                   timestamp=msg.timestamp, metadata=dict(msg.metadata))


def _orphan_to_user(msg: Message, calls: dict[str, list[str]], warnings: list[str]) -> Message:
    result = msg.tool_results[0]
    again = result.id in calls
    warnings.append(
        f"tool result {result.id!r} (source index {_where(msg)}) "
        + ("answers a call that already has a result" if again else "answers no call in the transcript")
        + "; kept as a user message"
    )
    content: list[Block] = (
        [TextBlock(result.output)] if isinstance(result.output, str) else list(result.output)
    )
    meta = dict(msg.metadata)
    meta.update(
        {
            "orphan_tool_result": True,
            "tool_use_id": result.id,
            "tool_name": result.name,
            "tool_is_error": result.is_error,
        }
    )
    if again:
        meta["duplicate_result"] = True
    return Message(role="user", content=tuple(content), id=msg.id, name=msg.name,
                   timestamp=msg.timestamp, metadata=meta)
