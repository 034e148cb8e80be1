"""A JSON reader that parses a file as it reads it, with a memory budget.

``json.loads`` needs the whole document as one ``str``: an import then holds the
file's bytes, its decoded text and the parsed value at once, three times the
upload or more. ``StreamParser`` reads the file in pieces through an
incremental UTF-8 decoder and builds the value as it goes, so besides the value
it holds one piece of text (or one string literal being read).

It gives exactly what ``json.loads`` gives (the same scanner for strings, the
same number rules, ``NaN``/``Infinity`` taken as ``json.loads`` takes them, the
last of two equal keys kept), refuses nesting deeper than ``MAX_DEPTH`` without
recursing, and counts what the parsed value costs in memory: a small document of
many tiny values (``[{},{},...]`` takes some 25 times its size once parsed) is
refused when it passes its ``ParseBudget``, before it is built.

One ``ParseBudget`` covers everything one upload parses: every member of a zip,
every line of a JSON Lines file, the JSON inside a trace's span attributes. What
a caller no longer holds (a batch of rows once inserted) it gives back with
``release``. ``bounded_lines`` reads JSON Lines a line at a time and refuses a
line past its limit as soon as the first piece over it is read.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from collections.abc import Iterator
from typing import IO, Any, BinaryIO

from contextlab.engine.core.errors import InputTooLarge, MalformedInput

MAX_DEPTH = 200
_CHUNK = 256 * 1024
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_BLANKS = re.compile(r"[ \t\r]*")
_NUMBER = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
# The C scanner json.loads itself uses for strings: the same escapes, surrogates and errors.
_scanstring: Any = getattr(json.decoder, "scanstring")  # noqa: B009 (not in the stubs)
# What a container costs before its items, and each item (a pointer; a dict entry with its hash).
# A container's exact size is counted when it closes; until then these stand for it.
_CONTAINER_COST = 64
_LIST_ITEM_COST = 8
_DICT_ITEM_COST = 48
# A key (or a shared string) kept once for the whole upload: the string and its entry in the table.
_KEY_ENTRY_COST = 48
# The most memory a parsed upload may take: the transcripts of the shared corpus
# take 0.6 to 2.5 times their size as Python objects once keys and strings are
# kept once per upload (those of megabytes 1.5 to 1.6 times), long texts about once; a
# document of tiny values ("[{},{},...]", "[0,0,...]") takes 4 to 25 times, and is
# refused before it is built.
PARSED_FACTOR = 2
PARSED_SLACK = 6 * 1024 * 1024
# How much of a line is read at a time: a line past its limit is refused after at most this much more.
LINE_PIECE = 64 * 1024
_CONSTANTS: dict[str, Any] = {
    "null": None, "true": True, "false": False,
    "NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf"),
}


class JsonSyntaxError(ValueError):
    """Where (1-based line and column, as ``json.JSONDecodeError`` counts them) and what is wrong."""

    def __init__(self, msg: str, lineno: int, colno: int) -> None:
        super().__init__(f"{msg}: line {lineno} column {colno}")
        self.msg = msg
        self.lineno = lineno
        self.colno = colno


class ParseBudget:
    """The memory everything one upload parses may take, shared by all its documents.

    ``limit`` bytes (estimated from CPython's object sizes) and ``text``, what
    sets the limit, for the message. ``line_bytes`` is the most one line of JSON
    Lines (or one JSON document read whole) may hold, ``line_text`` what sets it.

    The keys of every parsed object are kept once for the whole upload; with
    ``share_strings``, so are the string values (the same text parsed twice is
    one ``str``), for a caller that holds what it parses to the end anyway. What is kept that way is ``held``: never given back by ``release``.
    """

    def __init__(self, limit: int | None, text: str = "", *, line_bytes: int | None = None,
                 line_text: str = "", share_strings: bool = True) -> None:
        self.limit = limit
        self.text = text
        self.line_bytes = line_bytes
        self.line_text = line_text
        self.share_strings = share_strings
        self.spent = 0
        self.held = 0
        self.kept: dict[str, str] = {}

    @classmethod
    def for_size(cls, size: int, what: str = "the file", *, line_bytes: int | None = None,
                 line_text: str = "", share_strings: bool = True, slack: int = PARSED_SLACK,
                 slack_text: str = "") -> ParseBudget:
        """``PARSED_FACTOR`` times the ``size`` bytes of ``what`` (an upload), plus ``slack``
        (``slack_text``: what sets it, for the message)."""
        constant = f"the {slack:,} bytes of {slack_text}" if slack_text else f"{slack:,}"
        return cls(PARSED_FACTOR * size + slack, f"{PARSED_FACTOR} × {what}'s {size:,} bytes + {constant}",
                   line_bytes=line_bytes, line_text=line_text, share_strings=share_strings)

    def keep(self, text: str, where: str = "in the file") -> str:
        """``text`` as kept for the whole upload: the first ``str`` of that value, counted once."""
        kept = self.kept.setdefault(text, text)
        if kept is text:
            cost = sys.getsizeof(text) + _KEY_ENTRY_COST
            self.held += cost
            self.spend(cost, where)
        return kept

    def spend(self, cost: int, where: str = "in the file") -> None:
        """Count ``cost`` bytes; ``InputTooLarge`` naming the limit when they pass it."""
        self.spent += cost
        if self.limit is not None and self.spent > self.limit:
            raise InputTooLarge(f"the JSON {where} would take more than {self.limit:,} bytes of memory once parsed "
                                f"({self.text or 'the import limit'}): too much for its size", field="file")

    def release(self, cost: int) -> None:
        """Give back ``cost`` bytes the caller no longer holds."""
        self.spent = max(0, self.spent - cost)


def bounded_lines(fh: IO[bytes], budget: ParseBudget | None = None, name: str = "") -> Iterator[tuple[int, int, bytes]]:
    """The lines of ``fh`` as (1-based number, byte offset, bytes with the line break), one at a time.

    A line is read in pieces of ``LINE_PIECE`` bytes and refused as soon as it
    passes the budget's ``line_bytes``, or what is left of the budget itself: a
    60 MB line costs one piece past the limit, never the whole line. ``name``
    names the file in the message.
    """
    limit = budget.line_bytes if budget is not None else None
    offset = 0
    number = 0
    while True:
        piece = fh.readline(LINE_PIECE)
        if not piece:
            return
        number += 1
        parts = [piece]
        size = len(piece)
        while not piece.endswith(b"\n"):
            if limit is not None and size > limit:
                break
            if budget is not None and budget.limit is not None and budget.spent + size > budget.limit:
                # Within the line limit but past what the upload has left: refused now, not once read whole.
                budget.spend(size, f"in {name} line {number}" if name else f"at line {number}")
            piece = fh.readline(LINE_PIECE)
            if not piece:
                break
            parts.append(piece)
            size += len(piece)
        if limit is not None and size > limit:
            assert budget is not None
            raise InputTooLarge(f"{name + ' ' if name else ''}line {number} is longer than the {limit:,}-byte limit "
                                f"for one line ({budget.line_text or 'the import limit'})", field="file")
        line = parts[0] if len(parts) == 1 else b"".join(parts)
        del parts
        yield number, offset, line
        offset += size


class StreamParser:
    """Parse JSON values from a binary file, piece by piece.

    ``budget`` holds what the parsed values may cost, shared with every other
    document of the same upload; ``offset`` is where ``fh`` starts in the file
    (for the byte an error names); ``share`` overrides the budget's
    ``share_strings`` (a document whose long strings are all different and
    let go soon after, such as the attribute texts of a trace, gains nothing).
    """

    def __init__(self, fh: BinaryIO, *, budget: ParseBudget | None = None, where: str = "in the file",
                 chunk: int = _CHUNK, offset: int = 0, share: bool | None = None) -> None:
        self._fh = fh
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._chunk = chunk
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._bytes_read = offset
        self._first = offset == 0
        # Lines and the offset of the last line's start in the text already dropped from the buffer.
        self._lines_before = 0
        self._dropped = 0
        self._line_start = 0  # absolute text offset of the current line's start (as of the dropped text)
        self._budget = budget
        self._where = where
        self._memo: dict[str, str] = {}
        # Whether long strings are kept once per upload: the budget says, unless the caller does.
        self._share = (budget.share_strings if share is None else share) if budget is not None else False

    # -- the buffer --------------------------------------------------------------------------

    def _fill(self, at_least: int = 0) -> bool:
        """Read one more piece (more when a long token needs it); False at the end of the file."""
        if self._eof:
            return False
        if self._pos:
            dropped = self._buf[:self._pos]
            newlines = dropped.count("\n")
            if newlines:
                self._lines_before += newlines
                self._line_start = self._dropped + dropped.rfind("\n") + 1
            self._dropped += self._pos
            self._buf = self._buf[self._pos:]
            self._pos = 0
            del dropped
        # A token longer than a piece (a long string) is read in growing pieces, so
        # finding its end costs time in proportion to its length, not its square.
        size = max(self._chunk, at_least)
        raw = self._fh.read(size)
        # The decoder keeps the start of a character cut by the piece; errors count from it.
        pending = len(self._decoder.getstate()[0])
        try:
            text = self._decoder.decode(raw, final=not raw)
        except UnicodeDecodeError as exc:
            raise MalformedInput(f"not valid UTF-8 at byte {self._bytes_read - pending + exc.start}", field="file") from None
        self._bytes_read += len(raw)
        if self._first and text:
            self._first = False
            if text.startswith("\ufeff"):
                text = text[1:]
                self._dropped += 1
                self._line_start += 1
        if not raw:
            self._eof = True
        self._buf += text
        return True

    def _location(self, pos: int) -> tuple[int, int]:
        head = self._buf[:pos]
        newlines = head.count("\n")
        if newlines:
            return self._lines_before + newlines + 1, pos - head.rfind("\n")
        return self._lines_before + 1, self._dropped + pos - self._line_start + 1

    def _error(self, msg: str, pos: int) -> JsonSyntaxError:
        return JsonSyntaxError(msg, *self._location(pos))

    def _skip(self) -> int:
        """Skip whitespace; the position of the next character, ``len(buffer)`` at the end of the file."""
        while True:
            match = _WHITESPACE.match(self._buf, self._pos)
            assert match is not None  # the pattern matches the empty string
            end = match.end()
            self._pos = end
            if end < len(self._buf) or not self._fill():
                return self._pos

    def _spend(self, cost: int) -> None:
        if self._budget is not None:
            self._budget.spend(cost, self._where)

    # -- tokens ------------------------------------------------------------------------------

    def _string(self) -> str:
        """The string literal whose quote is at the current position."""
        start = self._pos
        grow = self._chunk
        while True:
            try:
                value: str
                value, end = _scanstring(self._buf, start + 1, True)
            except json.JSONDecodeError as exc:
                truncated = exc.msg.startswith("Unterminated string") or (
                    exc.msg.startswith("Invalid \\") and exc.pos + 6 >= len(self._buf))
                if truncated and not self._eof:
                    keep = start - self._pos
                    self._fill(grow)
                    grow *= 2
                    start = self._pos + keep
                    continue
                raise self._error(exc.msg, exc.pos) from None
            self._pos = end
            return value

    def _number_or_constant(self) -> Any:
        while True:
            buf, pos = self._buf, self._pos
            match = _NUMBER.match(buf, pos)
            # A number may go on in the next piece ("1" then "e+5"): decide only with
            # three characters after it in hand, or at the end of the file.
            if match is not None and (match.end() + 2 < len(buf) or self._eof):
                self._pos = match.end()
                integer, frac, exp = match.groups()
                if frac or exp:
                    return float(integer + (frac or "") + (exp or ""))
                return int(integer)
            if match is None:
                for word, value in _CONSTANTS.items():
                    if buf.startswith(word, pos):
                        self._pos = pos + len(word)
                        return value
                if len(buf) - pos >= 9 or self._eof:
                    raise self._error("Expecting value", pos)
            self._fill()

    def _key(self) -> str:
        """A key, the same ``str`` for every object of the upload that uses it (counted once)."""
        key = self._string()
        if self._budget is not None:
            return self._budget.keep(key, self._where)
        return self._memo.setdefault(key, key)

    def _string_value(self) -> str:
        text = self._string()
        if self._budget is None:
            return text
        # Kept once per upload when the budget shares strings: a request log repeats the conversation
        # so far in every request, a trace in every LLM span, a Claude Code transcript its working
        # folder, version and session id on every line.
        if self._share:
            return self._budget.keep(text, self._where)
        self._spend(sys.getsizeof(text))
        return text

    # -- values ------------------------------------------------------------------------------

    def value(self) -> Any:
        """The next JSON value (after any whitespace)."""
        stack: list[list[Any] | dict[str, Any]] = []
        keys: list[str] = []
        # What each open container was counted so far, made exact when it closes.
        counted: list[int] = []
        while True:
            pos = self._skip()
            char = self._buf[pos] if pos < len(self._buf) else ""
            # A value.
            if char == '"':
                item: Any = self._string_value()
            elif char == "{" or char == "[":
                if len(stack) >= MAX_DEPTH:
                    raise MalformedInput(f"JSON nested deeper than {MAX_DEPTH} levels {self._where}", field="file")
                self._pos += 1
                self._spend(_CONTAINER_COST)
                pos = self._skip()
                closing = "}" if char == "{" else "]"
                if pos < len(self._buf) and self._buf[pos] == closing:
                    self._pos += 1
                    item = {} if char == "{" else []
                elif char == "[":
                    stack.append([])
                    counted.append(_CONTAINER_COST)
                    continue
                else:
                    stack.append({})
                    counted.append(_CONTAINER_COST)
                    keys.append(self._next_key(first=True))
                    continue
            else:
                if not char:
                    raise self._error("Expecting value", pos)
                item = self._number_or_constant()
                if item is not None and item is not True and item is not False:
                    self._spend(sys.getsizeof(item))
            # Put it in its container, then close every container that ends here.
            while True:
                if not stack:
                    return item
                top = stack[-1]
                if isinstance(top, list):
                    top.append(item)
                    self._spend(_LIST_ITEM_COST)
                    counted[-1] += _LIST_ITEM_COST
                else:
                    top[keys[-1]] = item
                    self._spend(_DICT_ITEM_COST)
                    counted[-1] += _DICT_ITEM_COST
                pos = self._skip()
                char = self._buf[pos] if pos < len(self._buf) else ""
                if char == ",":
                    self._pos += 1
                    if isinstance(top, dict):
                        keys[-1] = self._next_key(first=False)
                    break
                if char == ("]" if isinstance(top, list) else "}"):
                    self._pos += 1
                    item = stack.pop()
                    self._spend(sys.getsizeof(item) - counted.pop())
                    if isinstance(top, dict):
                        keys.pop()
                    continue
                raise self._error("Expecting ',' delimiter", pos)

    def _next_key(self, *, first: bool) -> str:
        pos = self._skip()
        if pos >= len(self._buf) or self._buf[pos] != '"':
            raise self._error("Expecting property name enclosed in double quotes", pos)
        key = self._key()
        pos = self._skip()
        if pos >= len(self._buf) or self._buf[pos] != ":":
            raise self._error("Expecting ':' delimiter", pos)
        self._pos += 1
        return key

    # -- after a value -----------------------------------------------------------------------

    def line(self) -> int:
        """The 1-based line of the current position."""
        return self._location(self._pos)[0]

    def at_end(self) -> bool:
        """True when only whitespace is left."""
        return self._skip() >= len(self._buf)

    def next_on_same_line(self) -> bool:
        """True when more than whitespace follows on the current line (call before ``at_end``)."""
        while True:
            match = _BLANKS.match(self._buf, self._pos)
            assert match is not None
            if match.end() < len(self._buf):
                return self._buf[match.end()] != "\n"
            if not self._fill():
                return False

    def extra_data(self) -> JsonSyntaxError:
        return self._error("Extra data", self._skip())


def load(fh: BinaryIO, *, where: str = "in the file", budget: ParseBudget | None = None, offset: int = 0,
         share: bool | None = None) -> Any:
    """The one JSON document in ``fh``, as ``json.loads`` would give it (see the module docstring)."""
    parser = StreamParser(fh, budget=budget, where=where, offset=offset, share=share)
    value = parser.value()
    if not parser.at_end():
        raise parser.extra_data()
    return value


def load_line(line: bytes, *, where: str, budget: ParseBudget | None, offset: int = 0,
              share: bool | None = None) -> Any:
    """The JSON value of one line read by ``bounded_lines``: the line's bytes count against
    ``budget`` while it is parsed, its value after."""
    import io

    if budget is not None:
        budget.spend(len(line), where)
    try:
        return load(io.BytesIO(line), where=where, budget=budget, offset=offset, share=share)
    finally:
        if budget is not None:
            budget.release(len(line))


def loads(text: str | bytes, **kwargs: Any) -> Any:
    """``load`` on text in memory (for tests and small documents)."""
    import io

    return load(io.BytesIO(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text), **kwargs)
