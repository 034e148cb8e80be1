"""Pure helpers (no Django) for the services and the screens: diffs, the
decision flow, safe text, the text of stored content blocks, the loss check.

They build on the engine and on nothing above it."""

from __future__ import annotations
