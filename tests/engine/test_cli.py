from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contextlab.cli import main
from contextlab.engine.core.profile import Profile
from tests.corpus import REPO, corpus_path

TAU = "tau-bench/gpt-4o-airline.idx52.task2.trial1.json"


def test_it_replays_with_python_dash_m_and_shows_progress(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "contextlab", "replay", str(corpus_path(TAU)), "--out", str(out),
         "--max-input-length", "4000", "--policy", "contextlab"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "tau_bench, 61 messages" in done.stdout and "compaction(s)" in done.stdout
    assert "message 61/61 (100%)" in done.stderr  # progress on stderr
    final = json.loads((out / "final_context.json").read_text())
    assert {"messages", "summary", "live_message_ids", "archived_message_ids"} <= set(final)
    assert final["messages"][0]["role"] == "system"
    assert (out / "trace.jsonl").read_text().count("\n") == final["turns"]


def test_it_reads_a_profile_file_and_lets_flags_override_it(tmp_path: Path, capsys) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"max_input_length": 50_000, "policy": "copaw", "recent_n": 2}))
    code = main(["replay", str(corpus_path(TAU)), "--out", str(tmp_path / "o"), "--profile", str(profile),
                 "--max-input-length", "6000", "--quiet"])
    assert code == 0
    final = json.loads((tmp_path / "o" / "final_context.json").read_text())
    assert final["policy"] == "copaw"
    assert final["profile"]["max_input_length"] == 6000 and final["profile"]["recent_n"] == 2


def test_it_explains_bad_input_in_one_line(tmp_path: Path, capsys) -> None:
    unknown = tmp_path / "notes.csv"
    unknown.write_text("a,b\n1,2\n")
    assert main(["replay", str(unknown), "--out", str(tmp_path / "o1"), "--quiet"]) == 2
    assert "contextlab: error:" in capsys.readouterr().err

    broken = tmp_path / "broken.json"
    broken.write_text('[{"role": "user", "content": "hi"},')
    assert main(["replay", str(broken), "--out", str(tmp_path / "o2"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "line 1" in err and "column" in err

    not_utf8 = tmp_path / "latin1.json"
    not_utf8.write_bytes(b'[{"role": "user", "content": "caf\xe9"}]')
    assert main(["replay", str(not_utf8), "--out", str(tmp_path / "o3"), "--quiet"]) == 2
    assert "UTF-8" in capsys.readouterr().err

    missing = tmp_path / "nope.jsonl"
    assert main(["replay", str(missing), "--out", str(tmp_path / "o4"), "--quiet"]) == 2
    assert "nope.jsonl" in capsys.readouterr().err

    bad_profile = tmp_path / "bad.json"
    bad_profile.write_text(json.dumps({"compact_ratio": 0.3, "reserve_ratio": 0.3}))
    assert main(["replay", str(corpus_path(TAU)), "--out", str(tmp_path / "o5"), "--profile",
                 str(bad_profile), "--quiet"]) == 2
    assert "reserve_ratio" in capsys.readouterr().err


def test_it_will_not_mix_two_replays_in_one_folder(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["replay", str(corpus_path(TAU)), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["replay", str(corpus_path(TAU)), "--out", str(out), "--quiet"]) == 2
    assert "already holds a replay" in capsys.readouterr().err
    assert main(["replay", str(corpus_path(TAU)), "--out", str(out), "--quiet", "--overwrite"]) == 0
    lines = (out / "dialog").glob("*.jsonl") if (out / "dialog").exists() else []
    ids = [json.loads(line)["id"] for path in lines for line in path.read_text().splitlines()]
    assert len(ids) == len(set(ids))


def test_it_refuses_an_out_that_is_a_file_without_a_traceback(tmp_path: Path, capsys) -> None:
    existing = tmp_path / "result.txt"
    existing.write_text("keep me")
    for command in ("replay", "compare"):
        assert main([command, str(corpus_path(TAU)), "--out", str(existing)]
                    + (["--quiet"] if command == "replay" else [])) == 2
        err = capsys.readouterr().err
        assert "is a file, not a folder" in err and "Traceback" not in err
    assert existing.read_text() == "keep me"


def test_it_leaves_no_folder_behind_when_a_replay_fails(tmp_path: Path) -> None:
    from contextlab.engine.replay.transcript import replay_transcript

    out = tmp_path / "new" / "out"

    def interrupt(result) -> None:
        if result.trace.turn == 3:
            raise KeyboardInterrupt  # the person pressed Ctrl-C

    with pytest.raises(KeyboardInterrupt):
        replay_transcript(corpus_path(TAU), out, on_turn=interrupt)
    assert not out.exists()

    kept = tmp_path / "mine"
    kept.mkdir()
    (kept / "notes.md").write_text("mine")
    with pytest.raises(KeyboardInterrupt):
        replay_transcript(corpus_path(TAU), kept, on_turn=interrupt)
    assert (kept / "notes.md").read_text() == "mine"  # a folder we did not create is not removed


def test_it_overwrites_every_file_of_an_earlier_run(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["replay", str(corpus_path(TAU)), "--out", str(out), "--quiet", "--policy", "eviction",
                 "--max-input-length", "4000"]) == 0
    assert any((out / "externalized").iterdir())
    (out / "memory").mkdir()
    (out / "memory" / "2020-01-01.md").write_text("- an old note\n")
    (out / "compact_invalid_0000aaaa.json").write_text("{}")

    assert main(["replay", str(corpus_path(TAU)), "--out", str(out), "--quiet", "--overwrite",
                 "--policy", "contextlab", "--max-input-length", "4000"]) == 0

    assert not (out / "externalized").exists() and not (out / "memory" / "2020-01-01.md").exists()
    assert not (out / "compact_invalid_0000aaaa.json").exists()


def test_it_compares_into_a_folder_without_stale_files(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cmp"
    stale = out / "contextlab" / "externalized" / "old.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")

    assert main(["compare", str(corpus_path(TAU)), "--out", str(out), "--max-input-length", "4000"]) == 0

    assert not stale.exists()
    assert (out / "comparison.json").exists()


def test_it_says_an_empty_list_holds_no_messages(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert main(["replay", str(empty), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "no messages" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("policy", ["contextlab", "copaw"])
def test_it_replays_identically_twice(tmp_path: Path, policy: str) -> None:
    from contextlab.engine.replay.transcript import replay_transcript

    transcript = corpus_path("openhands/multi_swe_bench_output.ponylang__ponyc-4588.jsonl")
    runs = []
    for folder in ("a", "b"):
        replay_transcript(transcript, tmp_path / folder, profile=Profile(max_input_length=8000, policy=policy))
        traces = [json.loads(line) for line in (tmp_path / folder / "trace.jsonl").read_text().splitlines()]
        files = sorted(p.name for p in (tmp_path / folder / "tool_result").glob("*.txt"))
        runs.append(([t["payload"]["tokens"]["total"] for t in traces], files))

    assert runs[0][1], "the replay offloaded no output, so it shows nothing"
    assert runs[0] == runs[1]
