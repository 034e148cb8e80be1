"""Hand-built sessions for engine tests: a few readable builders."""

from __future__ import annotations

from contextlab.engine.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock

_counter = iter(range(1, 10_000_000))


def _id(prefix: str) -> str:
    return f"{prefix}{next(_counter)}"


def user(text: str) -> Message:
    return Message.text("user", text, id=_id("u"))


def assistant(text: str) -> Message:
    return Message.text("assistant", text, id=_id("a"))


def tool_round(name: str, args: dict, outputs: list[str], *, text: str = "") -> list[Message]:
    """One assistant message with len(outputs) parallel calls, then one result message per call."""
    calls = [ToolUseBlock(id=_id("call"), name=name, input=args) for _ in outputs]
    head = Message(role="assistant", content=((TextBlock(text),) if text else ()) + tuple(calls), id=_id("a"))
    results = [
        Message(role="tool", content=(ToolResultBlock(id=c.id, name=name, output=out),), id=_id("t"))
        for c, out in zip(calls, outputs, strict=True)
    ]
    return [head, *results]


def log_lines(n: int, tag: str = "line") -> str:
    return "".join(f"{tag} {i:05d}: compiling module_{i % 37}.c with -O2 -Wall\n" for i in range(n))
