"""The trace: a structured record of every decision of every turn.

The trace is the product: the dashboard draws it and the replay writes it.
One ``TurnTrace`` per turn, whether or not anything fired, with one
``StepRecord`` per step of the flow in seed 001::

    trigger -> gate -> tool_result_compaction -> context_check -> (branch)
            -> summary -> validity -> mark_compressed -> result

(the ``eviction`` policy runs one ``eviction`` step after the tool results,
with the plan: every unit's score, action and reason.)

Schema ``contextlab.trace/1`` (every value JSON-serialisable):

``TurnTrace``
    ``schema``, ``turn`` (1-based), ``trigger`` ("auto" | "manual"), ``policy``,
    ``started_at`` / ``finished_at`` (UTC ISO 8601), ``duration_ms``,
    ``counter`` (e.g. "tiktoken:o200k_base"), ``exact`` (bool),
    ``budget`` {window, threshold, reserve}, ``outcome`` (one of OUTCOMES),
    ``steps`` [StepRecord], ``flaws_avoided`` [{name, title, detail}] (policy
    ``contextlab``: what CoPaw would have done wrong at this turn),
    ``copaw_losses`` [{name, title, detail}] (policy ``copaw``: where CoPaw lost
    context at this turn), ``payload`` {message_count, first_message_id,
    last_message_id, added_ids, removed_ids, changed_ids (the delta against the
    previous turn), pinned_message_ids, summary_version, tokens: {system,
    summary, messages, tool_results, total}},
    ``error`` (str | null).

``StepRecord``
    ``step`` (one of STEPS), ``status`` ("ok" | "fired" | "skipped" | "failed"
    | "warning"), ``started_at``, ``duration_ms``, ``inputs`` {...}, ``numbers``
    {...}, ``outcome`` (one sentence), ``reasons`` [sentences], ``details`` {...}
    (step-specific lists, e.g. the truncated results or the compacted ids).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contextlab.engine.core.messages import utc_now_iso

SCHEMA = "contextlab.trace/1"
STEPS: tuple[str, ...] = (
    "gate",
    "tool_result_compaction",
    "context_check",
    "summary",
    "validity",
    "mark_compressed",
    "eviction",  # the `eviction` policy's step in place of context_check..mark_compressed
    "result",
)
OUTCOMES: tuple[str, ...] = (
    "no_action",  # under the threshold: nothing compacted
    "compacted",  # summary written, messages archived
    "compaction_failed",  # summary failed; contextlab kept everything, copaw dropped
    "fallback_summary",  # LLM failed, window would overflow: extractive summary used
    "over_budget",  # system prompt + summary alone leave no room
    "nothing_to_compact",  # over the threshold but nothing may be compacted
    "evicted",  # the `eviction` policy summarised, externalized or dropped units
)

# CoPaw's known ways of losing context (reference: copaw-reme-behaviour.md).
# The ``contextlab`` policy names the ones it avoided at each turn; the
# ``copaw`` policy names the ones that happened.
FLAWS: dict[str, str] = {
    "estimator_undercount": "CoPaw's byte estimator undercounts tokens, so compaction fires late",
    "estimator_overcount": "CoPaw's byte estimator overcounts tokens, so compaction fires early",
    "raw_byte_cut": "CoPaw cuts tool output at a raw byte count, mid-line or mid-character",
    "silent_single_line_cut": "CoPaw cuts a single-line output with no notice pointing to the full text",
    "duplicate_remnant_file": "CoPaw saves the remnant of a silently cut output as a second file",
    "non_contiguous_keep": "CoPaw keeps a non-contiguous set of messages",
    "invalid_split_fallback": "CoPaw's split is invalid, so it keeps the last N messages whatever their size",
    "newest_user_compacted": "CoPaw compacts the newest user message",
    "turn_split": "CoPaw keeps an answer while compacting the question it answers",
    "tool_pair_split": "CoPaw keeps a tool call without its result (or the reverse)",
    "archive_truncated_text": "CoPaw archives tool output already truncated, not the original",
    "failed_summary_drops_messages": "CoPaw drops the messages and erases the previous summary when the summary fails",
    "weak_validity_check": "CoPaw accepts any reply containing '##' as a valid summary",
    "gate_disables_compaction": "CoPaw silently never compacts while system prompt + summary leave no room above the reserve",
    "local_time_dates": "CoPaw dates archive files by the process's local time",
    "compaction_thrash": "The agent compacts again on (almost) every request: its reported usage stays over its "
                         "limit after each compaction, and every summary call is paid for",
}


def flaw(name: str, detail: str) -> dict[str, str]:
    return {"name": name, "title": FLAWS[name], "detail": detail}


@dataclass
class StepRecord:
    step: str
    status: str = "ok"
    started_at: str = field(default_factory=utc_now_iso)
    duration_ms: float = 0.0
    inputs: dict[str, Any] = field(default_factory=dict)
    numbers: dict[str, Any] = field(default_factory=dict)
    outcome: str = ""
    reasons: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "status": self.status,
            "started_at": self.started_at,
            "duration_ms": round(self.duration_ms, 3),
            "inputs": self.inputs,
            "numbers": self.numbers,
            "outcome": self.outcome,
            "reasons": self.reasons,
            "details": self.details,
        }


Observer = Callable[[dict[str, Any], dict[str, Any]], None]
"""Called as ``observer(step_record, turn_so_far)`` the moment a step finishes."""


@dataclass
class TurnTrace:
    turn: int
    trigger: str
    policy: str
    counter: str
    exact: bool
    budget: dict[str, int]
    started_at: str = field(default_factory=utc_now_iso)
    finished_at: str | None = None
    duration_ms: float = 0.0
    outcome: str = "no_action"
    steps: list[StepRecord] = field(default_factory=list)
    flaws_avoided: list[dict[str, str]] = field(default_factory=list)
    copaw_losses: list[dict[str, str]] = field(default_factory=list)
    payload: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    _t0: float = field(default_factory=time.perf_counter, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "turn": self.turn,
            "trigger": self.trigger,
            "policy": self.policy,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration_ms": round(self.duration_ms, 3),
            "counter": self.counter,
            "exact": self.exact,
            "budget": self.budget,
            "outcome": self.outcome,
            "steps": [s.to_dict() for s in self.steps],
            "flaws_avoided": self.flaws_avoided,
            "copaw_losses": self.copaw_losses,
            "payload": self.payload,
            "error": self.error,
        }

    def step(self, name: str, observer: Observer | None) -> StepContext:
        return StepContext(self, StepRecord(step=name), observer)

    def finish(self) -> None:
        self.finished_at = utc_now_iso()
        self.duration_ms = (time.perf_counter() - self._t0) * 1000

    def get(self, name: str) -> StepRecord | None:
        for record in self.steps:
            if record.step == name:
                return record
        return None


class StepContext:
    """Times one step, appends its record and tells the observer when it ends."""

    def __init__(self, turn: TurnTrace, record: StepRecord, observer: Observer | None) -> None:
        self.turn = turn
        self.record = record
        self.observer = observer
        self._t0 = 0.0

    def __enter__(self) -> StepRecord:
        self._t0 = time.perf_counter()
        return self.record

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.record.duration_ms = (time.perf_counter() - self._t0) * 1000
        if exc is not None and self.record.status not in ("failed",):
            self.record.status = "failed"
            self.record.reasons.append(f"{type(exc).__name__}: {exc}")
        self.turn.steps.append(self.record)
        if self.observer is not None:
            self.observer(self.record.to_dict(), self.turn.to_dict())
