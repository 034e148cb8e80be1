"""Put the original text of a compacted or cut message back into the live context.

A summary or a truncation notice may have lost what the agent needs now. The
operator can then re-inject the message's original (full) text: it comes back
as a new user-visible message at the end of the context, marked as
re-injected and naming its source, so the next turn sends it. It is an
ordinary message from then on: counted in the budget, and compacted later
like any other when the context fills up.

The fate of the source records the re-injection, the fate of the new message
says where it came from, and the next turn's trace lists it
(``trace.payload["reinjected"]``).
"""

from __future__ import annotations

import json

from contextlab.engine.core.messages import Message, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from contextlab.engine.hook import ContextManager

# The key in the new message's metadata that names its source message.
SOURCE_KEY = "reinjected_from"


def original_text(message: Message) -> str:
    """Every block of ``message`` as plain text, tool calls and results labelled."""
    parts: list[str] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            parts.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            arguments = block.raw_input or json.dumps(block.input, ensure_ascii=False)
            parts.append(f"tool call {block.name}({arguments})")
        elif isinstance(block, ToolResultBlock):
            label = f"tool result of {block.name}" + (" (error)" if block.is_error else "")
            parts.append(f"{label}:\n{block.output_text()}")
    return "\n\n".join(part for part in parts if part)


def reinject(manager: ContextManager, original: Message, *, label: str = "") -> Message:
    """Append the original text of ``original`` to the live context as a new user message.

    ``original`` is the message as it was ingested (the caller has it: the web
    app stores it, an engine user reads it back with ``manager.original`` or
    from the dialog archive). ``label`` names it for the reader ("message #40").
    Raises ``MalformedInput`` when the text is over the profile's message limit
    or a tool call still waits for its result (nothing is changed then).
    """
    name = label or f"message {original.id}"
    header = (f"[Re-injected: the original text of {name} ({original.role}), "
              "put back into the context because it had been compacted or cut.]")
    text = f"{header}\n\n{original_text(original)}"
    number = sum(1 for event in manager.fate.get(original.id, []) if event.get("event") == "reinjected") + 1
    message = Message.text("user", text, id=f"{original.id}.reinjected-{number}",
                           metadata={SOURCE_KEY: original.id})
    (stored,) = manager.append([message])
    manager.fate[stored.id][0][SOURCE_KEY] = original.id
    manager.fate.setdefault(original.id, []).append(
        {"event": "reinjected", "before_turn": manager.turn + 1, "message_id": stored.id})
    return stored
