"""Watching agents we do not run: what their own context manager did.

``inference`` infers, from one request of a conversation to the next, what the
agent's context manager did in between (messages dropped, outputs shortened, a
summary inserted); ``otlp`` reads the LLM calls an agent's OpenTelemetry
spans record as such requests; ``provider_edits`` is the provider's own
context editing as one step of a turn's decision flow.
"""

from __future__ import annotations
