"""The default policy's own claim: it compacts no more often than CoPaw, on every row of a corpus
built to make that hard (``tests/engine/hard_corpus.py``), and never sends more than the window."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contextlab.engine.profile import Profile
from contextlab.engine.replay import replay_transcript
from tests.engine.hard_corpus import SCENARIOS, WINDOWS, write_transcript

# Rows where the claim does not hold yet. Records, hashes and CJK text have fewer bytes a token
# than CoPaw's estimate assumes: it undercounts them, waits, and then sends more than the window
# (its overshoot is reproduced, not fixed); this policy, bound by the window, compacts sooner.
NOT_YET = {("dense", 8_000), ("chinese", 16_000)}
# "mixed" strings all the others together: the benchmark replays it (it takes a minute).
ROWS = [pytest.param(name, window, marks=[pytest.mark.xfail(strict=True, reason="CoPaw undercounts dense text")]
                     if (name, window) in NOT_YET else [])
        for name in SCENARIOS if name != "mixed" for window in WINDOWS]


def _replay(path: Path, out: Path, window: int, policy: str) -> tuple[int, int]:
    report = replay_transcript(path, out, profile=Profile(max_input_length=window, policy=policy))
    peak = max(json.loads(line)["payload"]["tokens"]["total"]
               for line in (out / "trace.jsonl").read_text(encoding="utf-8").splitlines())
    return report.compactions, peak


@pytest.mark.parametrize(("name", "window"), ROWS)
def test_it_compacts_no_more_often_than_copaw(tmp_path: Path, name: str, window: int) -> None:
    path = write_transcript(name, window, tmp_path)
    copaw, _ = _replay(path, tmp_path / "copaw", window, "copaw")
    ours, peak = _replay(path, tmp_path / "contextlab", window, "contextlab")
    assert ours <= copaw, f"{name} at {window:,}: contextlab {ours} compactions, copaw {copaw}"
    assert peak <= window


def test_the_corpus_is_the_same_every_time(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_transcript("mixed", 8_000, tmp_path / "a")
    assert first.read_bytes() == write_transcript("mixed", 8_000, tmp_path / "b").read_bytes()
