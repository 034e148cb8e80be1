"""Is a summary usable? And its sections, for merging and diffing.

CoPaw accepts any reply containing the two characters ``##`` anywhere, so a
refusal such as "I can't help with ##" replaces the whole history. We require
every one of the six section headings, as real Markdown headings at the start
of a line (outside code blocks), and say in plain words what is missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from contextlab.engine.stages.summary.prompts import (
    LANGUAGES,
    SECTION_HEADINGS,
    SECTION_IDS,
    SUBSECTION_IDS,
    canonical_heading,
    heading_id,
    heading_language,
)

# CommonMark allows up to three spaces before an ATX heading; a closing run of
# '#' is decoration.
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_THINK = re.compile(r"^\s*<think(?:ing)?>.*?</think(?:ing)?>\s*", re.DOTALL | re.IGNORECASE)
_OUTER_FENCE = re.compile(r"^\s*(`{3,}|~{3,})[\w-]*[ \t]*\n(.*)\n[ \t]*\1[ \t]*$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ValidityResult:
    valid: bool
    reasons: list[str] = field(default_factory=list)
    missing_sections: list[str] = field(default_factory=list)


def normalize_summary(text: str) -> str:
    """Strip what models wrap around an otherwise good summary.

    Reasoning models put a ``<think>…</think>`` block first, and many models
    fence the whole answer in a ```` ```markdown ```` block; neither is part of
    the document the agent should read.
    """
    cleaned = _THINK.sub("", text).strip()
    fenced = _OUTER_FENCE.match(cleaned)
    if fenced:
        cleaned = fenced.group(2).strip()
    return cleaned


def _headings(text: str) -> list[tuple[int, int, str]]:
    """(line index, level, title) of every Markdown heading outside fenced code."""
    found: list[tuple[int, int, str]] = []
    fence: str | None = None
    for index, line in enumerate(text.split("\n")):
        opener = _FENCE.match(line)
        if opener:
            mark = opener.group(1)
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence):
                fence = None
            continue
        if fence is not None:
            continue
        match = _HEADING.match(line)
        if match:
            found.append((index, len(match.group(1)), match.group(2).strip()))
    return found


def check_summary(text: str | None, *, language: str) -> ValidityResult:
    """Valid iff the text is non-blank and has all six ``## `` section headings.

    ``language`` is "en", "zh" or "auto"; with "auto" each section may carry
    its heading in either language, and missing ones are named in the language
    the reply mostly uses.
    """
    body = normalize_summary(text or "")
    if not body:
        return ValidityResult(False, ["the reply is empty"], [])
    lang = language.strip().lower()
    accepted = list(LANGUAGES) if lang == "auto" else (["zh"] if lang.startswith("zh") else ["en"])
    headings = _headings(body)
    present: set[str] = set()
    votes = dict.fromkeys(LANGUAGES, 0)
    for _, level, title in headings:
        if level != 2:
            continue
        sid = heading_id(title)
        title_lang = heading_language(title)
        if sid in SECTION_IDS and title_lang in accepted:
            present.add(sid)
            votes[title_lang] += 1
    report_lang = accepted[0]
    if len(accepted) > 1 and votes["zh"] > votes["en"]:
        report_lang = "zh"
    missing = [
        heading
        for sid, heading in zip(SECTION_IDS, SECTION_HEADINGS[report_lang], strict=True)
        if sid not in present
    ]
    if not headings:
        return ValidityResult(False, ["the reply has no Markdown headings"], missing)
    reasons = [f"missing section '{heading}'" for heading in missing]
    return ValidityResult(not missing, reasons, missing)


def split_sections(text: str, *, level: int = 2) -> dict[str, str]:
    """Heading → body for every heading of ``level`` (default ``## ``).

    Our section headings are returned in canonical form ("## Goal", whatever
    cosmetic variant the model wrote), so two versions of a summary line up in
    the diff viewer. Deeper headings stay inside their parent's body. Text
    before the first heading is returned under the key "" when not blank; a
    heading that appears twice gets its bodies joined.
    """
    body = normalize_summary(text)
    lines = body.split("\n")
    cuts = [(index, lvl, title) for index, lvl, title in _headings(body) if lvl <= level]
    sections: dict[str, str] = {}

    def put(key: str | None, chunk: list[str]) -> None:
        if key is None:
            return
        content = "\n".join(chunk).strip("\n")
        if key in sections:
            sections[key] = f"{sections[key]}\n{content}".strip("\n")
        elif key or content.strip():
            sections[key] = content

    start = 0
    current: str | None = ""
    for index, lvl, title in cuts:
        put(current, lines[start:index])
        start = index + 1
        if lvl < level:
            # A shallower heading closes the current section without opening one.
            current = None
            continue
        sid = heading_id(title)
        wanted = SECTION_IDS if level == 2 else SUBSECTION_IDS
        if sid is not None and sid in wanted:
            current = canonical_heading(sid, heading_language(title) or "en")
        else:
            current = f"{'#' * level} {title}"
    put(current, lines[start:])
    return sections
