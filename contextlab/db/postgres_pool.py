"""What the PostgreSQL connection pool (``settings.DATABASES``'s ``OPTIONS["pool"]``) does to a
connection a request gives back, before the next request gets it."""

from __future__ import annotations

from typing import Any


def reset(connection: Any) -> None:
    """Release the session-level advisory locks the connection still holds: ``jobs.hold_run``
    counts on PostgreSQL dropping them when the connection closes, and a pooled connection
    does not close. The rest of the session (its time zone and role, set by Django when the
    connection was made) stays as it is."""
    connection.execute("SELECT pg_advisory_unlock_all()")
