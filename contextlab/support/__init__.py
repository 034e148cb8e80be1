"""What the web layers share to reach outside the process.

``jobs`` starts background work (embedded threads or Celery) and tells whether
a run is alive; ``live`` publishes events to browsers through the channel
layer; ``providers`` holds the upstream LLM providers the operator declared,
with their encrypted keys; ``ratelimit`` counts requests per token and failed
logins; ``telemetry`` exports ContextLab's decisions as OpenTelemetry spans.

Services, the API, the gateway and the dashboard import these; the engine and
``lib`` never do.
"""

from __future__ import annotations
