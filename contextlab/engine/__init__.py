"""ContextLab's engine: the pre-reasoning hook as an importable library.

Importable without Django. The pieces a caller needs::

    from contextlab.engine import ContextManager, Profile, Message

    manager = ContextManager(Profile(max_input_length=32_000), "workspace/", system_prompt="…")
    manager.append(messages_from_any(openai_messages))
    turn = manager.prepare()          # runs the hook
    send(turn.openai_messages())      # the exact payload; turn.trace says why
"""

from __future__ import annotations

from contextlab.engine.core.errors import (
    CompactorFailed,
    ContextLabError,
    InvalidMessages,
    InvalidProfile,
    MalformedInput,
    TokenizerUnavailable,
    UnknownFormat,
)
from contextlab.engine.core.messages import Message
from contextlab.engine.core.profile import Profile
from contextlab.engine.hook import ContextManager, TurnResult
from contextlab.engine.stages.split import SplitPreview

__all__ = [
    "CompactorFailed",
    "ContextLabError",
    "ContextManager",
    "InvalidMessages",
    "InvalidProfile",
    "MalformedInput",
    "Message",
    "Profile",
    "SplitPreview",
    "TokenizerUnavailable",
    "TurnResult",
    "UnknownFormat",
]
