"""Replay a session's messages turn by turn, with the turn boundaries it really had.

``engine.replay`` cuts a transcript into turns itself (before each assistant
message). A what-if must compare with what a live session did, so here the
caller gives the turns: for each, the messages ingested before it and its
trigger ("manual" runs a manual compaction, anything else the hook). The
engine it is given decides everything else, so a different profile gives a
different run over the same input.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from contextlab.engine.core.errors import ContextLabError
from contextlab.engine.core.messages import Message
from contextlab.engine.hook import ContextManager

COMPACTED = ("compacted", "fallback_summary")


@dataclass(frozen=True)
class TurnInput:
    trigger: str
    messages: Sequence[Message]


@dataclass
class ReplayedTurn:
    number: int
    trigger: str
    outcome: str
    payload_tokens: int
    window: int
    threshold: int
    summary_version: int
    # When this turn compacted: the messages it compacted, as the compactor saw
    # them, and the summary it wrote.
    compacted: list[Message] = field(default_factory=list)
    summary: str = ""
    error: str = ""

    @property
    def did_compact(self) -> bool:
        return self.outcome in COMPACTED

    @property
    def over_window(self) -> bool:
        return self.payload_tokens > self.window


def replay_by_turn(turns: Iterable[TurnInput], manager: ContextManager) -> Iterator[ReplayedTurn]:
    """Run ``turns`` through ``manager``, one ``ReplayedTurn`` each.

    Stops after the first turn that fails (its ``error`` says why): what
    follows would build on a context the session never had.
    """
    for turn in turns:
        number = manager.turn + 1
        version = manager.summary_version
        try:
            if turn.messages:
                manager.append(turn.messages)
            live = {m.id: m for m in manager.messages}
            result = manager.compact() if turn.trigger == "manual" else manager.prepare()
        except ContextLabError as exc:
            yield ReplayedTurn(number=number, trigger=turn.trigger, outcome="error", payload_tokens=0,
                               window=manager.profile.max_input_length, threshold=manager.profile.threshold,
                               summary_version=manager.summary_version, error=str(exc))
            return
        trace = result.trace
        replayed = ReplayedTurn(number=trace.turn, trigger=turn.trigger, outcome=trace.outcome,
                                payload_tokens=int(trace.payload["tokens"]["total"]),
                                window=manager.profile.max_input_length, threshold=manager.profile.threshold,
                                summary_version=manager.summary_version)
        if manager.summary_version != version and manager.summaries:
            newest = manager.summaries[-1]
            replayed.compacted = [live[mid] for mid in newest.compacted_ids if mid in live]
            replayed.summary = newest.text
        yield replayed
