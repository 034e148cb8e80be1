"""What a compaction lost from the messages it compacted.

A later summary dropping what an earlier one said is one kind of loss (see
``summary_diff.lost_identifiers``). The first happens earlier: an identifier
in a compacted message that the new summary does not carry, and that no file
the summary names (an offloaded tool output it points to) still holds, is
gone from everything the model will see again.

Only exact identifiers count: paths, URLs, code spans and hex ids. Numbers and
error lines are everywhere in tool output and are paraphrased by any summary,
so flagging each would bury the losses that matter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from contextlab.lib.summary_diff import Identifier, _present, identifiers

KINDS = frozenset({"path", "url", "code", "id"})
MAX_LOST = 200  # flags stored per summary version; the count stays exact
# The truncation notice's advice names the tool in backticks; that is not a fact
# of the conversation (the file path beside it is, and is checked).
_NOTICE_TOOL = re.compile(r"call `(read_file)` with")


@dataclass(frozen=True, slots=True)
class Lost:
    kind: str
    value: str
    message_id: str  # the first compacted message that held it


@dataclass(frozen=True, slots=True)
class Loss:
    lost: list[Lost]
    count: int
    references: list[str]  # the files named by the summary that were searched too


def named_references(summary: str, known_paths: Iterable[str]) -> list[str]:
    """The files among ``known_paths`` that the summary names, in the order given."""
    return [path for path in known_paths if path and path in summary]


def lost_at_compaction(compacted: Sequence[tuple[str, str]], summary: str,
                       references: Sequence[tuple[str, str]] = ()) -> Loss:
    """Identifiers of the compacted messages ``(message_id, text)`` kept neither by the
    summary nor by a referenced file ``(path, text)``; each once, oldest message first."""
    kept = [summary, *(text for _, text in references)]
    seen: set[tuple[str, str]] = set()
    lost: list[Lost] = []
    count = 0
    for message_id, text in compacted:
        for ident in identifiers(_NOTICE_TOOL.sub(r"call \1 with", text)):
            key = (ident.kind, ident.value)
            if ident.kind not in KINDS or key in seen:
                continue
            seen.add(key)
            if _kept(ident, kept):
                continue
            count += 1
            if len(lost) < MAX_LOST:
                lost.append(Lost(ident.kind, ident.value, message_id))
    return Loss(lost, count, [path for path, _ in references])


def _kept(ident: Identifier, texts: Sequence[str]) -> bool:
    return any(_present(ident, text) for text in texts)
