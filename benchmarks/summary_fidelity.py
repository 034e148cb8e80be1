"""How many identifiers the summaries keep, on every corpus transcript.

Identifiers are what ``contextlab.engine.stages.summary.identifiers.extract_identifiers``
finds (paths, commands, symbols, error names, numbers with units, in user
text, assistant text and short tool-call arguments; its docstring is the
definition). For every compaction of a replay (``contextlab`` policy, the
extractive compactor, so no model and no network), the identifiers of the
compacted span are looked up:

* **in summary**: in the summary text itself (whitespace collapsed);
* **kept**: in the summary, or in the identifier index the summary names
  (``dialog/identifiers.md``, written by the post-check every compactor's
  summary passes). The goal is >= 95 %.

A blind measure grades the same summaries without the engine's definition:
every whitespace-separated token of what the user and the assistant wrote
that looks like something one would search for (letters with digits, a
slash, an underscore, an @, an inner dot or capital), case folded, found in
the summary or in the index it names.

A second table compares with Claude Code's own compaction, for the two
corpus sessions that hold one: the span before its compact boundary is
summarised in one go (extractive + post-check, at Claude Code's 200k window)
and both summaries are scored on the same identifiers; "base" also accepts a
path's last part.

Run: ``.venv/bin/python benchmarks/summary_fidelity.py`` (``--windows 16000``
for one window, ``--quick`` for the small transcripts only).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contextlab.engine.compactors.base import SummaryRequest  # noqa: E402
from contextlab.engine.compactors.extractive import ExtractiveCompactor  # noqa: E402
from contextlab.engine.core.messages import Message, TextBlock  # noqa: E402
from contextlab.engine.core.profile import Profile  # noqa: E402
from contextlab.engine.importers import load_transcript  # noqa: E402
from contextlab.engine.replay.transcript import replay_transcript  # noqa: E402
from contextlab.engine.stages.summary.identifiers import (  # noqa: E402
    INDEX_FILE,
    KINDS,
    base_name_kept,
    extract_identifiers,
    fold,
    keep_identifiers,
    line_chars_for_window,
    normalize,
)
from tests.corpus import CORPUS, TRANSCRIPTS  # noqa: E402

WINDOWS = (8_000, 16_000, 32_000)
SHORT = {"kind": "kind", "path": "path", "command": "cmd", "symbol": "sym", "error": "err", "number": "num",
         "url": "url", "email": "mail", "hash": "hash", "version": "ver", "code": "code", "quoted": "quot",
         "token": "tok"}


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}" if whole else "    -"


def score_replay(relative: str, window: int, work: Path) -> dict[str, object]:
    path = CORPUS / relative
    messages = {m.id: m for m in load_transcript(path).messages}
    out = work / f"{Path(relative).stem[:24]}-{window}"
    started = time.perf_counter()
    report = replay_transcript(path, out, profile=Profile(max_input_length=window), overwrite=True)
    seconds = time.perf_counter() - started
    summaries = json.loads((out / "summaries.json").read_text(encoding="utf-8"))
    index_path = out / INDEX_FILE
    index = index_path.read_text(encoding="utf-8") if index_path.exists() else ""
    total: Counter[str] = Counter()
    in_summary: Counter[str] = Counter()
    kept: Counter[str] = Counter()
    blind = Counter[str]()
    chars = 0
    folded_index = fold(index)
    for version in summaries:
        span = [messages[mid] for mid in version["compacted_ids"] if mid in messages]
        text = normalize(version["text"])
        names_index = INDEX_FILE in text
        chars += len(version["text"])
        for item in extract_identifiers(span):
            total[item.kind] += 1
            found = item.value in text
            in_summary[item.kind] += found
            kept[item.kind] += found or (names_index and f"`{item.value}`" in index)
        folded = fold(version["text"])
        for token in blind_tokens(span):
            blind["total"] += 1
            found = token in folded
            blind["in_summary"] += found
            blind["kept"] += found or (names_index and token in folded_index)
    return {"transcript": relative, "window": window, "compactions": report.compactions,
            "total": total, "in_summary": in_summary, "kept": kept, "seconds": seconds, "blind": blind,
            "mean_chars": chars // len(summaries) if summaries else 0}


# -- the blind measure ---------------------------------------------------------------------------
# Written without the definition the engine uses, so that the index is not graded by its own rule:
# every whitespace-separated token of what the user and the assistant wrote that looks like
# something one would search for again (letters with digits, a slash, an underscore, an @, a
# dot inside a word, an inner capital), with its punctuation stripped.
_EDGE = "\"'`()[]{}<>,;:.!?*#"
_COLOUR = re.compile("\x1b\\[[0-9;]*m")
_SALIENT = re.compile(r"(?=.*[A-Za-z])(?:.*\d|.*[/_@]|.*\w\.\w|.*[a-z][A-Z])")


def blind_tokens(span: list[Message]) -> set[str]:
    """The salient tokens of a compacted span (case folded), each once."""
    found: set[str] = set()
    for message in span:
        if message.role not in ("user", "assistant") or message.is_tool_result:
            continue
        for block in message.content:
            if not isinstance(block, TextBlock):
                continue
            for raw in _COLOUR.sub(" ", block.text).split():
                token = raw.strip(_EDGE)
                if 3 <= len(token) <= 120 and _SALIENT.match(token) and "://" not in token[:3]:
                    found.add(token.casefold())
    return found


def replay_table(rows: list[dict[str, object]]) -> str:
    head = (f"| {'transcript':<44} | window | comp. | ids | in summary % | kept % | "
            + " | ".join(f"{SHORT[k]} %" for k in KINDS) + " | mean summary chars |")
    lines = [head, "|" + "|".join("---" for _ in range(7 + len(KINDS))) + "|"]
    grand_total, grand_in, grand_kept = 0, 0, 0
    for row in rows:
        total: Counter[str] = row["total"]  # type: ignore[assignment]
        in_summary: Counter[str] = row["in_summary"]  # type: ignore[assignment]
        kept: Counter[str] = row["kept"]  # type: ignore[assignment]
        n, s, k = sum(total.values()), sum(in_summary.values()), sum(kept.values())
        grand_total, grand_in, grand_kept = grand_total + n, grand_in + s, grand_kept + k
        name = str(row["transcript"])
        name = name if len(name) <= 44 else "…" + name[-43:]
        kinds = " | ".join(f"{_pct(in_summary[kind], total[kind]):>5}" for kind in KINDS)
        lines.append(f"| {name:<44} | {row['window']:>6,} | {row['compactions']:>5} | {n:>4} | "
                     f"{_pct(s, n):>12} | {_pct(k, n):>6} | {kinds} | {row['mean_chars']:>18,} |")
    lines.append(f"| {'all':<44} |        |       | {grand_total:>4} | {_pct(grand_in, grand_total):>12} | "
                 f"{_pct(grand_kept, grand_total):>6} | " + " | ".join("" for _ in KINDS) + " |                    |")
    return "\n".join(lines)


def blind_table(rows: list[dict[str, object]]) -> str:
    lines = ["| window | compactions | salient tokens | in summary % | in summary or its index % |", "|---|---|---|---|---|"]
    for window in sorted({int(r["window"]) for r in rows}):  # type: ignore[call-overload]
        blind: Counter[str] = Counter()
        compactions = 0
        for row in rows:
            if row["window"] == window:
                blind.update(row["blind"])  # type: ignore[arg-type]
                compactions += int(row["compactions"])  # type: ignore[call-overload]
        lines.append(f"| {window:,} | {compactions} | {blind['total']} | {_pct(blind['in_summary'], blind['total'])} | "
                     f"{_pct(blind['kept'], blind['total'])} |")
    return "\n".join(lines)


def window_table(rows: list[dict[str, object]]) -> str:
    lines = ["| window | compactions | ids | in summary % | kept % | " + " | ".join(f"{SHORT[k]} %" for k in KINDS)
             + " |", "|" + "|".join("---" for _ in range(5 + len(KINDS))) + "|"]
    for window in sorted({int(r["window"]) for r in rows}):  # type: ignore[call-overload]
        total: Counter[str] = Counter()
        in_summary: Counter[str] = Counter()
        kept: Counter[str] = Counter()
        compactions = 0
        for row in rows:
            if row["window"] == window:
                total.update(row["total"])  # type: ignore[arg-type]
                in_summary.update(row["in_summary"])  # type: ignore[arg-type]
                kept.update(row["kept"])  # type: ignore[arg-type]
                compactions += int(row["compactions"])  # type: ignore[call-overload]
        n = sum(total.values())
        kinds = " | ".join(_pct(in_summary[k], total[k]) for k in KINDS)
        lines.append(f"| {window:,} | {compactions} | {n} | {_pct(sum(in_summary.values()), n)} | "
                     f"{_pct(sum(kept.values()), n)} | {kinds} |")
    return "\n".join(lines)


def reference_rows() -> list[str]:
    lines = ["| session | ids | summary | chars | kept % | base % | " + " | ".join(f"{SHORT[k]} %" for k in KINDS)
             + " |", "|" + "|".join("---" for _ in range(6 + len(KINDS))) + "|"]
    for relative in TRANSCRIPTS:
        messages = load_transcript(CORPUS / relative).messages
        boundary = next((i for i, m in enumerate(messages) if m.metadata.get("compact_boundary")), None)
        if boundary is None or boundary + 1 >= len(messages):
            continue
        span = messages[:boundary]
        identifiers = extract_identifiers(span)
        reference = messages[boundary + 1].plain_text()
        ours = ExtractiveCompactor().summarize(SummaryRequest(span, None, "auto")).text
        check = keep_identifiers(ours, span, version=1, line_chars=line_chars_for_window(200_000))
        for label, text in (("Claude Code", reference), ("extractive alone", ours),
                            ("extractive + post-check", check.summary)):
            flat = normalize(text)
            kept = Counter(i.kind for i in identifiers if i.value in flat)
            base = sum(1 for i in identifiers if base_name_kept(i, flat))
            total = Counter(i.kind for i in identifiers)
            kinds = " | ".join(_pct(kept[k], total[k]) for k in KINDS)
            lines.append(f"| {Path(relative).stem[:8]} | {len(identifiers)} | {label} | {len(text):,} | "
                         f"{_pct(sum(kept.values()), len(identifiers))} | {_pct(base, len(identifiers))} | {kinds} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, nargs="+", default=list(WINDOWS))
    parser.add_argument("--quick", action="store_true", help="skip the three long Claude Code sessions")
    args = parser.parse_args()
    transcripts = [t for t in TRANSCRIPTS if not (args.quick and t.count("/") == 1 and t.endswith(".jsonl")
                                                   and t.startswith("marot"))]
    rows = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for window in args.windows:
            for relative in transcripts:
                rows.append(score_replay(relative, window, Path(tmp)))
    print("Identifiers of each compacted span kept by the summary that replaced it "
          "(contextlab policy, extractive compactor):\n")
    print(replay_table(rows))
    print("\nAll transcripts, per window:\n")
    print(window_table(rows))
    print("\nBlind measure (salient tokens found without the engine's definition), per window:\n")
    print(blind_table(rows))
    print("\nThe same identifiers against Claude Code's own compaction of the same span:\n")
    print("\n".join(reference_rows()))
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
