"""What the viewers of a session page are pushed once a step has committed."""

from __future__ import annotations

import logging
from typing import Any

from contextlab import live
from contextlab.engine.hook import ContextManager
from contextlab.sessions.models import (
    AgentSession,
    CompactionRun,
    Turn,
)

log = logging.getLogger(__name__)


def live_state_of(session: AgentSession, manager: ContextManager, turn: Turn | None) -> dict[str, Any]:
    """Everything the session's gauge and counters show, as it was just committed.

    Sent whole with every update (a page never applies deltas), so a viewer
    that missed events is right again with the next one.
    """
    profile = manager.profile
    return {
        "status": session.status,
        "turns": session.turns_count,
        "messages": session.messages_count,
        "live_messages": session.live_count,
        "summary_version": session.summary_version,
        "compactions": session.compactions_count,
        "failures": session.failures_count,
        "tokens": {
            # The last payload sent (what the gauge of the latest turn shows) and
            # the live messages now, which an append changes before any turn.
            "used": session.tokens_used,
            "live_messages": manager.live_exact_tokens,
            "threshold": profile.threshold,
            "reserve": profile.reserve,
            "window": profile.max_input_length,
        },
        "turn": None if turn is None else {
            "number": turn.number, "trigger": turn.trigger, "outcome": turn.outcome,
            "layers": turn.layer_tokens(), "payload_tokens": turn.payload_tokens,
        },
        "last_activity": session.last_activity.isoformat(),
    }


def session_announce(*, session_id: Any, state: dict[str, Any]) -> None:
    """Push a session's new state to its viewers (at most ten times a second)."""
    live.publish(live.session_group(session_id),
                 {"type": "gauge.update", "session_id": str(session_id), "state": state}, coalesce="gauge")


def run_announce(run: CompactionRun, **extra: Any) -> None:
    """Push a run's row (plus ``extra``, e.g. import progress) to the session's viewers."""
    event = {"type": "run.update", "run_id": run.pk, "session_id": str(run.session_id), "run": run.to_dict(),
             **extra}
    # One key per run: a burst of progress collapses to its latest, and the
    # final status always goes out last.
    live.publish(live.session_group(run.session_id), event, coalesce=f"run-{run.pk}")


