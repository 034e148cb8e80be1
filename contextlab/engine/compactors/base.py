"""What every compactor takes and gives back.

The engine builds a ``SummaryRequest`` and asks a compactor to turn it into a
``SummaryResult``; whether the text is a usable summary is the validity
check's call, not the compactor's. A compactor raises ``CompactorFailed`` only
when it has no answer at all (timeout, HTTP error, empty reply, after its
retries), and then attaches what it sent and received so the engine can save
them next to the ``compact_invalid_<id>.json`` of an invalid reply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from contextlab.engine.core.ansi import strip_ansi, without_ansi
from contextlab.engine.core.errors import CompactorFailed
from contextlab.engine.core.messages import Message


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """Messages to summarise, and how.

    ``previous_summary`` set → incremental update of that document.
    ``language`` is "en", "zh" or "auto". ``extra_instruction`` comes from a
    manual ``/compact <instruction>``. ``cap_tokens`` bounds the transcript the
    summariser reads (the oldest user ask and the newest messages are kept).

    Terminal escape codes are removed from the messages here, the one door
    every compactor's input passes: no summary (extractive or LLM) copies
    ``\x1b[2m`` into a page. The caller's messages, and so the archive, keep them.
    """

    messages: list[Message]
    previous_summary: str | None
    language: str
    extra_instruction: str | None = None
    cap_tokens: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", without_ansi(self.messages))
        if self.previous_summary:
            object.__setattr__(self, "previous_summary", strip_ansi(self.previous_summary))


@dataclass(frozen=True, slots=True)
class SummaryResult:
    """A compactor's answer, with everything the trace and the debugger show.

    ``latency_ms`` is the wall time of the whole call, retries included;
    ``attempts`` counts the calls made; ``attempt_errors`` holds the reason of
    every failed attempt that came before the one that answered.
    """

    text: str
    compactor: str
    model: str | None
    latency_ms: float
    usage: dict[str, int] | None
    raw_request: dict[str, Any] | None
    raw_response: dict[str, Any] | None
    attempts: int
    attempt_errors: list[str] = field(default_factory=list)


class SummaryFailed(CompactorFailed):
    """A compactor gave up; carries the evidence for the debugger.

    A subclass, so ``except CompactorFailed`` still catches it.
    """

    def __init__(
        self,
        message: str,
        *,
        compactor: str,
        model: str | None = None,
        attempts: int = 0,
        latency_ms: float = 0.0,
        raw_request: dict[str, Any] | None = None,
        raw_response: dict[str, Any] | None = None,
        attempt_errors: list[str] | None = None,
    ) -> None:
        super().__init__(message, field="compactor")
        self.compactor = compactor
        self.model = model
        self.attempts = attempts
        self.latency_ms = latency_ms
        self.raw_request = raw_request
        self.raw_response = raw_response
        self.attempt_errors = list(attempt_errors or [])

    def debug_record(self) -> dict[str, Any]:
        """A JSON-ready record of the failure (what ``compact_invalid_<id>.json`` stores)."""
        return {
            "error": self.message,
            "compactor": self.compactor,
            "model": self.model,
            "attempts": self.attempts,
            "attempt_errors": self.attempt_errors,
            "latency_ms": self.latency_ms,
            "request": self.raw_request,
            "response": self.raw_response,
        }


@runtime_checkable
class Compactor(Protocol):
    """Something that writes summaries.

    ``name`` is the stable id recorded in traces ("extractive", "openai");
    ``label`` is what the UI shows, e.g. "Extractive (offline, no LLM)".
    """

    name: str
    label: str

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Write the summary; raise ``CompactorFailed`` when there is no answer."""
        ...
