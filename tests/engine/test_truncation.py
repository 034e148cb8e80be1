from __future__ import annotations

import datetime as dt
import os

from hypothesis import given
from hypothesis import strategies as st

from contextlab.engine.stages.truncation import MARKER, OffloadStore, count_lines, cut_text, utf8_prefix


def lines(n: int, width: int = 20) -> str:
    return "".join(f"L{i}".ljust(width - 1, "_") + "\n" for i in range(1, n + 1))


def test_it_cuts_on_a_line_boundary_and_reports_the_true_byte_count() -> None:
    text = lines(10)
    cut = cut_text(text, max_bytes=95, file_path="tool_result/x.txt")
    excerpt = cut.text.split(MARKER)[0]
    assert excerpt == lines(4)
    assert cut.kept_bytes == 80
    assert "covers the next 80 bytes" in cut.text
    assert "start_line=5 to read more" in cut.text
    assert cut.boundary == "line"
    assert cut.total_lines == 10


def test_it_gives_a_single_long_line_a_notice_with_a_byte_offset() -> None:
    text = "x" * 500
    cut = cut_text(text, max_bytes=100, file_path="tool_result/x.txt")
    assert MARKER in cut.text
    assert cut.boundary == "character"
    assert "continues at byte offset 100" in cut.text
    assert "start_line=1 to read more" in cut.text


def test_it_never_splits_a_multibyte_character() -> None:
    text = "中文中文中文\n中文中文中文\n中文中文中文\n"
    cut = cut_text(text, max_bytes=24, file_path="f")
    cut.text.encode("utf-8")  # would raise on a broken sequence
    assert cut.text.startswith("中文中文中文\n")
    assert cut.kept_bytes == 19


def test_it_counts_lines_like_a_person() -> None:
    assert count_lines("") == 0
    assert count_lines("a") == 1
    assert count_lines("a\n") == 1
    assert count_lines("a\nb") == 2


def test_it_offsets_lines_for_read_file_excerpts() -> None:
    cut = cut_text(lines(10), max_bytes=95, file_path="/src/app.py", start_line=41, total_lines=200)
    assert "starts at line 41" in cut.text
    assert "start_line=45 to read more" in cut.text
    assert "contains 200 lines" in cut.text


TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=400)


@given(TEXT, st.integers(min_value=1, max_value=300))
def test_it_keeps_a_valid_utf8_prefix_of_the_original(text: str, limit: int) -> None:
    raw = text.encode("utf-8")
    prefix = utf8_prefix(raw, limit)
    assert raw.startswith(prefix) and len(prefix) <= limit
    prefix.decode("utf-8")  # never a broken character
    if len(raw) > limit:
        cut = cut_text(text, max_bytes=limit, file_path="f")
        excerpt = cut.text.split(MARKER)[0]
        kept = excerpt if cut.boundary == "line" else excerpt[: len(excerpt) - 1 if excerpt.endswith("\n") and
                                                                 not text.startswith(excerpt) else None]
        assert text.startswith(kept)
        assert len(kept.encode("utf-8")) == cut.kept_bytes
        assert f"covers the next {cut.kept_bytes} bytes" in cut.text


def test_it_stores_originals_once_and_never_outside_the_workspace(tmp_path) -> None:
    store = OffloadStore(tmp_path)
    saved = store.save("full text", name="abc")
    assert saved.relative == "tool_result/abc.txt"
    assert store.read(saved.relative) == "full text"
    try:
        store.resolve("../../etc/passwd")
    except ValueError as exc:
        assert "outside the workspace" in str(exc)
    else:
        raise AssertionError("a path outside the workspace was accepted")


def test_it_cleans_expired_files_but_spares_referenced_ones(tmp_path) -> None:
    store = OffloadStore(tmp_path)
    old = store.save("old", name="old")
    kept = store.save("kept", name="kept")
    fresh = store.save("fresh", name="fresh")
    now = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    forty_days_ago = (now - dt.timedelta(days=40)).timestamp()
    for item in (old, kept):
        os.utime(item.path, (forty_days_ago, forty_days_ago))
    removed = store.cleanup_expired(retention_days=30, referenced={kept.relative}, now=now)
    assert removed == [old.relative]
    assert kept.path.exists() and fresh.path.exists() and not old.path.exists()
