"""Loss at compaction time, checked once per summary version and stored with it.

The check itself is ``contextlab.lib.compaction_loss``; this module feeds it
from the database and the session's workspace: the compacted messages as the
compactor saw them, the version's text, and the offloaded outputs it names.
"""

from __future__ import annotations

from pathlib import Path

from contextlab.lib import compaction_loss
from contextlab.lib.blocks import first_text
from contextlab.sessions.models import AgentSession, SessionMessage, SummaryVersion

MESSAGE_CHARS = 200_000  # of one compacted message
REFERENCE_BYTES = 4 * 1024 * 1024  # of referenced files read per version, together


def _references(session: AgentSession, summary: str) -> list[tuple[str, str]]:
    known = list(session.offloaded_files.order_by("pk").values_list("path", flat=True))
    workspace = Path(session.workspace).resolve()
    budget = REFERENCE_BYTES
    found = []
    for name in compaction_loss.named_references(summary, known):
        path = (workspace / name).resolve()
        # Paths come from our own ledger, but a file is read only inside the workspace.
        if not path.is_relative_to(workspace) or not path.is_file():
            continue
        size = path.stat().st_size
        if size > budget:
            continue
        budget -= size
        found.append((name, path.read_text(encoding="utf-8", errors="replace")))
    return found


def check(session: AgentSession, version: SummaryVersion) -> compaction_loss.Loss:
    return check_text(session, list(version.compacted_ids or []), version.text)


def check_text(session: AgentSession, compacted_ids: list[str], summary: str) -> compaction_loss.Loss:
    """What a summary (stored, or a dry run's draft) loses of the messages it compacts."""
    rows = {m.message_id: m for m in SessionMessage.objects.filter(session=session, message_id__in=compacted_ids)
            .order_by().only("message_id", "current_content", "seq", "session_id")}
    compacted = [(mid, first_text(rows[mid].current_content)[:MESSAGE_CHARS]) for mid in compacted_ids if mid in rows]
    return compaction_loss.lost_at_compaction(compacted, summary, _references(session, summary))


def record(session: AgentSession) -> list[SummaryVersion]:
    """Check every version of ``session`` not checked yet; the versions updated."""
    pending = list(session.summary_versions.filter(lost_count__isnull=True).order_by("version"))
    for version in pending:
        loss = check(session, version)
        version.lost_at_compaction = [{"kind": lost.kind, "value": lost.value, "message_id": lost.message_id}
                                      for lost in loss.lost]
        version.lost_count = loss.count
    if pending:
        SummaryVersion.objects.bulk_update(pending, ["lost_at_compaction", "lost_count"])
    return pending
