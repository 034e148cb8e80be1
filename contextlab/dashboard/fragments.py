"""The session page's fragments: one context builder each, shared by the views
(htmx requests, the first page load) and the consumer (websocket pushes).

Every fragment is a ``{% partialdef %}`` of ``sessions/detail.html`` whose root
element carries a stable id; a push renders the same partial with ``oob`` set,
so htmx swaps it in place. Fragments that show one page of a list, or one
turn the viewer picked, get a different root id while the viewer is away from
"page 1 / latest turn" (``*-live`` versus ``*-page``/``*-pinned``): a push,
which always renders the live version, then finds no target and leaves the
viewer's choice alone.

Every list is windowed (a page or the newest N), so a session of 10,000
messages renders as fast as one of 100.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from uuid import UUID

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from contextlab.dashboard.review import review_context
from contextlab.engine.core.errors import ContextLabError
from contextlab.lib import payload_diff, summary_diff, textsafe
from contextlab.lib.blocks import first_text
from contextlab.lib.flow import build_flow, deferral_of
from contextlab.sessions import services
from contextlab.sessions.models import (
    COMPACTION_OUTCOMES,
    AgentSession,
    CompactionRun,
    OffloadedFile,
    SessionMessage,
    Turn,
)

TEMPLATE = "sessions/detail.html"
TURNS_PER_PAGE = 20
MESSAGES_PER_PAGE = 25
LEDGER_PER_PAGE = 25
PAYLOAD_ROWS_PER_PAGE = 40
CHART_TURNS = 2_000
# Word diffs of two payload messages longer than this fall back to line diffs.
WORD_DIFF_LIMIT = 20_000

FRAGMENTS: tuple[str, ...] = ("stats", "gauge", "chart", "turns", "flow", "llm", "fate", "ledger", "summary",
                              "compaction", "profile", "timebar")
# Which fragments each kind of change makes stale.
KINDS: dict[str, tuple[str, ...]] = {
    # New messages can make a manual compaction possible (or keep it pointless).
    "messages": ("stats", "gauge", "fate", "ledger", "compaction"),
    "turn": FRAGMENTS,
    "run": ("stats", "compaction"),
    # A saved profile moves the threshold, the reserve and what can be compacted.
    "profile": ("profile", "gauge", "compaction"),
    "all": FRAGMENTS,
}
ACTIVE_RUN = (CompactionRun.Status.QUEUED, CompactionRun.Status.RUNNING)
_TURN_LIST_FIELDS = ("session_id", "number", "trigger", "outcome", "used_tokens", "threshold", "window",
                     "payload_tokens", "compacted_count", "summary_version", "duration_ms", "created",
                     "profile_version")


def latest_turn(session: AgentSession, *, payload: bool = False) -> Turn | None:
    qs = session.turns.order_by("-number")
    if not payload:
        qs = qs.defer("payload")
    return qs.first()


# -- gauge ---------------------------------------------------------------------------------


def _gauge_inputs(session: AgentSession, latest: Turn | None) -> dict[str, Any]:
    """What the gauge shows now: the session's ``live_view`` when it is current, else the
    same inputs read from the turn and message rows (sessions saved before views)."""
    view = services.current_live_view(session)
    if view is not None and "gauge" in view:
        return dict(view["gauge"])
    inputs = services.latest_turn_inputs(latest)
    inputs["pending"] = services.pending_from_rows(session, inputs["last_message_id"])
    if latest is None:
        inputs["system"] = services.system_prompt_tokens(session.profile.tokenizer, session.system_prompt)
    return inputs


def gauge_context(session: AgentSession, latest: Turn | None, *, now: bool = True) -> dict[str, Any]:
    """The budget of ``latest``'s payload, plus (``now``) the messages appended since.

    With ``now``, the latest turn is the session's, and ``latest`` is read only
    when the session has no current ``live_view``."""
    profile = session.profile
    window, threshold, reserve = profile.max_input_length, profile.threshold, profile.reserve
    if now:
        inputs = _gauge_inputs(session, latest)
    else:
        inputs = {**services.latest_turn_inputs(latest), "system": 0,
                  "pending": {"tool_results": 0, "messages": 0, "count": 0}}
        if latest is not None:
            window, threshold = latest.window or window, latest.threshold or threshold
            reserve = int((latest.trace.get("budget") or {}).get("reserve", reserve))
    return {"gauge": gauge_numbers(inputs, window=window, threshold=threshold, reserve=reserve)}


def gauge_numbers(inputs: Mapping[str, Any], *, window: int, threshold: int, reserve: int) -> dict[str, Any]:
    """The gauge's figures from its inputs (``live_view``'s "gauge") and the profile's limits: the one
    computation behind the page, its htmx requests and its websocket pushes."""
    pending = inputs["pending"]
    layers = inputs.get("layers")
    if layers is not None:
        system, summary, schemas = layers["system"], layers["summary"], layers["tools"]
        messages = layers["messages"] + pending["messages"]
        tools = layers["tool_results"] + pending["tool_results"]
        total = layers["total"] + pending["messages"] + pending["tool_results"]
    else:
        system, summary, schemas = int(inputs.get("system") or 0), 0, 0
        messages, tools = pending["messages"], pending["tool_results"]
        # The provider's reply priming, as the engine counts it.
        total = system + messages + tools + (3 if system or messages or tools else 0)
    scale = max(window, total, 1)
    # The reserve is the newest tokens a compaction keeps: the tail of the messages, drawn where
    # it starts (never inside the system prompt, summary or tool schemas, which always stay).
    fixed = system + summary + schemas
    reserve_start = max(fixed, total - reserve)
    over_threshold = total >= threshold
    # One source of truth: past the threshold, the gauge repeats what the latest turn's flow decided.
    held_back = str(inputs.get("held_back") or "") if over_threshold else ""
    segments = [
        {"key": key, "label": label, "tokens": value, "percent": round(100 * value / scale, 3)}
        for key, label, value in (("system", "system prompt", system), ("summary", "summary", summary),
                                  ("tools", "tool schemas", schemas), ("messages", "kept messages", messages),
                                  ("tool_results", "tool results", tools))
    ]
    return {
        "window": window, "threshold": threshold, "reserve": reserve, "total": total,
        "segments": segments,
        "threshold_percent": round(100 * threshold / scale, 3),
        "reserve_percent": round(100 * reserve_start / scale, 3),
        "window_percent": round(100 * window / scale, 3),
        "used_percent": round(100 * total / window, 1) if window else 0.0,
        "left": threshold - total,
        "over_threshold": over_threshold,
        "held_back": held_back,
        "why": str(inputs.get("why") or "") if held_back else "",
        "over_window": total > window,
        "turn": inputs.get("turn"),
        "pending": pending["count"],
    }


def gauge_push(state: Mapping[str, Any]) -> str | None:
    """The gauge's push rendered from a ``gauge.update`` event's state alone (no query), or None
    when the event does not carry the gauge's inputs. The same partial and figures as
    ``render_fragments(session, ["gauge"])`` for the state the event reports."""
    inputs, limits = state.get("gauge"), state.get("tokens") or {}
    if not isinstance(inputs, Mapping) or not all(key in limits for key in ("window", "threshold", "reserve")):
        return None
    gauge = gauge_numbers(inputs, window=int(limits["window"]), threshold=int(limits["threshold"]),
                          reserve=int(limits["reserve"]))
    return render_to_string(f"{TEMPLATE}#gauge", {"gauge": gauge, "gauge_live": True, "oob": True})


# -- chart ---------------------------------------------------------------------------------


def chart_context(session: AgentSession) -> dict[str, Any]:
    rows = list(session.turns.order_by("-number")
                .values_list("number", "used_tokens", "payload_tokens", "threshold", "outcome", "summary_version")
                [:CHART_TURNS])
    rows.reverse()
    lost = lost_by_turn(session, [row[0] for row in rows if row[4] in COMPACTION_OUTCOMES])
    compactions = [{"turn": n, "before": used, "after": sent, "version": version, "outcome": outcome,
                    "lost": lost.get(n, 0)}
                   for n, used, sent, _, outcome, version in rows if outcome in COMPACTION_OUTCOMES]
    data = {
        "turns": [r[0] for r in rows],
        "before": [r[1] for r in rows],
        "sent": [r[2] for r in rows],
        "threshold": [r[3] for r in rows],
        "window": session.profile.max_input_length,
        "compactions": compactions,
        # Lets the page skip a redraw when a push carries the same data.
        "version": f"{session.turns_count}-{rows[-1][0] if rows else 0}",
    }
    return {"chart": data, "chart_json": json.dumps(data, separators=(",", ":")),
            "chart_compactions": list(reversed(compactions))[:8],
            "chart_clipped": session.turns_count > CHART_TURNS}


# -- turns -----------------------------------------------------------------------------------


def lost_by_turn(session: AgentSession, numbers: Iterable[int]) -> dict[int, int]:
    """Identifiers lost at compaction time, by the turn that wrote the summary version."""
    numbers = list(numbers)
    if not numbers:
        return {}
    return {turn: int(count or 0) for turn, count in session.summary_versions.filter(
        turn__in=numbers, lost_count__gt=0).order_by().values_list("turn", "lost_count")}


def deferred_by_turn(session: AgentSession, turns: Iterable[Turn]) -> dict[int, str]:
    """Why each of ``turns`` held a compaction back, for those that did.

    Only a turn that compacted nothing while over its threshold can have deferred one: only
    those traces are read (the list otherwise loads no trace).
    """
    numbers = [t.number for t in turns if t.outcome == "no_action" and t.threshold and t.used_tokens >= t.threshold]
    if not numbers:
        return {}
    found = {}
    for number, trace in session.turns.filter(number__in=numbers).order_by().values_list("number", "trace"):
        check = next((step for step in (trace or {}).get("steps") or []
                      if isinstance(step, dict) and step.get("step") == "context_check"), None)
        why = deferral_of(check)
        if why:
            found[number] = why
    return found


def with_losses(session: AgentSession, turns: list[Turn]) -> list[Turn]:
    lost = lost_by_turn(session, [t.number for t in turns if t.outcome in COMPACTION_OUTCOMES])
    deferred = deferred_by_turn(session, turns)
    for turn in turns:
        turn.lost_count = lost.get(turn.number, 0)  # type: ignore[attr-defined]
        turn.deferred_why = deferred.get(turn.number, "")  # type: ignore[attr-defined]
    return turns


def turns_context(session: AgentSession, *, page: str | int | None = 1, outcome: str = "") -> dict[str, Any]:
    qs = session.turns.order_by("-number").only(*_TURN_LIST_FIELDS)
    if outcome == "compacted":
        qs = qs.filter(outcome__in=COMPACTION_OUTCOMES)
    elif outcome == "failed":
        qs = qs.exclude(outcome__in=("no_action", "compacted"))
    turns = Paginator(qs, TURNS_PER_PAGE).get_page(page)
    turns.object_list = with_losses(session, list(turns.object_list))
    return {"turns": turns, "turns_outcome": outcome,
            "turns_live": turns.number == 1 and not outcome}


def turns_after(session: AgentSession, after: int, limit: int = TURNS_PER_PAGE) -> list[Turn]:
    """The turns after the page's cursor, newest first (at most ``limit``)."""
    return with_losses(session, list(session.turns.filter(number__gt=after).order_by("-number")
                                     .only(*_TURN_LIST_FIELDS)[:limit]))


# -- decision flow ------------------------------------------------------------------------


def flow_context(session: AgentSession, turn: Turn | None, *, live: bool) -> dict[str, Any]:
    flow = build_flow(turn.trace) if turn is not None else None
    pinned = None
    if flow is not None:
        pinned_id = next((row.get("pinned_id") for row in flow.nodes["context_check"].rows if row.get("pinned_id")),
                         None)
        if pinned_id:
            pinned = SessionMessage.objects.filter(session=session, message_id=pinned_id).order_by().only(
                "seq", "message_id", "role", "current_content", "session_id").first()
    return {"flow": flow, "flow_turn": turn, "flow_live": live, "flow_pinned_message": pinned}


# -- LLM view ---------------------------------------------------------------------------------


def _stale_calls(session: AgentSession, turn_number: int) -> dict[str, dict[str, Any]]:
    """Tool-call ids of read results that were stale by ``turn_number``.

    The engine keeps the stale reads still in the live context (its state's
    ``stale``): a read whose file a later call wrote, so the model is looking
    at an old version.
    """
    stale = (session.engine_state or {}).get("stale") or {}
    wanted = {mid: info for mid, info in stale.items() if int(info.get("before_turn") or 0) <= turn_number}
    if not wanted:
        return {}
    calls: dict[str, dict[str, Any]] = {}
    for row in SessionMessage.objects.filter(session=session, message_id__in=list(wanted)).only(
            "message_id", "content").order_by():
        for block in row.content or []:
            if block.get("type") == "tool_result":
                calls[str(block.get("id"))] = wanted[row.message_id]
    return calls


def _payload_row(row: payload_diff.Row, stale: Mapping[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    text = payload_diff.message_text(row.message)
    data: dict[str, Any] = {
        "status": row.status, "layer": row.layer, "layer_label": payload_diff.LAYER_LABELS[row.layer],
        "role": row.message.get("role", ""), "name": row.message.get("name") or "",
        "index": row.index, "previous_index": row.previous_index,
        "chars": len(text), "preview": textsafe.preview(text, head_lines=6, head_chars=900),
        "tool_call_id": row.message.get("tool_call_id") or "",
        "stale": (stale or {}).get(str(row.message.get("tool_call_id") or "")),
    }
    if row.status == "changed" and row.previous is not None:
        old = payload_diff.message_text(row.previous)
        data["previous_chars"] = len(old)
        if len(old) <= WORD_DIFF_LIMIT and len(text) <= WORD_DIFF_LIMIT:
            data["ops"] = summary_diff.word_diff(textsafe.clean(old), textsafe.clean(text))
    return data


def llm_context(session: AgentSession, turn: Turn | None, *, page: str | int | None = 1,
                live: bool) -> dict[str, Any]:
    if turn is None:
        return {"llm_turn": None, "llm_live": live}
    previous = (session.turns.filter(number=turn.number - 1).only("payload", "number", "session_id").first()
                if turn.number > 1 else None)
    rows = payload_diff.diff_payloads(previous.payload if previous else [], turn.payload or [])
    stale = _stale_calls(session, turn.number)
    counts = payload_diff.counts(rows)
    paged: Page[payload_diff.Row] = Paginator(rows, PAYLOAD_ROWS_PER_PAGE).get_page(page)
    layers = turn.layer_tokens()
    total = max(layers.get("total", 0), 1)
    return {
        "llm_turn": turn, "llm_live": live and paged.number == 1,
        "llm_page": paged, "llm_rows": [_payload_row(r, stale) for r in paged.object_list],
        "llm_counts": counts, "llm_previous": previous.number if previous else None,
        # Tool definitions are sent beside the messages, not in them: a layer
        # of the payload shown only when the call declared some.
        "llm_layers": [{"key": key, "label": payload_diff.LAYER_LABELS[key], "tokens": layers.get(key, 0),
                        "percent": round(100 * layers.get(key, 0) / total, 2)}
                       for key in (*payload_diff.LAYERS[:2], "tools", *payload_diff.LAYERS[2:])
                       if key != "tools" or layers.get("tools")],
        "llm_message_count": len(turn.payload or []),
        **usage_context(turn),
    }


# ``GatewayExchange.endpoint`` of the agent's token counts (the gateway's Anthropic adapter names it so).
COUNT_TOKENS_ENDPOINT = "anthropic.count_tokens"

def usage_context(turn: Turn) -> dict[str, Any]:
    """What the provider reported for the call made with ``turn``'s payload, against our count;
    and the token counts the agent asked the provider for meanwhile (``count_tokens``)."""
    return {**_usage(turn), "token_counts": _token_counts(turn)}


def _token_counts(turn: Turn) -> list[dict[str, Any]]:
    """The provider's answers to the agent's ``count_tokens`` calls made after this turn, each
    beside ContextLab's count of the same request."""
    rows = (turn.session.gateway_exchanges.filter(turn_number=turn.number, endpoint=COUNT_TOKENS_ENDPOINT,
                                                  usage__isnull=False)
            .order_by("created").values_list("usage", flat=True)[:20])
    out = []
    for usage in rows:
        if not isinstance(usage, dict):
            continue
        provider, ours = usage.get("input_tokens"), usage.get("contextlab_estimate")
        if isinstance(provider, int) and isinstance(ours, int):
            out.append({"provider": provider, "contextlab": ours,
                        "ratio": round(provider / ours, 2) if ours else None})
    return out


def _usage(turn: Turn) -> dict[str, Any]:
    reported = services.reported_prompt_tokens(turn.usage)
    if reported is None:
        return {"usage": None}
    counted = turn.payload_tokens
    usage = turn.usage or {}
    anthropic = "input_tokens" in usage and "prompt_tokens" not in usage
    parts = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens")
    other = {key: value for key, value in usage.items()
             if isinstance(value, int | float) and key not in ("prompt_tokens", *(parts if anthropic else ()))}
    return {"usage": {"reported": reported, "counted": counted, "delta": reported - counted,
                      "delta_percent": round(100 * (reported - counted) / counted, 1) if counted else None,
                      "other": sorted(other.items()),
                      # Claude's tokenizer is not public: the provider's count is the truth and
                      # ContextLab's an estimate, with the ratio between them, per call and per session.
                      "anthropic": anthropic,
                      "parts": [(key.removesuffix("_tokens").replace("_input", "").replace("_", " "),
                                 usage[key]) for key in parts if isinstance(usage.get(key), int)] if anthropic else [],
                      "ratio": round(reported / counted, 2) if counted else None,
                      "session_ratio": _session_usage_ratio(turn) if anthropic else None}}


def _session_usage_ratio(turn: Turn) -> dict[str, Any] | None:
    """Reported over estimated input tokens, across the session's calls that carry a provider usage."""
    reported = counted = calls = 0
    for usage, tokens in Turn.objects.filter(session_id=turn.session_id, usage__isnull=False).values_list(
            "usage", "payload_tokens"):
        value = services.reported_prompt_tokens(usage)
        if value is not None and tokens:
            reported, counted, calls = reported + value, counted + tokens, calls + 1
    return {"ratio": round(reported / counted, 2), "calls": calls} if counted else None


# -- message fate ---------------------------------------------------------------------------


def _reinjection_seqs(session: AgentSession, rows: list[SessionMessage]) -> dict[str, int]:
    """Seq of every message a re-injection event of ``rows`` names (one query, none when there is none)."""
    named = {str(e.get("message_id") or e.get("reinjected_from")) for row in rows for e in row.fate or []
             if e.get("event") == "reinjected" or e.get("reinjected_from")}
    if not named:
        return {}
    return dict(SessionMessage.objects.filter(session=session, message_id__in=named).values_list("message_id", "seq"))


def _reinjection_event(text: str, message_id: str, seqs: dict[str, int], session: AgentSession) -> dict[str, Any]:
    seq = seqs.get(message_id)
    return {"kind": "reinjected", "text": f"{text} message #{seq}" if seq else f"{text} message {message_id}",
            "url": reverse("cl-message-detail", args=[session.id, seq]) if seq else ""}


def fate_rows(session: AgentSession, rows: list[SessionMessage]) -> list[dict[str, Any]]:
    ids = [row.message_id for row in rows]
    files: dict[str, list[OffloadedFile]] = {}
    for file in OffloadedFile.objects.filter(session=session, message_id__in=ids).order_by("pk"):
        files.setdefault(file.message_id, []).append(file)
    result = []
    seqs = _reinjection_seqs(session, rows)
    for row in rows:
        events: list[dict[str, Any]] = []
        ingested = next((e for e in row.fate or [] if e.get("event") == "ingested"), None)
        if ingested and ingested.get("before_turn"):
            events.append({"kind": "ingested", "text": f"seen before turn {ingested['before_turn']}"})
        if ingested and ingested.get("reinjected_from"):
            events.append(_reinjection_event("re-injected: the original of", ingested["reinjected_from"], seqs,
                                             session))
        for file in files.get(row.message_id, []):
            events.append({"kind": "truncated",
                           "text": f"truncated at stage {file.stage}"
                                   + (f" in turn {row.truncated_turn}" if row.truncated_turn and file.stage == 2
                                      else f" before turn {row.truncated_turn}" if row.truncated_turn else ""),
                           "detail": f"{file.bytes:,} → {file.kept_bytes:,} bytes", "file": file.path})
        if row.truncated_stage is not None and not files.get(row.message_id):
            events.append({"kind": "truncated", "text": f"truncated at stage {row.truncated_stage}"
                           + (f" in turn {row.truncated_turn}" if row.truncated_turn else "")})
        if row.compacted_turn is not None:
            events.append({"kind": "compacted", "text": f"compacted in turn {row.compacted_turn}"
                           + (f" into summary v{row.summary_version}" if row.summary_version else "")})
        for event in row.fate or []:
            if event.get("event") == "stale":
                events.append({"kind": "stale", "text": f"stale: {event.get('path')} was written later "
                               f"(by message {event.get('written_by')}); the model sees an old version"})
            elif event.get("event") == "evicted":
                events.append({"kind": "evicted", "text": f"{event.get('action')} by the eviction policy in turn "
                               f"{event.get('turn')}", "detail": str(event.get("reason") or "")})
            elif event.get("event") == "reinjected":
                events.append(_reinjection_event(f"original re-injected before turn {event.get('before_turn')} as",
                                                 str(event.get("message_id")), seqs, session))
        if row.archive_file:
            events.append({"kind": "archived", "text": f"archived at {row.archive_file}:{row.archive_line}",
                           "file": row.archive_file, "line": row.archive_line})
        result.append({"row": row, "events": events,
                       "excerpt": textsafe.excerpt(first_text(row.current_content or []), 220)})
    return result


def fate_context(session: AgentSession, *, page: str | int | None = 1) -> dict[str, Any]:
    # Newest first, so page 1 is where a live session changes. The ingested
    # content can be megabytes: the list reads only the current (cut) content.
    qs = session.messages.order_by("-seq").defer("content")
    paged = Paginator(qs, MESSAGES_PER_PAGE).get_page(page)
    # Pins are read with the rows so a live re-render of the list (every state change broadcasts one,
    # the pin itself included) shows a pinned message as pinned instead of offering "pin" again.
    return {"fate_page": paged, "fate_rows": fate_rows(session, list(paged.object_list)),
            "fate_live": paged.number == 1,
            "fate_pinned": set(services.pins_of(session).message_ids)}


# -- truncation ledger ----------------------------------------------------------------------


def ledger_context(session: AgentSession, *, page: str | int | None = 1,
                   files: QuerySet[OffloadedFile] | None = None) -> dict[str, Any]:
    qs = files if files is not None else session.offloaded_files.order_by("-pk")
    paged = Paginator(qs, LEDGER_PER_PAGE).get_page(page)
    shown = list(paged.object_list)
    # No ORDER BY: sorting by seq makes SQLite walk the (session, seq) index over
    # every message of the session instead of looking the ids up (27 ms → 4 ms
    # at 10,000 messages).
    messages = {m.message_id: m for m in SessionMessage.objects.filter(
        session=session, message_id__in=[f.message_id for f in shown]).order_by().only(
        "seq", "message_id", "role", "truncated_turn", "truncated_stage", "status", "session_id")}
    now = timezone.now()
    rows = []
    for file in shown:
        days = (file.expires_at - now).days if file.expires_at else None
        rows.append({"file": file, "message": messages.get(file.message_id),
                     "expired": bool(file.expires_at and file.expires_at <= now),
                     "days_left": days, "exists": _is_file(session.workspace_file(file.path))})
    return {"ledger_page": paged, "ledger_rows": rows, "ledger_live": paged.number == 1}


def _is_file(path: Path | None) -> bool:
    return path is not None and path.is_file()


# -- manual compaction -----------------------------------------------------------------------


def compaction_context(session: AgentSession, *, event: Mapping[str, Any] | None = None) -> dict[str, Any]:
    # A new run is refused while one is queued or running, so an active run is
    # always among the newest few.
    runs = list(session.compaction_runs.order_by("-created")[:5])
    active = next((r for r in runs if r.status in ACTIVE_RUN), None)
    progress: dict[str, Any] = {}
    if event and runs and event.get("run_id") == (active or runs[0]).pk:
        progress = {k: event[k] for k in ("steps", "done", "total") if k in event}
    blocker = None if active else compaction_blocker(session)
    return {"runs": runs, "active_run": active, "run_progress": progress,
            "can_compact": active is None and blocker is None, "compact_blocker": blocker,
            **review_context(session)}


def compaction_blocker(session: AgentSession) -> str | None:
    """Why a manual compaction would do nothing now, or None when it would compact something."""
    if session.status == AgentSession.Status.IMPORTING:
        return "the session is still being imported; try again when it is done"
    if session.status != AgentSession.Status.ACTIVE:
        return f"the session is {session.status}"
    if session.live_count <= 0:
        return "no live message to compact"
    # The engine's own split, so the button agrees with what pressing it would do:
    # as the last commit computed it, unless the profile changed since.
    view = services.current_live_view(session)
    split = view.get("compaction") if view and view.get("profile") == [session.profile_id,
                                                                         session.profile.version] else None
    if split is None:
        try:
            preview = services.compaction_preview(session=session)
        except ContextLabError as exc:
            return exc.message
        split = {"compact": len(preview["compact_ids"]), "keep": len(preview["keep_ids"]),
                 "kept_tokens": preview["kept_tokens"]}
    if "error" in split:
        return str(split["error"])
    if not split["compact"]:
        return (f"nothing to compact: the {split['keep']} live message"
                f"{'s' if split['keep'] != 1 else ''} fit in the kept tail"
                f" ({split['kept_tokens']:,} tokens)")
    return None


# -- the whole page, and pushes ----------------------------------------------------------------


def summary_context(session: AgentSession) -> dict[str, Any]:
    return {"summary_live": True, "summary_text": session.summary, "summary_number": session.summary_version}


def timebar_context(session: AgentSession, turn: Turn | None, *, live: bool = True) -> dict[str, Any]:
    """The scrubber: which turn the panels show, and whether they follow the latest."""
    number = turn.number if turn else 0
    return {"timebar": {"live": live, "turn": number, "count": session.turns_count,
                        "previous": number - 1 if number > 1 else None,
                        "next": number + 1 if number and number < session.turns_count else None}}


def live_context(session: AgentSession, latest: Turn | None) -> dict[str, Any]:
    """Every panel that follows the latest turn (the page's first load, "follow the latest")."""
    context: dict[str, Any] = {"session": session, "latest": latest, "gauge_live": True}
    context.update(gauge_context(session, latest))
    context.update(flow_context(session, latest, live=True))
    context.update(llm_context(session, latest, live=True))
    context.update(fate_context(session))
    context.update(ledger_context(session))
    context.update(summary_context(session))
    context.update(timebar_context(session, latest))
    return context


def page_context(session: AgentSession) -> dict[str, Any]:
    latest = latest_turn(session, payload=True)
    context: dict[str, Any] = {"session": session, "latest": latest, "oob": False, "gauge_live": True}
    context.update(gauge_context(session, latest))
    context.update(chart_context(session))
    context.update(turns_context(session))
    context.update(flow_context(session, latest, live=True))
    context.update(llm_context(session, latest, live=True))
    context.update(fate_context(session))
    context.update(ledger_context(session))
    context.update(compaction_context(session))
    context.update(summary_context(session))
    context.update(timebar_context(session, latest))
    return context


def render_fragments(session: AgentSession, names: Iterable[str], *, event: Mapping[str, Any] | None = None) -> str:
    """The named fragments in their live version, marked for an out-of-band swap."""
    wanted = [name for name in FRAGMENTS if name in set(names)]
    # The gauge reads the latest turn only when the session has no current live view.
    needs_turn = {"flow", "llm", "timebar"} & set(wanted) or (
        "gauge" in wanted and services.current_live_view(session) is None)
    latest = latest_turn(session, payload="llm" in wanted) if needs_turn else None
    context: dict[str, Any] = {"session": session, "latest": latest, "oob": True, "gauge_live": True}
    builders = {
        "summary": lambda: summary_context(session),
        "timebar": lambda: timebar_context(session, latest),
        "gauge": lambda: gauge_context(session, latest),
        "chart": lambda: chart_context(session),
        "turns": lambda: turns_context(session),
        "flow": lambda: flow_context(session, latest, live=True),
        "llm": lambda: llm_context(session, latest, live=True),
        "fate": lambda: fate_context(session),
        "ledger": lambda: ledger_context(session),
        "compaction": lambda: compaction_context(session, event=event),
    }
    parts = []
    for name in wanted:
        if name in builders:
            context.update(builders[name]())
        parts.append(render_to_string(f"{TEMPLATE}#{name}", context))
    return "\n".join(parts)


class _RenderCache:
    """The last few pushes, so dozens of viewers of one session render an event once."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._items: OrderedDict[tuple[Any, ...], str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> str | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: tuple[Any, ...], html: str) -> None:
        with self._lock:
            self._items[key] = html
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


render_cache = _RenderCache()


def push_html(session_id: UUID | str, names: Iterable[str], *, key: object = None,
              event: Mapping[str, Any] | None = None) -> str | None:
    """The push for ``names`` after the event identified by ``key``; None when the session is gone."""
    wanted = tuple(sorted(set(names)))
    cache_key = (str(session_id), wanted, key)
    if key is not None:
        cached = render_cache.get(cache_key)
        if cached is not None:
            return cached
    session = AgentSession.objects.select_related("profile").defer("engine_state").filter(pk=session_id).first()
    if session is None:
        return None
    html = render_fragments(session, wanted, event=event)
    if key is not None:
        render_cache.put(cache_key, html)
    return html


def file_url(session: AgentSession, path: str, line: int | None = None) -> str:
    url = reverse("cl-session-file", args=[session.id, path])
    return f"{url}?line={line}" if line else url
