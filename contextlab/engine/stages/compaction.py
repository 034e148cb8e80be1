"""Compaction as the manager carries it out: the summary's post-checks, then the archive.

A policy decides what to compact and asks for the summary; these steps of
``ContextManager`` (``hook.py``) do the rest the same way for every policy:
``summarize_plan`` asks the summary of a staged compaction holding nothing,
``forced_split`` applies a planned split to the state it is committed to,
``keep_identifiers`` appends what a summary dropped and indexes the span's
identifiers, ``save_invalid_summary`` keeps a rejected summary for reading, and
``mark_compressed`` archives the originals first, then takes them out of the
live context and records the new summary version (and the day's memory notes).

They are kept here so that the hook reads as the order of a turn; the manager's
state they use is listed at the top of the class.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextlab.engine.compactors.base import Compactor, SummaryResult
from contextlab.engine.core.errors import CompactorFailed
from contextlab.engine.core.messages import Message, parse_timestamp, utc_now_iso
from contextlab.engine.core.profile import Profile
from contextlab.engine.core.trace import Observer, StepRecord, TurnTrace
from contextlab.engine.memory.long_term import record_session_notes
from contextlab.engine.stages.archive import DialogArchive
from contextlab.engine.stages.split import SplitPlan
from contextlab.engine.stages.summary.identifiers import append_index, keep_identifiers, line_chars_for_window
from contextlab.engine.stages.summary.plan import CompactionPlan, PlannedSummary, StalePlan


@dataclass
class SummaryVersion:
    version: int
    text: str
    turn: int
    trigger: str
    compactor: str
    created_at: str
    compacted_ids: list[str]
    fallback: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "text": self.text,
            "turn": self.turn,
            "trigger": self.trigger,
            "compactor": self.compactor,
            "created_at": self.created_at,
            "compacted_ids": self.compacted_ids,
            "fallback": self.fallback,
        }


class CompactionSteps:
    """The compaction steps of ``ContextManager``."""

    # The manager's state these steps read and write (set in ``ContextManager.__init__``).
    profile: Profile
    workspace: Path
    observer: Observer | None
    compactor: Compactor
    archive: DialogArchive
    transactional: bool
    writes_files: bool
    memory_workspace: Path | None
    messages: list[Message]
    summary: str | None
    summary_language: str | None
    summaries: list[SummaryVersion]
    archived_ids: list[str]
    fate: dict[str, list[dict[str, Any]]]
    _planned: PlannedSummary | None
    _removed: list[str]
    _gone: set[str]
    _archive_files: set[str]

    if TYPE_CHECKING:
        @property
        def summary_version(self) -> int: ...

        def original(self, msg: Message) -> Message: ...

        def _remove_live(self, msg: Message) -> None: ...

    def summarize_plan(self, plan: CompactionPlan, compactor: Compactor | None = None) -> PlannedSummary:
        """Ask the compactor the plan's question. Touches no state: call it holding nothing.

        ``compactor``: the one taken when planning, for a caller that shares this
        engine with other threads (a turn of theirs swaps in a planned one).
        """
        try:
            return PlannedSummary(plan=plan, result=(compactor or self.compactor).summarize(plan.request))
        except CompactorFailed as exc:
            return PlannedSummary(plan=plan, failure=exc)

    def forced_split(self, tokens: list[int], trace: TurnTrace, rec: StepRecord) -> SplitPlan:
        """The split of a planned compaction, on the state it is committed to."""
        assert self._planned is not None
        plan = self._planned.plan
        live = [m.id for m in self.messages]
        if self.summary_version != plan.summary_version or live[:len(plan.live_ids)] != plan.live_ids:
            raise StalePlan("the live messages changed other than by appends since the compaction was planned")
        planned = set(plan.compact_ids)
        compact = [i for i, mid in enumerate(live) if mid in planned]
        keep = [i for i, mid in enumerate(live) if mid not in planned]
        last = compact[-1] if compact else -1
        pinned = next((i for i in keep if i < last), None)
        appended = live[len(plan.live_ids):]
        rec.details["planned"] = {"planned_at_turn": plan.turn + 1, "rebased_over": appended}
        if appended:
            rec.reasons.append(f"{len(appended)} message(s) arrived while the summary was being written; "
                               "the compaction applies to the messages it summarised and they stay live")
        return SplitPlan(cut=last + 1, compact=compact, keep=keep, pinned=pinned,
                         kept_tokens=sum(tokens[i] for i in keep), compact_tokens=sum(tokens[i] for i in compact),
                         reserve=self.profile.reserve, fits_reserve=sum(tokens[i] for i in keep) <= self.profile.reserve,
                         cut_kind="planned")

    def keep_identifiers(self, summary: str, to_compact: list[Message]) -> str:
        """The post-check every compactor's summary passes (see ``identifiers``): what
        it dropped is appended, and the span's identifiers are indexed."""
        check = keep_identifiers(summary, [self.original(m) for m in to_compact],
                                 version=self.summary_version + 1, language=self.summary_language or "en",
                                 line_chars=line_chars_for_window(self.profile.max_input_length))
        if check.index_entry and self.writes_files:
            append_index(self.workspace, check.index_entry)
        return check.summary

    def save_invalid_summary(self, trace: TurnTrace, reason: str, raw: dict[str, Any]) -> str:
        name = f"compact_invalid_{uuid.uuid4().hex[:8]}.json"
        if not self.writes_files:
            return name
        data = {"turn": trace.turn, "policy": self.profile.policy, "reason": reason, "saved_at": utc_now_iso(), **raw}
        (self.workspace / name).write_text(json.dumps(data, ensure_ascii=False, indent=2, default=str),
                                           encoding="utf-8")
        return name

    def mark_compressed(
        self,
        trace: TurnTrace,
        to_compact: list[Message],
        summary: str,
        result: SummaryResult | None,
        *,
        fallback: bool,
        trigger: str,
        archive_originals: bool = True,
        date_for: Callable[[Message], str] | None = None,
    ) -> None:
        version = self.summary_version + 1
        with trace.step("mark_compressed", self.observer) as rec:
            records = [((self.original(m) if archive_originals else m),
                        {"archived_turn": trace.turn, "summary_version": version}) for m in to_compact]
            # Archive first: a crash after this line leaves a duplicate, never a loss.
            kwargs: dict[str, Any] = {"date_for": date_for} if date_for else {}
            if self.transactional:
                kwargs["journal_turn"] = trace.turn
            locations = self.archive.append(records, **kwargs)
            gone = {m.id for m in to_compact}
            for msg in to_compact:
                self._remove_live(msg)
            self.messages = [m for m in self.messages if m.id not in gone]
            self.summary = summary
            self.summaries.append(SummaryVersion(
                version=version, text=summary, turn=trace.turn, trigger=trigger,
                compactor=result.compactor if result else "none", created_at=utc_now_iso(),
                compacted_ids=[m.id for m in to_compact], fallback=fallback))
            self._removed.extend(m.id for m in to_compact)
            self._gone.update(m.id for m in to_compact)
            self._archive_files.update(loc.file for loc in locations)
            for msg, loc in zip(to_compact, locations, strict=True):
                self.archived_ids.append(msg.id)
                # An eviction placeholder was never ingested, so it has no fate of its
                # own: its originals' fates already say where they went.
                if msg.id in self.fate:
                    self.fate[msg.id].append({"event": "compacted", "turn": trace.turn,
                                              "summary_version": version, "archive": loc.to_dict()})
            files = sorted({loc.file for loc in locations})
            rec.status = "fired"
            rec.numbers = {"archived": len(to_compact), "summary_version": version,
                           "first_line": locations[0].line if locations else None,
                           "last_line": locations[-1].line if locations else None}
            rec.details = {"files": files, "locations": {m.id: loc.to_dict()
                                                          for m, loc in zip(to_compact, locations, strict=True)}}
            rec.outcome = f"archived {len(to_compact)} message(s) to {', '.join(files)}; summary v{version}"
            memory = self._record_memory_notes(records)
            if memory:
                rec.details["memory"] = memory

    def _record_memory_notes(self, records: list[tuple[Message, dict[str, Any]]]) -> dict[str, Any] | None:
        """The compaction-time memory flush (seed 000): preferences and try-error
        lessons of the compacted messages go to the day's note, without duplicates."""
        if self.memory_workspace is None or not records:
            return None
        newest = parse_timestamp(records[-1][0].timestamp)
        update = record_session_notes(self.memory_workspace, [m for m, _ in records], day=newest.date(), now=newest)
        if not update.added and not update.skipped:
            return None
        relative = update.path.relative_to(self.memory_workspace).as_posix()
        return {"file": relative, "added": update.added, "already_present": len(update.skipped)}
