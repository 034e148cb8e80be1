"""The loss check: what a compaction lost from the messages it compacted.

A later summary dropping what an earlier one said is one kind of loss (see
``summary_diff.lost_identifiers``). The first happens earlier: an identifier
of a compacted message that the new summary does not carry, and that no file
the summary names (the identifier index, an offloaded output) still holds, is
gone from everything the model will see again.

What counts as an identifier is ``contextlab.engine.stages.summary.identifiers``' one
definition, the same the summary index is built from and the same the search
uses; "kept" is its ``mentions``. The check says "nothing lost" only when it
searched everything: whatever it could not search (tool outputs, long tool
arguments, messages it could not read, files it could not open) is listed in
``unchecked``, and a verdict with anything unchecked is never "nothing lost".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from contextlab.engine.core.messages import Message
from contextlab.engine.stages.summary.identifiers import (
    KINDS,
    Identifier,
    fold,
    is_internal,
    mentions,
    message_identifiers,
)

MAX_LOST = 200  # flags stored per summary version; the count stays exact


@dataclass(frozen=True, slots=True)
class Lost:
    kind: str
    value: str
    message_id: str  # the first compacted message that held it


@dataclass(frozen=True, slots=True)
class Unchecked:
    """Something of the compacted span the check did not search, and why."""

    what: str
    count: int
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "count": self.count, "why": self.why}


WHY: dict[str, str] = {
    "tool output": "the environment's words, not searched for identifiers; kept verbatim in the dialog archive",
    "long tool-call argument": "file contents and edits (longer than 200 characters or several lines), "
                               "not searched; kept verbatim in the dialog archive",
    "image or other media": "not text",
    "assistant thinking": "the model's private reasoning, not searched; kept verbatim in the dialog archive",
}


@dataclass(frozen=True, slots=True)
class Loss:
    lost: list[Lost]
    count: int
    references: list[str]  # the files named by the summary that were searched too
    checked: int = 0  # distinct identifiers searched for
    checked_kinds: tuple[str, ...] = KINDS
    unchecked: list[Unchecked] = field(default_factory=list)

    @property
    def nothing_lost(self) -> bool:
        """True only when every identifier was searched for and each is kept."""
        return self.count == 0 and not self.unchecked

    def to_dict(self) -> dict[str, Any]:
        return {"lost": [{"kind": f.kind, "value": f.value, "message_id": f.message_id} for f in self.lost],
                "lost_count": self.count, "checked": self.checked, "checked_kinds": list(self.checked_kinds),
                "unchecked": [u.to_dict() for u in self.unchecked], "references": list(self.references),
                "nothing_lost": self.nothing_lost}


def named_references(summary: str, known_paths: Iterable[str]) -> list[str]:
    """The files among ``known_paths`` that the summary names, in the order given."""
    return [path for path in known_paths if path and path in summary]


def lost_at_compaction(compacted: Sequence[Message], summary: str,
                       references: Sequence[tuple[str, str]] = (),
                       unchecked: Sequence[Unchecked] = ()) -> Loss:
    """Identifiers of the compacted ``messages`` kept neither by ``summary`` nor by a referenced
    file ``(path, text)``; each once, oldest message first. ``unchecked`` comes from the caller
    (messages or files it could not read) and is reported with what this check skipped."""
    kept = [fold(text) for text in (summary, *(text for _, text in references))]
    seen: set[str] = set()
    skipped: dict[str, int] = {}
    lost: list[Lost] = []
    count = 0
    for message in compacted:
        for ident in message_identifiers(message, skipped):
            if ident.value in seen or is_internal(ident.value):
                continue
            seen.add(ident.value)
            if is_kept(ident, kept):
                continue
            count += 1
            if len(lost) < MAX_LOST:
                lost.append(Lost(ident.kind, ident.value, message.id))
    notes = [*unchecked, *(Unchecked(what, n, WHY.get(what, "not searched")) for what, n in skipped.items())]
    return Loss(lost, count, [path for path, _ in references], checked=len(seen), unchecked=notes)


def is_kept(ident: Identifier, folded_texts: Sequence[str]) -> bool:
    """Whether one of the ``fold``-ed texts names ``ident``."""
    return any(mentions(ident.value, text, folded=True) for text in folded_texts)
