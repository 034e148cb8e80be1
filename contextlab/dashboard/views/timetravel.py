"""Time travel: every panel of the session page at one turn, or back to the latest."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from contextlab.dashboard import fragments, timetravel
from contextlab.dashboard.views.common import AuthenticatedHttpRequest, session_for_user, turn_param

# The panel each fragment goes into (swapped inside, so a pinned version can
# carry its own root id, which no push targets).
PANELS: tuple[tuple[str, str], ...] = (("gauge", "gauge-panel"), ("flow", "flow-panel"), ("llm", "llm-panel"),
                                       ("fate", "fate-panel"), ("ledger", "ledger-panel"),
                                       ("summary", "summary-panel"))


@require_GET
@login_required
def session_at(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    """The time bar for ``?turn=N`` (or ``latest``), with every panel at that turn out of band."""
    session = session_for_user(request, session_id)
    raw = request.GET.get("turn", "latest")
    turn, newest = turn_param(session, raw)
    context: dict[str, Any]
    if turn is None or raw == "latest":
        context = fragments.live_context(session, turn)
    else:
        context = timetravel.at_context(session, turn)
    context["oob"] = False
    parts: list[str] = [render_to_string(f"{fragments.TEMPLATE}#timebar", context, request=request)]
    for name, panel in PANELS:
        html = render_to_string(f"{fragments.TEMPLATE}#{name}", context, request=request)
        parts.append(f'<div id="{panel}" hx-swap-oob="innerHTML">{html}</div>')
    return HttpResponse("\n".join(parts))
