"""Pure helpers for the dashboard (no Django): diffs, the decision flow, safe text."""

from __future__ import annotations
