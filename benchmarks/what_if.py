"""What a profile's what-if costs: the engine side of a replay, capped at 200 turns.

A what-if replays a session's messages turn by turn on a fresh engine in a
temporary folder, with the extractive compactor (no model call). This times
that replay (``contextlab.engine.replay.whatif.replay_by_turn``) on corpus
transcripts cut into turns before each assistant message, as a recorded
session's turns are, at an 8,000-token window, and prints turns, compactions
and milliseconds per turn. The web job adds reading the rows and the loss
check per compaction. Run: ``.venv/bin/python benchmarks/what_if.py``.
"""

from __future__ import annotations

import platform
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contextlab.engine.compactors.extractive import ExtractiveCompactor  # noqa: E402
from contextlab.engine.core.messages import Message  # noqa: E402
from contextlab.engine.core.profile import Profile  # noqa: E402
from contextlab.engine.hook import ContextManager  # noqa: E402
from contextlab.engine.importers import load_transcript  # noqa: E402
from contextlab.engine.replay.whatif import TurnInput, replay_by_turn  # noqa: E402
from tests.corpus import corpus_path  # noqa: E402

MAX_TURNS = 200
TRANSCRIPTS = (
    "marot-spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46.jsonl",
    "openhands/multi_swe_bench_output.ponylang__ponyc-4588.jsonl",
    "tau-bench/gpt-4o-airline.idx52.task2.trial1.json",
)


def turns_of(messages: Sequence[Message]) -> Iterator[TurnInput]:
    """Turn boundaries as a live agent makes them: the hook runs before each assistant message."""
    pending: list[Message] = []
    for message in messages:
        if message.role == "assistant" and pending:
            yield TurnInput("auto", pending)
            pending = []
        pending.append(message)
    if pending:
        yield TurnInput("auto", pending)


def main() -> None:
    print(f"what-if replay, 8,000-token window, extractive compactor, at most {MAX_TURNS} turns "
          f"({platform.python_version()}, {platform.machine()})")
    print(f"{'transcript':62} {'turns':>6} {'compactions':>12} {'seconds':>8} {'ms/turn':>8}")
    for name in TRANSCRIPTS:
        source = load_transcript(corpus_path(name))
        inputs = list(turns_of(source.messages))[:MAX_TURNS]
        with tempfile.TemporaryDirectory() as folder:
            manager = ContextManager(Profile(max_input_length=8_000), folder, system_prompt=source.system_prompt or "",
                                     compactor=ExtractiveCompactor(), memory_workspace=False)
            started = time.perf_counter()
            replayed = list(replay_by_turn(inputs, manager))
            seconds = time.perf_counter() - started
        compactions = sum(t.did_compact for t in replayed)
        stopped = next((f" stopped: {t.error}" for t in replayed if t.error), "")
        print(f"{name[-62:]:62} {len(replayed):6} {compactions:12} {seconds:8.2f} "
              f"{1000 * seconds / max(len(replayed), 1):8.1f}{stopped}")


if __name__ == "__main__":
    main()
