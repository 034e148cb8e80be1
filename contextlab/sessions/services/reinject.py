"""Re-injecting a message's original text into a session's live context (the engine's ``reinject``)."""

from __future__ import annotations

from django.contrib.auth.models import User

from contextlab.engine.core.errors import MalformedInput
from contextlab.engine.core.messages import Message, block_from_dict, utc_now_iso
from contextlab.engine.memory.reinject import reinject
from contextlab.sessions.models import AgentSession, SessionMessage
from contextlab.sessions.services.persistence import fate_sizes, locked_session, persist_step


def reinjectable(row: SessionMessage) -> bool:
    """Whether the context lacks part of the message: compacted away, or cut."""
    return not row.is_live or row.truncated_stage is not None


def message_reinject(*, session: AgentSession, seq: int, by: User | None = None) -> SessionMessage:
    """Put message ``seq``'s original (as ingested, uncut) back into the live context; the new message's row.

    The next turn sends it. Raises ``MalformedInput`` when the message is
    whole in the context already, or the engine refuses it (too large for the
    profile, a tool call still waiting for its result).
    """
    with locked_session(session) as (locked, manager):
        row = SessionMessage.objects.filter(session=locked, seq=seq).first()
        if row is None:
            raise MalformedInput(f"this session has no message #{seq}", field="seq")
        if not reinjectable(row):
            raise MalformedInput(f"message #{seq} is in the live context, whole: nothing to re-inject", field="seq")
        original = Message(role=row.role, content=tuple(block_from_dict(b) for b in row.content),  # type: ignore[arg-type]
                           id=row.message_id, name=row.name or None, timestamp=row.timestamp or utc_now_iso())
        # A loaded engine keeps the fate of live messages only; the row has the whole story.
        if row.message_id not in manager.fate:
            manager.fate[row.message_id] = list(row.fate or [])
        before = fate_sizes(manager)
        added = reinject(manager, original, label=f"message #{row.seq}")
        persist_step(locked, manager, before=before, originals={added.id: added})
    return SessionMessage.objects.get(session=session, message_id=added.id)
