"""Compactors: who writes the summary.

``build_compactor("extractive")`` needs nothing; ``build_compactor("openai",
base_url=..., model=..., ...)`` talks to any OpenAI-compatible endpoint. The
openai package is imported only when that compactor is built, so the offline
engine never pays for it.
"""

from __future__ import annotations

from typing import Any

from contextlab.engine.compactors.base import (
    Compactor,
    SummaryFailed,
    SummaryRequest,
    SummaryResult,
)
from contextlab.engine.compactors.extractive import ExtractiveCompactor
from contextlab.engine.core.errors import InvalidProfile

COMPACTOR_KINDS: tuple[str, ...] = ("extractive", "openai")

__all__ = [
    "COMPACTOR_KINDS",
    "Compactor",
    "ExtractiveCompactor",
    "SummaryFailed",
    "SummaryRequest",
    "SummaryResult",
    "build_compactor",
]


def build_compactor(kind: str, **options: Any) -> Compactor:
    """A compactor by kind: "extractive" (no options) or "openai" (OpenAICompactor's arguments)."""
    if kind == "extractive":
        if options:
            names = ", ".join(sorted(options))
            raise InvalidProfile(
                f"the extractive compactor takes no options (got {names})", field="compactor"
            )
        return ExtractiveCompactor()
    if kind == "openai":
        from contextlab.engine.compactors.openai_compat import OpenAICompactor

        return OpenAICompactor(**options)
    raise InvalidProfile(
        f"unknown compactor {kind!r}; expected one of {', '.join(COMPACTOR_KINDS)}", field="compactor"
    )
