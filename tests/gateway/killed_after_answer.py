"""The deployed ASGI application, armed to die by SIGKILL at the first moment after a gateway call's answer.

Served by uvicorn in place of ``contextlab.asgi:application`` (or of the scaled
tests' ``tests.liveprobe:application``) by the kill -9 tests:

- observe mode: when the session of the answered call is about to be rebuilt
  (the answer has left with the call committed only as a pending record);
- manage mode: when Django closes the answered response of
  ``/v1/chat/completions`` (its last byte has been sent).

Anything else (``/v1/models``, the API) is served as usual.
"""

from __future__ import annotations

import functools
import os
import signal
from typing import Any

import django

django.setup()

from contextlab.gateway import observe, views  # noqa: E402  (the apps must be loaded first)


def _kill(*args: Any, **kwargs: Any) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)


observe._rebuilt = _kill
_answering = views.chat_completions


@functools.wraps(_answering)  # csrf_exempt with it
def _answered_then_killed(request: Any) -> Any:
    response = _answering(request)
    # Django calls a response's closers once the server has sent its last byte
    # (after observe mode's own, which the patch above stops first).
    response._resource_closers.append(_kill)
    return response


views.chat_completions = _answered_then_killed

if os.environ.get("CONTEXTLAB_TEST_PROBE") == "1":
    from tests.liveprobe import application  # noqa: E402,F401  (the scaled tests' probe too)
else:
    from contextlab.asgi import application  # noqa: E402,F401
