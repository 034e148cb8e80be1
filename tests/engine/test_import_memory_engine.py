"""Issue 30, item 1, in the engine: a transcript file is parsed as it is read.

Peaks are measured in-process: ``tracemalloc`` for every Python allocation, and
the resident set (``VmHWM`` after resetting it through ``/proc/self/clear_refs``)
where Linux offers it. The honest files hold a few characters beyond Latin-1
(a typographic apostrophe), as real transcripts do: read whole, such a file's
text takes two bytes a character on top of its bytes and its parsed value.
"""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contextlab.engine.core.errors import ContextLabError, InputTooLarge
from contextlab.engine.importers import load_transcript
from contextlab.engine.importers._common import PARSED_FACTOR, PARSED_SLACK
from contextlab.engine.importers.release import release_memory

MB = 1024 * 1024
# Besides the parsed file: the engine's messages of the few records, one piece of the file.
CONSTANT = 8 * MB
# The resident set also counts the interpreter's and allocator's own slack.
RSS_CONSTANT = 24 * MB


def _peak(work: Callable[[], Any]) -> tuple[int, Any]:
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        try:
            result: Any = work()
        except ContextLabError as exc:
            result = exc
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak, result


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def _rss_peak(work: Callable[[], Any]) -> int:
    """How far the resident set rose above where it was while ``work`` ran."""
    release_memory()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
        base = _status("VmRSS")
    except (OSError, LookupError):
        pytest.skip("no /proc/self/clear_refs to reset the peak resident set")
    result = work()
    peak = _status("VmHWM") - base
    del result
    return peak


def _tool_output(n: int) -> str:
    return "\n".join(f"line {i} of log {n}: step {i % 17} finished with status {i % 3}" for i in range(6_000))


def _honest_json(path: Path, megabytes: int) -> Path:
    """One JSON array of OpenAI messages on one line (what json.dumps writes), mostly long tool outputs."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Find why the nightly build doesn’t pass."}]
    n = 0
    size = 0
    while size < megabytes * MB:
        call = f"call_{n}"
        messages.append({"role": "assistant", "content": f"I’ll read log {n}.", "tool_calls": [
            {"id": call, "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"n": n})}}]})
        output = _tool_output(n)
        messages.append({"role": "tool", "tool_call_id": call, "content": output})
        size += len(output) + 200
        n += 1
    messages.append({"role": "assistant", "content": "The nightly build fails at step 2."})
    path.write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
    return path


def _honest_sse(path: Path, megabytes: int) -> Path:
    """A DeerFlow event stream: a question, then long answers streamed in chunks of a few KB."""
    thread = "T1"
    lines = ["event: message_chunk",
             "data: " + json.dumps({"thread_id": thread, "id": "run-0", "role": "user",
                                    "content": "What’s in the logs?", "finish_reason": "stop"}), ""]
    size, n = 0, 0
    while size < megabytes * MB:
        n += 1
        for piece in range(40):
            chunk = {"thread_id": thread, "agent": "reporter", "id": f"run-{n}", "role": "assistant",
                     "content": _tool_output(n)[piece * 6_000:(piece + 1) * 6_000]}
            if piece == 39:
                chunk["finish_reason"] = "stop"
            lines += ["event: message_chunk", "data: " + json.dumps(chunk, ensure_ascii=False), ""]
            size += 6_100
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_it_parses_a_large_json_transcript_in_about_its_own_size(tmp_path):
    path = _honest_json(tmp_path / "honest.json", 16)
    size = path.stat().st_size
    peak, transcript = _peak(lambda: load_transcript(path))
    assert transcript.format == "openai_messages", transcript
    assert len(transcript.messages) > 100
    assert peak <= 2 * size + CONSTANT, f"peak {peak / MB:.1f} MB for {size / MB:.1f} MB"
    rss = _rss_peak(lambda: load_transcript(path))
    assert rss <= 2 * size + RSS_CONSTANT, f"resident set +{rss / MB:.1f} MB for {size / MB:.1f} MB"


def test_it_parses_a_large_event_stream_in_about_its_own_size(tmp_path):
    path = _honest_sse(tmp_path / "stream.txt", 12)
    size = path.stat().st_size
    peak, transcript = _peak(lambda: load_transcript(path))
    assert transcript.format == "deerflow_sse", transcript
    assert len(transcript.messages) >= 2
    assert peak <= 2 * size + CONSTANT, f"peak {peak / MB:.1f} MB for {size / MB:.1f} MB"


@pytest.mark.parametrize("tiny", ["{}", "[]", "0", '""'])
def test_it_refuses_a_json_document_of_tiny_values(tmp_path, tiny):
    # 3 MB of text that would take 40 to 75 MB once parsed.
    path = tmp_path / "bomb.json"
    path.write_text('{"messages": [' + ",".join([tiny] * (3 * MB // (len(tiny) + 1))) + "]}")
    size = path.stat().st_size
    peak, result = _peak(lambda: load_transcript(path))
    assert isinstance(result, InputTooLarge), result
    assert result.message.startswith(f"the JSON in the file would take more than {PARSED_FACTOR * size + PARSED_SLACK:,} "
                                      f"bytes of memory once parsed ({PARSED_FACTOR} × the file's {size:,} bytes"), result
    assert peak <= PARSED_FACTOR * size + PARSED_SLACK + CONSTANT, f"peak {peak / MB:.1f} MB"


def test_it_refuses_an_event_stream_of_tiny_values(tmp_path):
    path = tmp_path / "bomb.txt"
    events = ["event: message_chunk\ndata: [" + ",".join(["{}"] * 200_000) + "]\n" for _ in range(5)]
    path.write_text("\n".join(events))
    size = path.stat().st_size
    peak, result = _peak(lambda: load_transcript(path))
    assert isinstance(result, InputTooLarge), result
    # Each event alone passes the budget of twice the file: the first is refused.
    assert "the JSON in event 0 (line 1) would take more than" in result.message, result.message
    assert peak <= PARSED_FACTOR * size + PARSED_SLACK + CONSTANT, f"peak {peak / MB:.1f} MB"


def test_it_tells_a_one_line_document_from_json_lines(tmp_path):
    single = tmp_path / "single.json"
    single.write_text('\n\n[{"role": "user", "content": "hi"}]\n\n')
    assert load_transcript(single).format == "openai_messages"
    lines = tmp_path / "lines.jsonl"
    lines.write_text('\n{"role": "user", "content": "hi"}\n{"role": "assistant", "content": "yo"}\n')
    assert [m.plain_text() for m in load_transcript(lines).messages] == ["hi", "yo"]
    for text, error in [('[{"role": "user", "content": "hi"}] []', "line 1, column 37: Extra data"),
                        ('[\n{"role": "user", "content": "hi"}]\n[]', "line 3, column 1: Extra data"),
                        ('{"role": "user", "content": "hi"}\n{"role": "user",', "line 2")]:
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ContextLabError, match=error):
            load_transcript(bad)
