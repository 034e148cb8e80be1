"""The gateway's periodic work (Celery tasks; in embedded mode run by the web process's beat thread)."""

from __future__ import annotations

from contextlab.celery import task
from contextlab.gateway import observe


@task()
def settle_observed_calls() -> int:
    """Take into their sessions the observed calls left pending (a process stopped between
    committing a call and rebuilding its session); how many."""
    return observe.settle_pending()
