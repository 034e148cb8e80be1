"""Observed sessions are drawn by the dashboard: its logged-in client fixture."""

from __future__ import annotations

from tests.dashboard.conftest import alice_client

__all__ = ["alice_client"]
