"""The streaming JSON reader gives what ``json.loads`` gives, error positions included."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextlab.engine.core.errors import InputTooLarge, MalformedInput
from contextlab.engine.importers.json_stream import (
    LINE_PIECE,
    MAX_DEPTH,
    JsonSyntaxError,
    ParseBudget,
    StreamParser,
    bounded_lines,
    load,
)


def _parse(text: str, chunk: int) -> Any:
    # Tiny pieces put every token, escape and line break across a piece boundary somewhere.
    parser = StreamParser(io.BytesIO(text.encode("utf-8", "surrogatepass")), chunk=chunk)
    value = parser.value()
    if not parser.at_end():
        raise parser.extra_data()
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN included, with the same types (1 is not 1.0) and key order."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


_text = st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("\"\\/\b\f\n\r\t\u2028é😀"), max_size=30)
_scalars = (st.none() | st.booleans() | st.integers(min_value=-(10**40), max_value=10**40)
            | st.floats(allow_nan=True, allow_infinity=True) | _text)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=5)
                       | st.dictionaries(_text, inner, max_size=5), max_leaves=40)


@st.composite
def _documents(draw: st.DrawFn) -> str:
    value = draw(_values)
    text = json.dumps(value, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 0, 2])))
    if draw(st.booleans()):
        # Escapes json.dumps never writes: lone and paired surrogates, upper-case hex, escaped slashes.
        extra = draw(st.lists(st.sampled_from(["\\ud800", "\\udfff", "\\uD83D\\uDE00", "\\ud83d\\ude00x",
                                               "\\/", "\\u00E9", "\\udc00\\ud800"]), max_size=4))
        text = json.dumps([text, value])[:-1] + ', "' + "".join(extra) + '"]'
    return text


@settings(max_examples=300, deadline=None)
@given(document=_documents(), chunk=st.sampled_from([1, 2, 3, 7, 64, 4096]))
def test_it_parses_what_json_loads_parses(document, chunk):
    assert _same(_parse(document, chunk), json.loads(document))


@settings(max_examples=300, deadline=None)
@given(document=_documents(), cut=st.integers(min_value=0), junk=st.sampled_from(["", "]", ",", "}", "x", " 1", "\n{"]),
       chunk=st.sampled_from([1, 5, 4096]))
def test_it_refuses_what_json_loads_refuses_at_the_same_place(document, cut, junk, chunk):
    broken = document[: cut % (len(document) + 1)] + junk
    try:
        expected: Any = json.loads(broken)
    except json.JSONDecodeError as exc:
        expected = (exc.msg, exc.lineno, exc.colno)
    try:
        got: Any = _parse(broken, chunk)
    except JsonSyntaxError as exc:
        got = (exc.msg, exc.lineno, exc.colno)
    assert _same(got, expected) if not isinstance(expected, tuple) else got == expected


def test_it_reads_big_numbers_as_json_loads_does():
    for text in ["1e400", "-1e400", "123456789012345678901234567890123", "1.5e-400", "-0", "-0.0", "[1E+2, 0.5]"]:
        assert _same(_parse(text, 2), json.loads(text)), text
    too_long = "9" * 5000  # over Python's int digit limit: the same ValueError as json.loads
    with pytest.raises(ValueError, match="digits"):
        json.loads(too_long)
    with pytest.raises(ValueError, match="digits"):
        _parse(too_long, 4096)


def test_it_refuses_nesting_past_the_limit_without_recursing():
    assert _parse("[" * MAX_DEPTH + "]" * MAX_DEPTH, 3) == json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    with pytest.raises(MalformedInput, match=f"nested deeper than {MAX_DEPTH} levels"):
        _parse("[" * 100_000, 4096)


def test_it_names_the_byte_of_bad_utf8_across_pieces():
    for chunk in (1, 2, 3, 4096):
        with pytest.raises(MalformedInput, match="not valid UTF-8 at byte 6"):
            StreamParser(io.BytesIO(b'["abcd\xed\xb3\xbf"]'), chunk=chunk).value()
        with pytest.raises(MalformedInput, match="not valid UTF-8 at byte 2"):
            StreamParser(io.BytesIO(b'["\xc3'), chunk=chunk).value()


def test_it_refuses_a_document_of_tiny_values_past_its_budget():
    document = "[" + ",".join(["{}"] * 100_000) + "]"  # 300 KB of text, some 7 MB once parsed
    with pytest.raises(InputTooLarge, match="more than 1,000,000 bytes of memory once parsed .TEST_SETTING."):
        load(io.BytesIO(document.encode()), budget=ParseBudget(1_000_000, "TEST_SETTING"))
    assert len(load(io.BytesIO(document.encode()), budget=ParseBudget(20_000_000))) == 100_000


class _Counted(io.BytesIO):
    """A file that remembers how many bytes were read from it."""

    read_bytes = 0

    def readline(self, size: int | None = -1) -> bytes:
        line = super().readline(size)
        self.read_bytes += len(line)
        return line


@pytest.mark.parametrize("limit, budget, message", [
    (1_000_000, None, "big.jsonl line 2 is longer than the 1,000,000-byte limit for one line .TEST_LINE."),
    (64_000_000, 500_000, "the JSON in big.jsonl line 2 would take more than 500,000 bytes of memory once parsed"),
])
def test_it_refuses_a_long_line_at_its_first_piece_past_the_limit(limit, budget, message):
    fh = _Counted(b'{"a": 1}\n"' + b"x" * 20_000_000 + b'"\n{"b": 2}\n')
    lines = bounded_lines(fh, ParseBudget(budget, line_bytes=limit, line_text="TEST_LINE"), "big.jsonl")
    assert next(lines)[:2] == (1, 0)
    with pytest.raises(InputTooLarge, match=message):
        next(lines)
    # Read up to the limit and one piece past it, never the 20 MB line.
    assert fh.read_bytes <= (budget or limit) + 2 * LINE_PIECE


def test_it_reads_lines_with_their_numbers_and_offsets():
    fh = io.BytesIO(b'{"a": 1}\n\n[2]\nlast')
    assert list(bounded_lines(fh, ParseBudget(None, line_bytes=10))) == [
        (1, 0, b'{"a": 1}\n'), (2, 9, b"\n"), (3, 10, b"[2]\n"), (4, 14, b"last")]
