"""A collector that is down costs one warning line, never a traceback, and never a wait per batch."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contextlab.support import telemetry

REPO = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spans() -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.get_tracer("t").start_span("one").end()
    return list(memory.get_finished_spans())


def test_it_writes_one_line_per_outage_and_drops_batches_without_trying(caplog) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}/v1/traces"
    # 3 s: long enough for the exporter's first retry, whose message names the cause.
    exporter = telemetry._OneLineExporter(OTLPSpanExporter(endpoint=endpoint, timeout=3), endpoint)
    caplog.set_level(logging.INFO)
    spans = _spans()
    assert exporter.export(spans) == SpanExportResult.FAILURE
    started = time.monotonic()
    for _ in range(5):
        assert exporter.export(spans) == SpanExportResult.FAILURE
    assert time.monotonic() - started < 0.5  # no retries while the collector is known to be down
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert endpoint in lines[0].getMessage() and "refused" in lines[0].getMessage().lower()
    exporter.shutdown()


def test_loaddemo_with_the_collector_down_costs_one_warning_line(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "OTEL_", "CONTEXTLAB_OTEL"))}
    env.update({"SECRET_KEY": "dev", "CONTEXTLAB_VAR_DIR": str(tmp_path),
                "CONTEXTLAB_TIKTOKEN_DIR": str(REPO / "var" / "tiktoken"),
                "CONTEXTLAB_OTEL_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"})
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)  # the embedded mode the start script runs
    manage = [sys.executable, str(REPO / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, check=True, capture_output=True, timeout=300)
    done = subprocess.run([*manage, "loaddemo"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Imported" in done.stdout
    # Other log lines (the embedded scheduler's, say) are not the collector's business: count the export's.
    lines = [line for line in done.stderr.splitlines()
             if any(word in line.lower() for word in ("export", "opentelemetry", "span", "collector", "retry"))]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("OpenTelemetry export to http://127.0.0.1:")
    for symptom in ("Traceback", "cannot schedule new futures", "never awaited"):
        assert symptom not in done.stderr


EXITING = """
import atexit, time, django
django.setup()
from contextlab.support import live
atexit.register(time.sleep, 0.5)  # an exit that takes a moment, as the span exporter's flush does
live.publish("g", {"type": "x.y"}, coalesce="k")
live.publish("g", {"type": "x.y"}, coalesce="k")  # held back: a timer sends it 0.1 s later, during the exit
"""


def test_a_page_update_due_while_the_process_exits_is_dropped_quietly(tmp_path) -> None:
    # What made loaddemo end with "cannot schedule new futures after interpreter shutdown" and
    # "coroutine ... was never awaited" once export made its exit take a moment.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update({"SECRET_KEY": "dev", "CONTEXTLAB_VAR_DIR": str(tmp_path),
                "DJANGO_SETTINGS_MODULE": "contextlab.settings"})
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", EXITING], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
