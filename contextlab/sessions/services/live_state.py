"""What the viewers of a session page are pushed once a step has committed."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from contextlab.engine.core.errors import ContextLabError
from contextlab.engine.core.messages import Message
from contextlab.engine.core.tokens import TiktokenCounter
from contextlab.engine.hook import ContextManager
from contextlab.sessions.models import (
    AgentSession,
    CompactionRun,
    SessionMessage,
    Turn,
)
from contextlab.support import live

log = logging.getLogger(__name__)


def live_state_of(session: AgentSession, manager: ContextManager, turn: Turn | None,
                  view: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Everything the session's gauge and counters show, as it was just committed.

    Sent whole with every update (a page never applies deltas), so a viewer
    that missed events is right again with the next one. With ``view`` (the
    commit's ``live_view_of``), it carries the gauge's inputs too: a page
    renders its gauge from the event alone, before it reads anything.
    """
    profile = manager.profile
    state: dict[str, Any] = {
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
    if view is not None and "gauge" in view:
        state["gauge"] = view["gauge"]
    return state


# -- what the page's live panels show, written by the commit ------------------------------------


def counts_as_tool_result(role: str, blocks: Iterable[Mapping[str, Any]] | None) -> bool:
    """A tool result is a "tool" message (OpenAI) or a user message holding a tool_result block (Anthropic)."""
    return role == "tool" or any(block.get("type") == "tool_result" for block in blocks or [])


def system_prompt_tokens(tokenizer: str, system_prompt: str) -> int:
    """The system prompt's exact tokens, as the gauge shows them before the first turn."""
    if not system_prompt:
        return 0
    return int(TiktokenCounter(tokenizer).count_message(Message.text("system", system_prompt, id="_gauge")))


def latest_turn_inputs(turn: Turn | None) -> dict[str, Any]:
    """What the gauge takes from the latest turn: its number, its payload's layers and last message,
    and what the hook decided (its outcome and, when it held a compaction back, why): the gauge
    states the same decision as the turn's flow, never one of its own."""
    if turn is None:
        return {"turn": None, "layers": None, "last_message_id": None, "held_back": "", "why": ""}
    held_back, why = held_back_reason(turn.outcome, turn.trace)
    return {"turn": turn.number, "layers": turn.layer_tokens(),
            "last_message_id": (turn.trace.get("payload") or {}).get("last_message_id") or None,
            "held_back": held_back, "why": why}


def held_back_reason(outcome: str, trace: Mapping[str, Any]) -> tuple[str, str]:
    """Whether a turn held a compaction back ("deferred", "nothing to compact" or "") and why, in the
    words of its flow. A deferral for too small a gain leaves the turn's outcome "no_action": its
    context check says "compaction deferred: …", which is what the flow shows."""
    steps = [step for step in trace.get("steps") or [] if isinstance(step, Mapping)]
    for step in steps:
        text = str(step.get("outcome") or "")
        if "deferred:" in text:
            return "deferred", text.split("deferred:", 1)[1].strip()
    if outcome == "compaction_deferred":
        reasons = [str(r) for step in steps for r in step.get("reasons") or [] if "keeps every message" in str(r)]
        return "deferred", reasons[0] if reasons else ""
    if outcome == "nothing_to_compact":
        for step in steps:
            reason = (step.get("details") or {}).get("nothing_to_compact")
            if reason:
                return "nothing to compact", str(reason)
        return "nothing to compact", ""
    return "", ""
    steps = [step for step in trace.get("steps") or [] if isinstance(step, Mapping)]
    for step in steps:
        text = str(step.get("outcome") or "")
        if "deferred:" in text:
            return text.split("deferred:", 1)[1].strip()
    for step in steps:
        reason = (step.get("details") or {}).get("nothing_to_compact")
        if reason:
            return str(reason)
    for step in steps:
        for reason in step.get("reasons") or []:
            if "deferred" in reason or "keeps every message" in reason:
                return str(reason)
    return ""


def pending_from_rows(session: AgentSession, last_message_id: str | None) -> dict[str, int]:
    """Tokens of the live messages appended after ``last_message_id`` (all of them when None), by layer,
    read from the message rows."""
    after = 0
    if last_message_id:
        after = (SessionMessage.objects.filter(session=session, message_id=last_message_id).order_by()
                 .values_list("seq", flat=True).first() or 0)
    pending = {"tool_results": 0, "messages": 0, "count": 0}
    for role, tokens, blocks in (SessionMessage.objects.filter(session=session, status=SessionMessage.Status.LIVE,
                                                               seq__gt=after).order_by()
                                 .values_list("role", "tokens", "current_content")):
        pending["tool_results" if counts_as_tool_result(role, blocks) else "messages"] += int(tokens or 0)
        pending["count"] += 1
    return pending


def _pending_from_engine(manager: ContextManager, last_message_id: str | None,
                         unrowed: set[str]) -> dict[str, int] | None:
    """``pending_from_rows`` from the engine's live list (it holds the rows' order and token counts):
    a walk back over what came after the last turn's payload. None when that message left the
    live context (the rows know where it stood)."""
    pending = {"tool_results": 0, "messages": 0, "count": 0}
    for message in reversed(manager.messages):
        if message.id == last_message_id:
            return pending
        if message.id in unrowed:
            continue  # made by the engine, with no row: the rows do not count it either
        layer = "tool_results" if message.role == "tool" or message.is_tool_result else "messages"
        pending[layer] += manager.exact_counter.count_message(message)
        pending["count"] += 1
    return pending if last_message_id is None else None


def _compaction_inputs(manager: ContextManager) -> dict[str, Any]:
    try:
        preview = manager.preview_compaction()
    except ContextLabError as exc:
        return {"error": exc.message}
    return {"compact": len(preview.compact_ids), "keep": len(preview.keep_ids), "kept_tokens": preview.kept_tokens}


def live_view_of(session: AgentSession, manager: ContextManager, turn: Turn | None, *,
                 previous: Mapping[str, Any] | None, unrowed: set[str]) -> dict[str, Any]:
    """The ``live_view`` a commit writes: the gauge's inputs, whether a manual compaction
    would compact anything, and the pins, from the engine this process holds.

    ``session`` carries the new ``state_version``; ``previous`` is the view of the
    state this step started from (when it was current), which still knows the
    latest turn of a step that wrote none. Reading a view instead of the turn and
    message rows, a page pushes its gauge without a query, and a web process
    that holds no engine never loads one to tell whether "Compact now" works.
    """
    if turn is not None:
        latest = latest_turn_inputs(turn)
    elif previous is not None and "gauge" in previous:
        latest = {key: previous["gauge"].get(key)
                  for key in ("turn", "layers", "last_message_id", "held_back", "why")}
    else:  # a session written before views existed: its latest turn, once
        latest = latest_turn_inputs(session.turns.defer("payload").order_by("-number").first())
    pending = _pending_from_engine(manager, latest["last_message_id"], unrowed)
    if pending is None:
        pending = pending_from_rows(session, latest["last_message_id"])
    gauge: dict[str, Any] = {**latest, "pending": pending}
    if latest["turn"] is None:
        gauge["system"] = system_prompt_tokens(session.profile.tokenizer, session.system_prompt)
    return {"version": session.state_version, "profile": [session.profile_id, session.profile.version],
            "gauge": gauge, "compaction": _compaction_inputs(manager), "pins": manager.pins.to_dict()}


def current_live_view(session: AgentSession) -> dict[str, Any] | None:
    """The session's ``live_view`` when it describes the committed state (None otherwise:
    a session saved before views, or a writer that moved the state without one)."""
    view = session.live_view or {}
    return view if view.get("version") == session.state_version else None


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


