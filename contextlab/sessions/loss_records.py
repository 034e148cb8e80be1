"""Loss records: the loss check run once per summary version, and stored with it.

The check itself is ``contextlab.lib.loss_check``; this module feeds it from
the database and the session's workspace (the compacted messages as they were
ingested, the version's text, and the files it names: the identifier index and
offloaded outputs), and stores the verdict on the version. ``kept_texts`` is
also what the search reads, so both answer "is it still there?" from the same
texts.
"""

from __future__ import annotations

from typing import Any

from contextlab.engine.core.errors import InvalidMessages
from contextlab.engine.core.messages import Message
from contextlab.engine.stages.summary.identifiers import INDEX_FILE, keep_identifiers
from contextlab.lib import loss_check
from contextlab.lib.loss_check import Unchecked
from contextlab.sessions.models import AgentSession, SessionMessage, SummaryVersion

REFERENCE_BYTES = 4 * 1024 * 1024  # of named offloaded outputs read per version, together
# The index grows with every compaction of a session and holds what summaries dropped: it has
# a budget of its own, so a long session's index is not skipped for the outputs' sake.
INDEX_BYTES = 32 * 1024 * 1024


def kept_texts(session: AgentSession, summary: str, *, budget: int = REFERENCE_BYTES
               ) -> tuple[list[tuple[str, str]], list[Unchecked]]:
    """The files ``summary`` names that the model could read again, as ``(path, text)``: the
    identifier index and offloaded outputs; and the named files that could not be read."""
    known = [INDEX_FILE, *session.offloaded_files.order_by("pk").values_list("path", flat=True)]
    found: list[tuple[str, str]] = []
    unread: list[Unchecked] = []
    for name in loss_check.named_references(summary, dict.fromkeys(known)):
        # Paths come from our own ledger, but a file is read only inside the workspace.
        path = session.workspace_file(name)
        if path is None or not path.is_file():
            unread.append(Unchecked(f"file {name}", 1, "named by the summary but missing from the workspace: "
                                                       "what only it could hold is counted as lost"))
            continue
        size = path.stat().st_size
        limit = INDEX_BYTES if name == INDEX_FILE else budget
        if size > limit:
            unread.append(Unchecked(f"file {name}", 1, f"{size:,} bytes, over what one check reads "
                                                       f"({limit:,}): what only it holds is counted as lost"))
            continue
        if name != INDEX_FILE:
            budget -= size
        found.append((name, path.read_text(encoding="utf-8", errors="replace")))
    return found, unread


def _message(row: SessionMessage) -> Message | None:
    try:
        return Message.from_dict({"id": row.message_id, "role": row.role, "name": row.name or None,
                                  "content": row.content if isinstance(row.content, list) else row.current_content})
    except (InvalidMessages, TypeError, ValueError, KeyError):
        return None


def check(session: AgentSession, version: SummaryVersion) -> loss_check.Loss:
    return check_text(session, list(version.compacted_ids or []), version.text)


def check_text(session: AgentSession, compacted_ids: list[str], summary: str, *,
               draft: bool = False) -> loss_check.Loss:
    """What a summary (stored, or a dry run's ``draft``) loses of the messages it compacts.

    A draft's index entry is not written until it is accepted (a dry run writes no file):
    the entry accepting it would append is searched as part of the index.
    """
    rows = {m.message_id: m for m in SessionMessage.objects.filter(session=session, message_id__in=compacted_ids)
            .order_by().only("message_id", "role", "name", "content", "current_content", "seq", "session_id")}
    compacted: list[Message] = []
    missing = 0
    for mid in compacted_ids:
        message = _message(rows[mid]) if mid in rows else None
        if message is None:
            missing += 1
        else:
            compacted.append(message)
    references, unread = kept_texts(session, summary)
    if draft and INDEX_FILE in summary:
        entry = keep_identifiers(summary, compacted, version=session.summary_version + 1).index_entry or ""
        known = dict(references)
        known[INDEX_FILE] = known.get(INDEX_FILE, "") + entry
        references = list(known.items())
        unread = [u for u in unread if u.what != f"file {INDEX_FILE}"]
    if missing:
        unread.insert(0, Unchecked("compacted message", missing, "not found in the session's messages "
                                                                 "(or not readable), so not searched"))
    return loss_check.lost_at_compaction(compacted, summary, references, unread)


def _stored(loss: loss_check.Loss) -> dict[str, Any]:
    return {"checked": loss.checked, "checked_kinds": list(loss.checked_kinds),
            "unchecked": [u.to_dict() for u in loss.unchecked], "references": loss.references}


def record(session: AgentSession) -> list[SummaryVersion]:
    """Check every version of ``session`` not checked yet (or checked by an older check); the versions updated."""
    pending = list(session.summary_versions.filter(loss_scope__isnull=True).order_by("version"))
    for version in pending:
        loss = check(session, version)
        version.lost_at_compaction = [{"kind": lost.kind, "value": lost.value, "message_id": lost.message_id}
                                      for lost in loss.lost]
        version.lost_count = loss.count
        version.loss_scope = _stored(loss)
    if pending:
        SummaryVersion.objects.bulk_update(pending, ["lost_at_compaction", "lost_count", "loss_scope"])
    return pending
