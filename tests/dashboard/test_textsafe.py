from __future__ import annotations

from contextlab.lib import textsafe


def test_it_strips_ansi_escape_codes():
    assert textsafe.clean("\x1b[31mred\x1b[0m and \x1b]0;title\x07plain") == "red and plain"


def test_it_makes_other_control_characters_visible():
    assert textsafe.clean("a\x00b\x08c\td\ne") == "a\ufffdb\ufffdc\td\ne"


def test_it_collapses_long_outputs_after_the_first_lines():
    text = "\n".join(f"line {i}" for i in range(100))
    preview = textsafe.preview(text, head_lines=5)
    assert preview.head == "\n".join(f"line {i}" for i in range(5))
    assert preview.collapsed and preview.lines == 100
    assert preview.head + preview.rest == text


def test_it_keeps_short_outputs_whole():
    preview = textsafe.preview("one\ntwo")
    assert not preview.collapsed and preview.head == "one\ntwo"


def test_it_clips_huge_outputs():
    preview = textsafe.preview("x" * 100_000, max_chars=1_000)
    assert preview.clipped and len(preview.head) + len(preview.rest) == 1_000


def test_it_makes_one_line_excerpts():
    assert textsafe.excerpt("a\n\n  b\tc", 10) == "a b c"
    assert textsafe.excerpt("word " * 20, 12) == "word word w…"
