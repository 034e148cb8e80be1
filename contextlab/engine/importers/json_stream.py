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
refused when it passes ``budget`` bytes, before it is built.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from typing import Any, BinaryIO

from contextlab.engine.core.errors import InputTooLarge, MalformedInput

MAX_DEPTH = 200
_CHUNK = 256 * 1024
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_BLANKS = re.compile(r"[ \t\r]*")
_NUMBER = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
# The C scanner json.loads itself uses for strings: the same escapes, surrogates and errors.
_scanstring: Any = getattr(json.decoder, "scanstring")  # noqa: B009 (not in the stubs)
# What a container costs before its items, and each item (a pointer; a dict entry with its hash).
_CONTAINER_COST = 64
_LIST_ITEM_COST = 8
_DICT_ITEM_COST = 48
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


class StreamParser:
    """Parse JSON values from a binary file, piece by piece.

    ``budget`` is the most bytes the parsed values may cost (estimated from
    CPython's object sizes); ``budget_text`` says what sets it, for the message.
    """

    def __init__(self, fh: BinaryIO, *, budget: int | None = None, budget_text: str = "",
                 where: str = "in the file", chunk: int = _CHUNK, spent: int = 0) -> None:
        self._fh = fh
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._chunk = chunk
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._bytes_read = 0
        self._first = True
        # Lines and the offset of the last line's start in the text already dropped from the buffer.
        self._lines_before = 0
        self._dropped = 0
        self._line_start = 0  # absolute text offset of the current line's start (as of the dropped text)
        self._budget = budget
        self._budget_text = budget_text
        self._where = where
        # What earlier documents of the same file already cost (the events of a stream share one budget).
        self.cost = spent
        self._memo: dict[str, str] = {}

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
        self.cost += cost
        if self._budget is not None and self.cost > self._budget:
            raise InputTooLarge(f"the JSON {self._where} would take more than {self._budget:,} bytes of memory "
                               f"once parsed ({self._budget_text or 'the import limit'}): too many small values "
                               "for its size", field="file")

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
        key = self._string()
        return self._memo.setdefault(key, key)

    # -- values ------------------------------------------------------------------------------

    def value(self) -> Any:
        """The next JSON value (after any whitespace)."""
        stack: list[list[Any] | dict[str, Any]] = []
        keys: list[str] = []
        while True:
            pos = self._skip()
            char = self._buf[pos] if pos < len(self._buf) else ""
            # A value.
            if char == '"':
                item: Any = self._string()
                self._spend(sys.getsizeof(item))
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
                    continue
                else:
                    stack.append({})
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
                else:
                    top[keys[-1]] = item
                    self._spend(_DICT_ITEM_COST)
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
                    if isinstance(top, dict):
                        keys.pop()
                    continue
                raise self._error("Expecting ',' delimiter", pos)

    def _next_key(self, *, first: bool) -> str:
        pos = self._skip()
        if pos >= len(self._buf) or self._buf[pos] != '"':
            raise self._error("Expecting property name enclosed in double quotes", pos)
        key = self._key()
        self._spend(sys.getsizeof(key))
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


def load(fh: BinaryIO, *, where: str = "in the file", budget: int | None = None, budget_text: str = "") -> Any:
    """The one JSON document in ``fh``, as ``json.loads`` would give it (see the module docstring)."""
    parser = StreamParser(fh, budget=budget, budget_text=budget_text, where=where)
    value = parser.value()
    if not parser.at_end():
        raise parser.extra_data()
    return value


def loads(text: str | bytes, **kwargs: Any) -> Any:
    """``load`` on text in memory (for tests and small documents)."""
    import io

    return load(io.BytesIO(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text), **kwargs)
