"""Pushes the dashboard itself starts (the services announce turns, messages and runs)."""

from __future__ import annotations

from contextlab.sessions.models import AgentProfile
from contextlab.support import live


def profile_announce(profile: AgentProfile) -> int:
    """Tell every open page of the profile's sessions that its numbers changed; how many sessions."""
    session_ids = list(profile.sessions.values_list("pk", flat=True))
    for session_id in session_ids:
        live.publish(live.session_group(session_id), {"type": "profile.update", "session_id": str(session_id),
                                                      "profile_id": profile.pk})
    return len(session_ids)
