"""What a person pins before a compaction: messages that must stay, facts that must be said.

A pinned message stays in the live context when a compaction would take it,
together with the rest of its tool group (a call never stays without its
results, nor a result without its call), as long as the pins fit their budget.
A pinned message that must go anyway (over the budget) leaves only with its
identifiers written into the summary: the post-check of ``identifiers`` may
move some of a span's identifiers to the index file, a pin's never.

A pinned fact ("must keep: the DB is /srv/db.sqlite") is put into the
compactor's instruction and, when the summary does not say it word for word,
appended to the summary. Pins hold for every compaction until removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from contextlab.engine.core.errors import MalformedInput
from contextlab.engine.core.messages import Message
from contextlab.engine.stages.summary.identifiers import extract_identifiers, is_kept, normalize

MAX_PINNED_MESSAGES = 50
MAX_FACTS = 20
MAX_FACT_CHARS = 500
# Share of the reserve pinned messages may keep live; the rest go with their identifiers.
PIN_BUDGET_SHARE = 0.5

FACTS_LEAD = "Pinned facts (kept as asked)"
IDENTIFIERS_LEAD = "Identifiers of pinned messages that were compacted"


@dataclass
class Pins:
    message_ids: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.message_ids or self.facts)

    def to_dict(self) -> dict[str, Any]:
        return {"message_ids": list(self.message_ids), "facts": list(self.facts)}

    @classmethod
    def from_dict(cls, data: Any) -> Pins:
        data = data if isinstance(data, dict) else {}
        return cls(message_ids=[str(m) for m in data.get("message_ids") or []],
                   facts=[str(f) for f in data.get("facts") or []])


def clean_fact(text: str) -> str:
    """A fact as stored: one line, not empty, bounded."""
    fact = " ".join(str(text).split())
    if not fact:
        raise MalformedInput("a pinned fact cannot be empty", field="fact")
    if len(fact) > MAX_FACT_CHARS:
        raise MalformedInput(f"a pinned fact holds at most {MAX_FACT_CHARS} characters", field="fact")
    return fact


def instruction_with_facts(instruction: str | None, facts: Sequence[str]) -> str | None:
    """The compactor's instruction, with the pinned facts it must keep."""
    if not facts:
        return instruction
    lines = "\n".join(f"- {fact}" for fact in facts)
    asked = f"The summary must state these facts, word for word:\n{lines}"
    return f"{instruction}\n\n{asked}" if instruction else asked


def pin_budget(reserve: int) -> int:
    return int(reserve * PIN_BUDGET_SHARE)


def keep_pins_in_summary(summary: str, pins: Pins, compacted_pinned: Sequence[Message]) -> str:
    """The summary with every pinned fact, and every identifier of a compacted pinned
    message (as the engine extracts them), that it does not already say."""
    text = normalize(summary)
    lines: list[str] = []
    facts = [fact for fact in pins.facts if normalize(fact) not in text]
    if facts:
        lines.append(f"- {FACTS_LEAD}: " + "; ".join(facts))
    missing = [i.value for i in extract_identifiers(list(compacted_pinned)) if not is_kept(i, text)]
    if missing:
        lines.append(f"- {IDENTIFIERS_LEAD}: " + ", ".join(_code(v) for v in missing))
    if not lines:
        return summary
    return summary.rstrip("\n") + "\n" + "\n".join(lines) + "\n"


def _code(value: str) -> str:
    return f"`{value}`" if "`" not in value else f"`` {value} ``"


class Pinning:
    """Pinning and unpinning on ``ContextManager`` (``hook.py``): what an operator asks for, checked."""

    # The manager's state these methods read and write.
    messages: list[Message]
    pins: Pins

    def pin_message(self, message_id: str) -> None:
        """Keep a live message through the coming compactions (see ``pins``)."""
        if message_id not in {m.id for m in self.messages}:
            raise MalformedInput(f"message {message_id!r} is not in the live context: only a live message "
                                 "can be pinned", field="message_id")
        if message_id in self.pins.message_ids:
            return
        if len(self.pins.message_ids) >= MAX_PINNED_MESSAGES:
            raise MalformedInput(f"at most {MAX_PINNED_MESSAGES} messages can be pinned", field="message_id")
        self.pins.message_ids.append(message_id)

    def unpin_message(self, message_id: str) -> None:
        self.pins.message_ids = [m for m in self.pins.message_ids if m != message_id]

    def pin_fact(self, text: str) -> str:
        """A fact every coming summary must state; returns it as stored."""
        fact = clean_fact(text)
        if fact not in self.pins.facts:
            if len(self.pins.facts) >= MAX_FACTS:
                raise MalformedInput(f"at most {MAX_FACTS} facts can be pinned", field="fact")
            self.pins.facts.append(fact)
        return fact

    def unpin_fact(self, text: str) -> None:
        fact = " ".join(str(text).split())
        self.pins.facts = [f for f in self.pins.facts if f != fact]
