"""Compaction in three stages, so a caller never holds a lock while the summary model answers.

A caller that stores the engine's state under a lock (the web app's session
row) cannot keep that lock for the length of an LLM call: every other writer
of the session, and on SQLite of the whole database, would wait for it. So:

1. ``ContextManager.plan_compaction`` (under the lock) runs the turn on a
   throwaway copy of the engine up to the point where it would ask the
   compactor, and returns that question as a ``CompactionPlan`` (or ``None``
   when the turn needs no summary at all). Nothing of the real engine, and no
   file of the workspace, changes.
2. ``ContextManager.summarize_plan`` (nothing held) asks the compactor and
   returns a ``PlannedSummary``: the answer, or the compactor's failure.
3. ``ContextManager.prepare(planned=...)`` / ``compact(..., planned=...)``
   (under the lock again) runs the turn for real and takes the summary from
   the plan instead of calling the compactor. Messages appended in between
   stay live: the planned messages are still the oldest live ones, so the
   compaction applies to that prefix and the trace says what it was rebased
   over. When the plan no longer fits (another compaction committed in
   between, or the policy would now summarise other messages) the turn raises
   ``StalePlan`` and the caller plans again from the newer state.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextlab.engine.compactors.base import SummaryRequest, SummaryResult
from contextlab.engine.core.errors import CompactorFailed, ContextLabError
from contextlab.engine.core.messages import Message
from contextlab.engine.stages.archive import ArchiveLocation, DialogArchive, utc_date_of
from contextlab.engine.stages.truncation import OffloadedFile, OffloadStore


class StalePlan(ContextLabError):
    """The state moved under a compaction plan in a way it cannot be applied to: plan again."""


@dataclass(frozen=True)
class CompactionPlan:
    """What a compaction turn would ask the compactor, planned on the state of ``turn``."""

    trigger: str  # "auto" (the hook) or "manual"
    instruction: str | None
    turn: int  # the engine's turn when planned
    summary_version: int  # the summary the new one extends
    live_ids: list[str]  # the live messages when planned, in order
    compact_ids: list[str]  # the ones the summary covers
    request: SummaryRequest


@dataclass(frozen=True)
class PlannedSummary:
    """The compactor's answer to a plan: a result, or the failure it raised."""

    plan: CompactionPlan
    result: SummaryResult | None = None
    failure: CompactorFailed | None = None
    notes: list[str] = field(default_factory=list)


class SummaryNeeded(Exception):  # noqa: N818 - a signal, not an error: the dry run stops here
    """Raised by the planning compactor: the dry run reached the summary call."""

    def __init__(self, request: SummaryRequest) -> None:
        super().__init__("summary needed")
        self.request = request


class PlanningCompactor:
    """The compactor of the dry run: records the request instead of answering it."""

    name = "planning"
    label = "Planning (records the request)"

    def __init__(self, name: str) -> None:
        # The real compactor's name, because the trace of the dry run is never
        # kept but the request it builds must be the one the real turn builds.
        self.name = name

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        raise SummaryNeeded(request)


class PlannedCompactor:
    """The compactor of the committing turn: answers with the planned summary, once,
    and only the question the plan asked."""

    label = "Planned (answered with nothing held)"

    def __init__(self, planned: PlannedSummary, name: str) -> None:
        self.planned = planned
        self.name = name

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        plan = self.planned.plan
        if ([m.id for m in request.messages] != plan.compact_ids
                or request.previous_summary != plan.request.previous_summary
                or request.extra_instruction != plan.request.extra_instruction):
            raise StalePlan("the turn would now summarise other messages than the plan did")
        if self.planned.failure is not None:
            raise self.planned.failure
        assert self.planned.result is not None
        return self.planned.result


class DryOffloadStore(OffloadStore):
    """An offload store that keeps what the dry run saves in memory, so planning writes no file."""

    def __init__(self, workspace: Path) -> None:
        super().__init__(workspace)
        self._saved: dict[str, str] = {}

    def save(self, text: str, *, name: str | None = None) -> OffloadedFile:
        file_name = f"{name or uuid.uuid4().hex}.txt"
        relative = f"{self.folder_name}/{file_name}"
        self._saved[relative] = text
        data = text.encode("utf-8")
        return OffloadedFile(path=self.folder / file_name, relative=relative, bytes=len(data),
                             sha256=hashlib.sha256(data).hexdigest())

    def read(self, relative: str) -> str:
        if relative in self._saved:
            return self._saved[relative]
        return super().read(relative)


class DryArchive(DialogArchive):
    """A dialog archive that says where the messages would land, and writes nothing."""

    def append(
        self,
        records: Sequence[tuple[Message, dict[str, Any]]],
        *,
        date_for: Callable[[Message], str] = utc_date_of,
        serialise: Callable[[Message], dict[str, Any]] | None = None,
        journal_turn: int | None = None,
    ) -> list[ArchiveLocation]:
        locations = []
        added: dict[str, int] = {}
        for message, _ in records:
            file_name = f"{date_for(message)}.jsonl"
            added[file_name] = added.get(file_name, 0) + 1
            line = self._lines_in(self.folder / file_name) + added[file_name]
            locations.append(ArchiveLocation(f"{self.folder_name}/{file_name}", line))
        return locations


@dataclass(frozen=True)
class CompactionDraft:
    """What committing a planned summary would do, computed on a throwaway copy.

    ``summary`` is the text the commit would store (the compactor's answer after
    the identifier post-check and the pins), None when the commit would keep
    the previous summary (a failed summary).
    """

    outcome: str
    summary: str | None
    previous_summary: str | None
    summary_version: int  # the version the draft would become
    compact_ids: list[str]
    keep_ids: list[str]
    pins: dict[str, Any]
    trace: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def planned_to_dict(planned: PlannedSummary) -> dict[str, Any]:
    """A planned summary as JSON-ready data, so the commit can come in a later request."""
    plan, result = planned.plan, planned.result
    return {
        "trigger": plan.trigger, "instruction": plan.instruction, "turn": plan.turn,
        "summary_version": plan.summary_version, "live_ids": list(plan.live_ids),
        "compact_ids": list(plan.compact_ids),
        "request": {"previous_summary": plan.request.previous_summary, "language": plan.request.language,
                    "extra_instruction": plan.request.extra_instruction, "cap_tokens": plan.request.cap_tokens},
        "result": None if result is None else {
            "text": result.text, "compactor": result.compactor, "model": result.model,
            "latency_ms": result.latency_ms, "usage": result.usage, "attempts": result.attempts,
            "attempt_errors": list(result.attempt_errors),
            # The raw exchange can be large and is in the dry run's trace already.
            "raw_request": None, "raw_response": None},
        "failure": planned.failure.message if planned.failure is not None else None,
        "notes": list(planned.notes),
    }


def planned_from_dict(data: dict[str, Any]) -> PlannedSummary:
    """The inverse of ``planned_to_dict``: the same answer, without a second compactor call."""
    request_data = data["request"]
    # The messages are not stored: the committing turn compares ids with the
    # plan's ``compact_ids``, and reads the messages from its own state.
    request = SummaryRequest(messages=[], previous_summary=request_data["previous_summary"],
                             language=request_data["language"],
                             extra_instruction=request_data["extra_instruction"],
                             cap_tokens=request_data["cap_tokens"])
    plan = CompactionPlan(trigger=data["trigger"], instruction=data["instruction"], turn=int(data["turn"]),
                          summary_version=int(data["summary_version"]), live_ids=list(data["live_ids"]),
                          compact_ids=list(data["compact_ids"]), request=request)
    result = SummaryResult(**data["result"]) if data.get("result") else None
    failure = CompactorFailed(data["failure"]) if data.get("failure") else None
    return PlannedSummary(plan=plan, result=result, failure=failure, notes=list(data.get("notes") or []))


def fingerprint(data: Any) -> str:
    """A short, stable digest of JSON-ready data (pins, a plan) to compare them later."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]
