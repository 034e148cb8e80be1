"""ContextLab: a context manager for LLM agents, and a live dashboard to watch it work.

Where to look:

- ``engine/``: the pre-reasoning hook as a plain library (no Django); start at ``engine/hook.py``.
- ``sessions/``: the domain and its workflows (``sessions/services/``), models and tasks.
- ``api/``, ``gateway/``, ``dashboard/``, ``insights/``, ``core/``: the faces (JSON API,
  OpenAI/Anthropic-compatible proxy, pages and live fragments, memory and policy views, health).
- ``support/``: what those layers share to reach the outside: background jobs, live
  events, upstream providers, rate limits, OpenTelemetry export.
- ``lib/``: pure helpers for the services and screens.

Two modules stay at this top level on purpose: ``cli.py`` is the ``contextlab``
command that ``pyproject.toml`` installs (``contextlab.cli:main``), and
``client.py`` is the standard-library client an agent imports or vendors as one
file (``from contextlab.client import ContextLabClient``). Both are entry points
whose names users type, so they keep the shortest path. The Django and Celery
wiring (``settings``, ``urls``, ``asgi``, ``wsgi``, ``celery``) stays here because
the frameworks look for it here.
"""
