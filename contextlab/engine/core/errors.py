"""Errors the engine raises for bad input, each naming the field at fault.

Every error is a ``ContextLabError`` with a human sentence and, where one
exists, the dotted path of the offending field, so the API can answer
``{"error": ..., "field": ...}`` and the CLI can print one clear line.
"""

from __future__ import annotations


class ContextLabError(Exception):
    """Base class for every error the engine raises on purpose."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def as_dict(self) -> dict[str, str | None]:
        return {"error": self.message, "field": self.field, "kind": type(self).__name__}

    def __str__(self) -> str:
        if self.field:
            return f"{self.message} (field: {self.field})"
        return self.message


class InvalidMessages(ContextLabError):
    """Messages that no provider would accept: unknown roles, orphan results, ..."""


class UnknownFormat(ContextLabError):
    """A transcript whose format could not be recognised."""


class MalformedInput(ContextLabError):
    """Input that is not valid JSON, not UTF-8, nested too deeply, or too large."""


class InputTooLarge(MalformedInput):
    """Input over a size or memory limit; the message names the limit and what sets it."""


class InvalidProfile(ContextLabError):
    """A profile knob out of bounds, or knobs that cannot work together."""


class TokenizerUnavailable(ContextLabError):
    """The tiktoken vocabulary files are missing or corrupt."""


class CompactorFailed(ContextLabError):
    """The summary LLM timed out, errored, or answered something unusable."""
