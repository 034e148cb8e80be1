"""The Celery application: ``celery -A contextlab worker`` / ``celery -A contextlab beat``.

Configured from the Django settings (the ``CELERY_*`` names); tasks are found
in each app's ``tasks.py``. In embedded mode no worker process exists: the web
process runs the same tasks through ``contextlab.support.jobs``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "contextlab.settings")

app = Celery("contextlab")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

log = logging.getLogger(__name__)


def task(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``app.task`` with a type, for modules checked by mypy (Celery ships no types)."""
    decorator: Callable[[Callable[..., Any]], Any] = app.task(**options)
    return decorator


def _reap_on_start(sender: Any = None, **kwargs: Any) -> None:
    # A worker that starts may be replacing one that was killed: the runs that
    # one left "running" are failed now rather than at the next beat sweep
    # (which may be half a minute away, or never if no beat process runs).
    try:
        # By name: importing the task module here would close the circle
        # celery -> tasks -> workflows -> jobs -> celery.
        app.send_task("contextlab.sessions.tasks.reap_stale_runs")
    except Exception:  # the broker is down: the beat sweep will do it later
        log.exception("could not queue the sweep for stale runs")


worker_ready.connect(_reap_on_start)
