"""What every session workflow checks in what a client sends, and the errors it raises."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from contextlab.engine.convert import detect_message_format, from_agentscope, from_anthropic, from_openai
from contextlab.engine.core.errors import ContextLabError, InputTooLarge, InvalidMessages, MalformedInput
from contextlab.engine.core.messages import Message
from contextlab.engine.core.unicode import encodable, first_unencodable, holds_nul
from contextlab.engine.importers.json_stream import ParseBudget

log = logging.getLogger(__name__)


log = logging.getLogger(__name__)

BUNDLE_FORMAT = "contextlab.session-bundle/1"
MAX_MESSAGE_ID_LENGTH = 200
MAX_TITLE_LENGTH = 200
MAX_INSTRUCTION_LENGTH = 20_000


class SessionUnavailable(ContextLabError):
    """The session cannot take this request now (an import is still replaying it)."""


class PayloadTooLarge(InputTooLarge):
    """An upload over the configured size limit."""


def upload_budget(size: int, *, share_strings: bool = True) -> ParseBudget:
    """What everything one ``size``-byte upload parses may take in memory, shared by all it holds (the
    members of a zip, the lines of JSON Lines, the JSON inside span attributes): twice the upload plus
    a constant the operator sets. One line of JSON Lines, or one row of a bundle, may hold twice an API body."""
    from django.conf import settings

    return ParseBudget.for_size(size, "the upload", line_bytes=2 * int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE),
                                line_text="CONTEXTLAB_MAX_BODY_BYTES × 2", share_strings=share_strings,
                                slack=int(settings.CONTEXTLAB_IMPORT_MEMORY_SLACK_BYTES),
                                slack_text="CONTEXTLAB_IMPORT_MEMORY_SLACK_BYTES")


class RunInProgress(ContextLabError):
    """A manual compaction of the session is already queued or running."""



def check_text(value: Any, field: str, *, max_length: int | None = None) -> str:
    if not isinstance(value, str):
        raise MalformedInput(f"{field} must be a string", field=field)
    if "\x00" in value:
        raise MalformedInput(f"{field} holds a NUL character", field=field)
    if not encodable(value):
        raise MalformedInput(f"{field} holds a lone UTF-16 surrogate, which is not text", field=field)
    if max_length is not None and len(value) > max_length:
        raise MalformedInput(f"{field} is longer than {max_length:,} characters", field=field)
    return value


def check_raw_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise InvalidMessages("messages must be a list of message objects", field="messages")
    if not messages:
        raise InvalidMessages("messages is empty", field="messages")
    for index, item in enumerate(messages):
        # PostgreSQL text cannot hold NUL, so refuse it on every database
        # rather than store a message SQLite keeps and PostgreSQL loses.
        if holds_nul(item):
            raise InvalidMessages(
                "the message holds a NUL character (\\u0000), which cannot be stored; escape binary output",
                field=f"messages[{index}]",
            )
    where = first_unencodable(messages, "messages")
    if where is not None:
        raise InvalidMessages("the message holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text",
                              field=where)
    return messages


def check_message_ids(messages: list[Message]) -> None:
    for index, msg in enumerate(messages):
        if len(msg.id) > MAX_MESSAGE_ID_LENGTH:
            raise InvalidMessages(f"message id longer than {MAX_MESSAGE_ID_LENGTH} characters",
                                  field=f"messages[{index}].id")


def convert_messages(messages: list[dict[str, Any]], known_calls: Mapping[str, str]) -> list[Message]:
    """Like ``messages_from_any``, but a batch may answer tool calls of an earlier batch."""
    fmt = detect_message_format(messages)
    if fmt == "anthropic":
        return from_anthropic(messages, known_calls=known_calls)
    if fmt == "agentscope":
        return from_agentscope(messages, known_calls=known_calls)
    return from_openai(messages, known_calls=known_calls)


