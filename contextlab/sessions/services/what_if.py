"""What-if: replay one session under a profile's edited, unsaved knobs, beside what really happened.

The replay is a background job (``WhatIfRun`` row: queued -> running -> done |
failed, with turns done for progress). It reads the session's messages as
ingested, in order, with the turn boundaries the session had, and runs them on
a fresh engine in a temporary workspace that is removed afterwards: the
session, its rows and its workspace are only read. Summaries are written by
the extractive compactor whatever the edited profile names, so a what-if
calls no model and costs nothing but CPU; it covers at most
``CONTEXTLAB_WHAT_IF_MAX_TURNS`` turns.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from contextlab.engine.compactors.extractive import ExtractiveCompactor
from contextlab.engine.core.errors import InvalidProfile
from contextlab.engine.core.messages import Message, block_from_dict, utc_now_iso
from contextlab.engine.hook import ContextManager
from contextlab.engine.replay.whatif import ReplayedTurn, TurnInput, replay_by_turn
from contextlab.engine.stages.summary.identifiers import INDEX_FILE
from contextlab.lib import loss_check
from contextlab.sessions.models import (
    COMPACTION_OUTCOMES,
    PROFILE_KNOBS,
    AgentProfile,
    AgentSession,
    SessionMessage,
    SummaryVersion,
    Turn,
    WhatIfRun,
)
from contextlab.support import jobs

log = logging.getLogger(__name__)

WHAT_IF_TASK = "contextlab.sessions.tasks.what_if_run"
LOST_SHOWN = 20  # identifiers listed per compaction; the count stays exact
REFERENCE_BYTES = 4 * 1024 * 1024  # of the replay's offloaded files read per compaction, together
PROGRESS_SECONDS = 0.5  # between two writes of the progress


def max_turns() -> int:
    return int(settings.CONTEXTLAB_WHAT_IF_MAX_TURNS)


def compactor_note(values: dict[str, Any]) -> str:
    if values.get("compactor") == "openai":
        model = values.get("compaction_model") or "the summary model"
        return (f"The edited profile summarises with {model}; a what-if never calls a model, so its summaries "
                "are written by the extractive compactor (fast, free, and not what the model would write).")
    return "Summaries are written by the extractive compactor, as the edited profile says."


def whatif_start(*, profile: AgentProfile, session: AgentSession, values: dict[str, Any],
                 by: User) -> WhatIfRun:
    """Queue a replay of ``session`` under ``values`` (the edited knobs of ``profile``).

    Both must be ``by``'s own. The values are checked by the engine first
    (``InvalidProfile`` names the knob at fault).
    """
    if profile.owner_id != by.pk or session.owner_id != by.pk:
        raise InvalidProfile("you can only try your own profiles on your own sessions", field="session")
    _engine_profile(profile, values)
    run = WhatIfRun.objects.create(profile=profile, session=session, requested_by=by, values=values,
                                   turns_total=min(session.turns_count, max_turns()))

    def not_queued(exc: Exception) -> None:
        whatif_fail(run.pk, f"the job could not be queued ({type(exc).__name__}); nothing was started. "
                            "Try again.")

    jobs.enqueue(WHAT_IF_TASK, run.pk, on_error=not_queued)
    return run


def whatif_fail(run_id: int, error: str) -> None:
    WhatIfRun.objects.filter(pk=run_id).update(status=WhatIfRun.Status.FAILED, error=error[:2_000],
                                               finished=timezone.now())


def whatif_stalled(run: WhatIfRun) -> bool:
    """A run still queued or running long after it began: its job was lost or its worker died."""
    if run.finished_or_failed:
        return False
    since = run.started or run.created
    return timezone.now() - since > timedelta(minutes=settings.CONTEXTLAB_QUEUED_MINUTES)


def _engine_profile(profile: AgentProfile, values: dict[str, Any]) -> Any:
    edited = AgentProfile(owner_id=profile.owner_id, name=str(values.get("name") or profile.name),
                          **{k: v for k, v in values.items() if k in PROFILE_KNOBS})
    return edited.to_engine()


def _message(row: dict[str, Any]) -> Message:
    return Message(role=row["role"], content=tuple(block_from_dict(b) for b in row["content"]),
                   id=row["message_id"], name=row["name"] or None, timestamp=row["timestamp"] or utc_now_iso())


def _turn_inputs(session: AgentSession, turns: list[Any], seqs: dict[str, int]) -> Iterator[TurnInput]:
    """The session's turns, each with the messages ingested before it, read from the rows as the replay goes.

    Rows come in ingest order, so the turns they were ingested before never go
    down; messages ingested after the last replayed turn are not read.
    """
    rows: Iterator[Any] = (
        SessionMessage.objects.filter(session=session).order_by("seq")
        .values("message_id", "seq", "role", "name", "timestamp", "content", "fate").iterator(chunk_size=200))
    waiting: dict[str, Any] | None = None
    waiting_before = 0
    before = 1
    for turn in turns:
        batch: list[Message] = []
        while True:
            if waiting is None:
                read: dict[str, Any] | None = next(rows, None)
                if read is None:
                    break
                ingested: dict[str, Any] = next(
                    (e for e in read["fate"] or [] if e.get("event") == "ingested"), {})
                # A message without its ingest event came with the one before it.
                before = max(before, int(ingested.get("before_turn") or before))
                waiting, waiting_before = read, before
            if waiting_before > turn["number"]:
                break
            seqs[waiting["message_id"]] = waiting["seq"]
            batch.append(_message(waiting))
            waiting = None
        yield TurnInput(trigger=turn["trigger"], messages=batch)


def _references(workspace: Path, manager: ContextManager, summary: str) -> list[tuple[str, str]]:
    known = [INDEX_FILE, *(entry["file"] for entry in manager.ledger.values())]
    budget = REFERENCE_BYTES
    found = []
    for name in loss_check.named_references(summary, known):
        path = (workspace / name).resolve()
        if not path.is_relative_to(workspace) or not path.is_file() or path.stat().st_size > budget:
            continue
        budget -= path.stat().st_size
        found.append((name, path.read_text(encoding="utf-8", errors="replace")))
    return found


def _lost(loss: loss_check.Loss, seqs: dict[str, int]) -> list[dict[str, Any]]:
    return [{"kind": lost.kind, "value": lost.value, "seq": seqs.get(lost.message_id)}
            for lost in loss.lost[:LOST_SHOWN]]


def _side(turns: list[dict[str, Any]], compactions: list[dict[str, Any]]) -> dict[str, Any]:
    return {"compactions": len(compactions), "compaction_turns": [c["turn"] for c in compactions],
            "over_window_turns": [t["number"] for t in turns if t["over_window"]],
            "lost": sum(c["lost_count"] for c in compactions), "turns": len(turns)}


def _actual(session: AgentSession, upto: int, seqs: dict[str, int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    turns = [{"number": t["number"], "outcome": t["outcome"], "tokens": t["payload_tokens"],
              "messages": t["compacted_count"], "over_window": bool(t["window"]) and t["payload_tokens"] > t["window"]}
             for t in Turn.objects.filter(session=session, number__lte=upto).order_by("number")
             .values("number", "outcome", "payload_tokens", "window", "compacted_count")]
    by_turn: dict[Any, SummaryVersion] = {v.turn: v for v in SummaryVersion.objects.filter(session=session, turn__lte=upto)}
    compactions = []
    for t in turns:
        if t["outcome"] not in COMPACTION_OUTCOMES:
            continue
        version = by_turn.get(t["number"])
        lost = list((version.lost_at_compaction or []) if version else [])
        compactions.append({"turn": t["number"], "version": version.version if version else None,
                            "messages": t["messages"],
                            "lost_count": (version.lost_count or 0) if version else 0,
                            "lost": [{"kind": x.get("kind"), "value": x.get("value"),
                                      "seq": seqs.get(x.get("message_id", ""))} for x in lost[:LOST_SHOWN]]})
    return turns, compactions


def whatif_execute(run_id: int) -> str:
    """The job: replay, compare, store the result on the row. Returns the run's final status."""
    with transaction.atomic():
        run = (WhatIfRun.objects.select_for_update().select_related("profile", "session")
               .filter(pk=run_id, status=WhatIfRun.Status.QUEUED).first())
        if run is None:
            return "gone"
        run.status = WhatIfRun.Status.RUNNING
        run.started = timezone.now()
        run.save(update_fields=["status", "started"])
    try:
        result = _replay(run)
    except Exception as exc:  # recorded on the row the page reads; the log has the rest
        log.exception("what-if %s failed", run_id)
        whatif_fail(run_id, f"{type(exc).__name__}: {exc}")
        return WhatIfRun.Status.FAILED
    WhatIfRun.objects.filter(pk=run_id).update(status=WhatIfRun.Status.DONE, result=result,
                                               turns_done=result["replayed"], finished=timezone.now())
    return WhatIfRun.Status.DONE


def _replay(run: WhatIfRun) -> dict[str, Any]:
    session, values = run.session, dict(run.values)
    profile = _engine_profile(run.profile, values)
    upto = min(session.turns_count, max_turns())
    turns = list(Turn.objects.filter(session=session, number__lte=upto).order_by("number")
                 .values("number", "trigger"))
    seqs: dict[str, int] = {}
    replayed: list[dict[str, Any]] = []
    compactions: list[dict[str, Any]] = []
    stopped = ""
    last_write = time.monotonic()
    # Never the session's workspace: files the replay offloads or archives go to a folder of its own.
    with tempfile.TemporaryDirectory(prefix="contextlab-what-if-") as folder:
        workspace = Path(folder).resolve()
        manager = ContextManager(profile, workspace, system_prompt=session.system_prompt,
                                 compactor=ExtractiveCompactor(), memory_workspace=False,
                                 tools=(session.engine_state or {}).get("tools") or None)
        for turn in replay_by_turn(_turn_inputs(session, turns, seqs), manager):
            if turn.error:
                stopped = f"turn {turn.number}: {turn.error}"
                break
            replayed.append(_replayed_row(turn))
            if turn.did_compact:
                compactions.append(_compaction(turn, manager, workspace, seqs))
            if time.monotonic() - last_write > PROGRESS_SECONDS:
                WhatIfRun.objects.filter(pk=run.pk).update(turns_done=len(replayed))
                last_write = time.monotonic()
    actual_turns, actual_compactions = _actual(session, upto, seqs)
    by_number = {t["number"]: t for t in actual_turns}
    return {
        "session_turns": session.turns_count, "replayed": len(replayed), "capped": session.turns_count > upto,
        "max_turns": max_turns(), "stopped": stopped, "compactor_note": compactor_note(values),
        "window": {"actual": session.tokens_window, "what_if": profile.max_input_length},
        "threshold": {"actual": session.tokens_threshold, "what_if": profile.threshold},
        "actual": _side(actual_turns, actual_compactions), "what_if": _side(replayed, compactions),
        "compactions": {"actual": actual_compactions, "what_if": compactions},
        "turns": [{"number": t["number"], "actual": by_number.get(t["number"], {}).get("tokens"),
                   "what_if": t["tokens"], "actual_outcome": by_number.get(t["number"], {}).get("outcome", ""),
                   "what_if_outcome": t["outcome"]} for t in replayed],
    }


def _replayed_row(turn: ReplayedTurn) -> dict[str, Any]:
    return {"number": turn.number, "outcome": turn.outcome, "tokens": turn.payload_tokens,
            "over_window": turn.over_window}


def _compaction(turn: ReplayedTurn, manager: ContextManager, workspace: Path, seqs: dict[str, int]) -> dict[str, Any]:
    loss = loss_check.lost_at_compaction(turn.compacted, turn.summary, _references(workspace, manager, turn.summary))
    return {"turn": turn.number, "version": turn.summary_version, "lost_count": loss.count,
            "messages": len(turn.compacted), "lost": _lost(loss, seqs)}
