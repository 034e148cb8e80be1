"""Diffs of successive summary versions, and the checks a reviewer needs.

Three questions a reader of summary vK asks, answered without an LLM:

* what changed since v(K-1)? A diff per section (``split_sections`` lines the
  two versions up by heading) and word by word inside each section;
* what exact detail was lost? Identifiers (``contextlab.engine.stages.summary.identifiers``:
  paths, URLs, codes, ids, numbers, names...) present in v(K-1) and absent
  from vK and from the files it names;
* what may have been invented? Sentences of vK whose significant words mostly
  appear in no source: neither the messages compacted into vK nor v(K-1).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from contextlab.engine.stages.summary import identifiers as identifiers_module
from contextlab.engine.stages.summary.validity import split_sections

Op = tuple[str, str]  # ("equal" | "insert" | "delete", text)

# Han, kana and full-width forms carry a word per character; everything else
# is split on whitespace, so a path or a number stays one token.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"
_TOKEN = re.compile(rf"\s+|[{_CJK}]|[^\s{_CJK}]+")


def tokens(text: str) -> list[str]:
    """Whitespace runs, CJK characters and other runs; ``"".join(tokens(t)) == t``."""
    return _TOKEN.findall(text)


def word_diff(old: str, new: str) -> list[Op]:
    """Word-level diff from ``old`` to ``new`` as (op, text) runs.

    Joining the "equal" and "insert" runs gives ``new`` back exactly; joining
    "equal" and "delete" gives ``old``.
    """
    a, b = tokens(old), tokens(new)
    ops: list[Op] = []

    def put(op: str, chunk: Sequence[str]) -> None:
        text = "".join(chunk)
        if not text:
            return
        if ops and ops[-1][0] == op:
            ops[-1] = (op, ops[-1][1] + text)
        else:
            ops.append((op, text))

    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            put("equal", a[i1:i2])
        else:
            # A replacement reads best as "what went, then what came".
            put("delete", a[i1:i2])
            put("insert", b[j1:j2])
    return ops


# Below this share of words in common a rewritten line reads as two sentences, not as one edited.
MIN_LINE_OVERLAP = 0.5


@dataclass(frozen=True, slots=True)
class Row:
    """One row of a section's diff: a run of word ops, or a rewritten line shown as old / new.

    ``kind`` "words": ``ops`` interleave what went and what came (lines that changed a little).
    ``kind`` "lines": ``old`` and ``new`` are the two lines, each as ops, with the words only one
    of them has marked ("delete" in ``old``, "insert" in ``new``).
    """

    kind: str
    ops: list[Op] = field(default_factory=list)
    old: list[Op] = field(default_factory=list)
    new: list[Op] = field(default_factory=list)


def word_overlap(old: str, new: str) -> float:
    """Share of words the two lines have in common, in order (0 to 1)."""
    a = [t for t in tokens(old) if not t.isspace()]
    b = [t for t in tokens(new) if not t.isspace()]
    if not a and not b:
        return 1.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def diff_rows(old: str, new: str, *, min_overlap: float = MIN_LINE_OVERLAP) -> list[Row]:
    """``old`` to ``new`` line by line: a replaced line with little in common (below ``min_overlap``)
    becomes a "lines" row; everything else stays a word diff. Joining every row's target side
    gives ``new`` back, and every source side ``old``."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    rows: list[Row] = []
    pending_old: list[str] = []
    pending_new: list[str] = []

    def flush() -> None:
        if pending_old or pending_new:
            ops = word_diff("".join(pending_old), "".join(pending_new))
            if rows and rows[-1].kind == "words":
                rows[-1].ops.extend(ops)
            else:
                rows.append(Row("words", ops=ops))
            pending_old.clear()
            pending_new.clear()

    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "replace" and i2 - i1 == j2 - j1:
            for old_line, new_line in zip(a[i1:i2], b[j1:j2], strict=True):
                if word_overlap(old_line, new_line) < min_overlap:
                    flush()
                    ops = word_diff(old_line, new_line)
                    rows.append(Row("lines", old=_merged(op for op in ops if op[0] != "insert"),
                                    new=_merged(op for op in ops if op[0] != "delete")))
                else:
                    pending_old.append(old_line)
                    pending_new.append(new_line)
        else:
            pending_old.extend(a[i1:i2])
            pending_new.extend(b[j1:j2])
    flush()
    return rows


def _merged(ops: Iterable[Op]) -> list[Op]:
    merged: list[Op] = []
    for op, text in ops:
        if merged and merged[-1][0] == op:
            merged[-1] = (op, merged[-1][1] + text)
        else:
            merged.append((op, text))
    return merged


def rows_source(rows: Iterable[Row]) -> str:
    return "".join(apply_source(r.ops) if r.kind == "words" else "".join(t for _, t in r.old) for r in rows)


def rows_target(rows: Iterable[Row]) -> str:
    return "".join(apply_target(r.ops) if r.kind == "words" else "".join(t for _, t in r.new) for r in rows)


def apply_target(ops: Iterable[Op]) -> str:
    return "".join(text for op, text in ops if op != "delete")


def apply_source(ops: Iterable[Op]) -> str:
    return "".join(text for op, text in ops if op != "insert")


# -- identifiers -----------------------------------------------------------------------

# The one definition of an identifier (the loss check and the search use it too).
Identifier = identifiers_module.Identifier


def identifiers(text: str) -> list[Identifier]:
    """The exact details a summary must keep, in order of appearance (headings left out)."""
    body = "\n".join(line for line in text.split("\n") if not line.lstrip().startswith("#"))
    return identifiers_module.text_identifiers(body)


def lost_identifiers(old: str, new: str, kept_elsewhere: Sequence[str] = ()) -> list[Identifier]:
    """Identifiers of ``old`` that neither ``new`` nor a file it names (``kept_elsewhere``,
    the texts of the identifier index and offloaded outputs) still contains."""
    texts = [identifiers_module.fold(t) for t in (new, *kept_elsewhere)]
    return [ident for ident in identifiers(old)
            if not any(identifiers_module.mentions(ident.value, t, folded=True) for t in texts)]


# -- support -----------------------------------------------------------------------

# Words that carry no fact: function words, and the vocabulary every summary
# uses for its own structure (a sentence is not supported by "goal" or "done").
_STOPWORD_TEXT = """
a an and are as at be been but by can could did do does for from had has have he her his how i if in into is it
its may might more most must no nor not of on or our out over own she should so some such than that the their them
then there these they this those through to too under until up very was we were what when where which while who
why will with would you your yes also any all each both few just only same other about above after again against
before below between during once here further because being having doing off now new
goal goals constraint constraints preference preferences progress done blocked decision decisions next step steps
critical context key none user assistant request requested asked later summary conversation earlier message
messages tool tools call calls result results file files command commands output outputs work working task tasks
"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_WORD = re.compile(rf"[^\W_]+|[{_CJK}]+")
_CJK_RUN = re.compile(rf"^[{_CJK}]+$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9`\"'(])|(?<=[。！？])")
_BULLET = re.compile(r"^(?:[-*+]\s+|\d+[.)]\s+)?(?:\[[ xX]\]\s+)?")
_EMPTY_BODIES = {"(none)", "none", "n/a", "（无）", "无", "-"}


def significant_words(text: str) -> set[str]:
    """Lower-cased content words (3+ letters, or with a digit), and CJK character pairs."""
    words: set[str] = set()
    for match in _WORD.finditer(text.lower()):
        word = match.group()
        if _CJK_RUN.match(word):
            words.update(word[i:i + 2] for i in range(max(1, len(word) - 1)))
        elif (len(word) >= 3 or any(c.isdigit() for c in word)) and word not in _STOPWORDS:
            words.add(word)
    return words


def sentences(text: str) -> list[tuple[str, str]]:
    """(section heading, sentence) for every statement of a summary, bullets included."""
    found: list[tuple[str, str]] = []
    for heading, body in split_sections(text).items():
        in_fence = False
        for line in body.split("\n"):
            stripped = line.strip()
            if stripped.startswith(("```", "~~~")):
                in_fence = not in_fence
                continue
            if in_fence or not stripped or stripped.startswith("#"):
                continue
            stripped = _BULLET.sub("", stripped)
            if stripped.lower() in _EMPTY_BODIES:
                continue
            for part in _SENTENCE_END.split(stripped):
                if part.strip():
                    found.append((heading, part.strip()))
    return found


@dataclass(frozen=True, slots=True)
class Unsupported:
    section: str
    sentence: str
    support: float  # share of the sentence's significant words found in a source
    missing: list[str] = field(default_factory=list)


def unsupported_sentences(summary: str, sources: Iterable[str], *, min_support: float = 0.34,
                          min_words: int = 2) -> list[Unsupported]:
    """Sentences of ``summary`` whose significant words mostly appear in no source.

    A sentence with fewer than ``min_words`` significant words says too little
    to judge and is never flagged. The threshold is deliberately low: the point
    is to catch statements with nothing behind them (an invented user request),
    not paraphrase.
    """
    vocabulary: set[str] = set()
    for source in sources:
        vocabulary |= significant_words(source)
    flagged: list[Unsupported] = []
    for section, sentence in sentences(summary):
        words = significant_words(sentence)
        if len(words) < min_words:
            continue
        found = words & vocabulary
        support = len(found) / len(words)
        if support < min_support:
            flagged.append(Unsupported(section, sentence, round(support, 2), sorted(words - found)))
    return flagged


# -- per section -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SectionDiff:
    heading: str
    status: str  # same | changed | added | removed
    ops: list[Op]
    lost: list[Identifier]
    rows: list[Row] = field(default_factory=list)  # the same diff, rewritten lines shown old / new


def section_diffs(old: str, new: str, kept_elsewhere: Sequence[str] = ()) -> list[SectionDiff]:
    """Each section of ``new`` (in its order, then sections only ``old`` has) against ``old``."""
    before = split_sections(old) if old else {}
    after = split_sections(new)
    result: list[SectionDiff] = []
    for heading in [*after, *(h for h in before if h not in after)]:
        old_body, new_body = before.get(heading), after.get(heading)
        if old_body is None:
            status = "added"
        elif new_body is None:
            status = "removed"
        else:
            status = "same" if old_body == new_body else "changed"
        ops = word_diff(old_body or "", new_body or "")
        lost = lost_identifiers(old_body, new or "", kept_elsewhere) if old_body else []
        result.append(SectionDiff(heading or "(before the first heading)", status, ops, lost,
                                  diff_rows(old_body or "", new_body or "")))
    return result


@dataclass(frozen=True, slots=True)
class Size:
    chars: int
    words: int
    lines: int


def size_of(text: str) -> Size:
    return Size(chars=len(text), words=sum(1 for t in tokens(text) if not t.isspace()),
                lines=text.count("\n") + 1 if text else 0)
