"""OpenTelemetry out: ContextLab's decisions as spans in the tracing tools people already run.

Off unless an OTLP endpoint is configured (``CONTEXTLAB_OTEL_ENDPOINT``, or the
standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``),
over HTTP/protobuf (the default) or gRPC (``CONTEXTLAB_OTEL_PROTOCOL=grpc``).
Spans leave through a batch processor on its own thread: a request never waits
for the collector, and a collector that is down costs dropped spans, not errors.

What becomes a span:

* every hook run, with one child span per decision step (gate, tool-result
  truncation, context check, summary, validity, archive, result), timed from the
  engine's own trace, so the spans show the same numbers as the dashboard;
* a summary made by an LLM also carries the GenAI conventions' attributes
  (``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.usage.*``);
* every gateway call, as a GenAI client span in the caller's own trace when the
  caller sent ``traceparent``, with the hook run beneath it; the upstream request
  carries the gateway span's context on to the provider.

ContextLab's own attributes are namespaced ``contextlab.*``. The gateway's span
also carries what Arize Phoenix and other OpenInference readers show: the span
kind (``LLM``; ``CHAIN`` for turns and steps), ``session.id``, the payload sent
after compaction and the reply as messages (capped, and left out with
``CONTEXTLAB_OTEL_CAPTURE_CONTENT=false``), the provider, the mapped request
model, the response model, finish reasons; the resource names the project
(``openinference.project.name``, ``CONTEXTLAB_OTEL_PROJECT``).

An unreachable collector costs one warning line per outage: the exporter's own
retry messages are folded into it, and batches are dropped without a try until
``OUTAGE_SECONDS`` have passed.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

log = logging.getLogger(__name__)

TRACER_NAME = "contextlab"
PROTOCOLS = ("http/protobuf", "grpc")
# The headers of the W3C trace context a caller sends and the gateway passes on.
TRACE_HEADERS = ("traceparent", "tracestate")

# The attributes OpenInference readers (Arize Phoenix) group and draw spans by.
PROJECT_ATTRIBUTE = "openinference.project.name"
SPAN_KIND = "openinference.span.kind"

_lock = threading.Lock()
_provider: TracerProvider | None = None
_configured = False


def endpoint_from_environment() -> tuple[str, str] | None:
    """(endpoint, protocol) the operator configured, or None when export is off."""
    endpoint = (os.getenv("CONTEXTLAB_OTEL_ENDPOINT") or os.getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or os.getenv("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()
    if not endpoint:
        return None
    protocol = (os.getenv("CONTEXTLAB_OTEL_PROTOCOL") or os.getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.getenv("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    if protocol not in PROTOCOLS:
        raise ValueError(f"CONTEXTLAB_OTEL_PROTOCOL must be one of {', '.join(PROTOCOLS)}, not {protocol!r}")
    return endpoint, protocol


def capture_content() -> bool:
    """Whether the gateway's span carries the messages (``CONTEXTLAB_OTEL_CAPTURE_CONTENT``, on by default)."""
    return os.getenv("CONTEXTLAB_OTEL_CAPTURE_CONTENT", "true").strip().lower() not in ("0", "false", "no", "off")


def content_limit() -> int:
    """Characters of message text one span carries at most (``CONTEXTLAB_OTEL_CONTENT_MAX_CHARS``)."""
    try:
        return max(0, int(os.getenv("CONTEXTLAB_OTEL_CONTENT_MAX_CHARS", "32000")))
    except ValueError:
        return 32_000


# -- an unreachable collector: one line, no traceback -----------------------------------

OUTAGE_SECONDS = 60.0
# The loggers the OTLP exporters and the batch processor report a failed export on.
_EXPORT_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.exporter.otlp.common.http",
                   "opentelemetry.exporter.otlp.proto.grpc.exporter", "opentelemetry.sdk.trace.export",
                   "opentelemetry.sdk._shared_internal")


class _Folded(logging.Filter):
    """Keeps the exporters' own messages about a failed export out of the log; the first one
    since the last export began (the cause: "connection refused", an HTTP status) is kept for
    the single warning ``_OneLineExporter`` writes."""

    def __init__(self) -> None:
        super().__init__()
        self.last = ""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.CRITICAL:
            return True
        if not self.last:
            try:
                self.last = record.getMessage()
            except Exception:  # a message that cannot be formatted is still a failed export
                self.last = str(record.msg)
        return False


_folded = _Folded()


class _OneLineExporter(SpanExporter):
    """The OTLP exporter, with a collector that is down costing one warning line per outage.

    During an outage batches are dropped at once for ``OUTAGE_SECONDS`` (no retries, so
    a process exits without waiting for a collector that is not there), then tried again.
    """

    def __init__(self, inner: SpanExporter, endpoint: str) -> None:
        self.inner, self.endpoint = inner, endpoint
        self._down_until = 0.0
        self._down = False
        for name in _EXPORT_LOGGERS:
            logger = logging.getLogger(name)
            if _folded not in logger.filters:
                logger.addFilter(_folded)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if time.monotonic() < self._down_until:
            return SpanExportResult.FAILURE
        _folded.last = ""
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # an exporter that raises is an exporter that failed
            _folded.last = f"{type(exc).__name__}: {exc}"
            result = SpanExportResult.FAILURE
        if result == SpanExportResult.SUCCESS:
            if self._down:
                log.warning("OpenTelemetry export to %s works again", self.endpoint)
            self._down = False
            return result
        self._down_until = time.monotonic() + OUTAGE_SECONDS
        if not self._down:
            self._down = True
            reason = " ".join(_folded.last.split())[:300] or "no answer"
            log.warning("OpenTelemetry export to %s failed, spans are dropped for %d s: %s",
                        self.endpoint, int(OUTAGE_SECONDS), reason)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _exporter(endpoint: str, protocol: str) -> SpanExporter:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    # The standard variable names the base URL; the exporter wants the traces path.
    if not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return HttpExporter(endpoint=endpoint)


def configure(endpoint: str, protocol: str = "http/protobuf", *, exporter: SpanExporter | None = None,
              service_name: str | None = None) -> TracerProvider:
    """Start exporting to ``endpoint``; replaces an earlier configuration (tests, a settings change)."""
    global _provider, _configured
    resource = Resource.create({"service.name": service_name or os.getenv("OTEL_SERVICE_NAME") or "contextlab",
                                PROJECT_ATTRIBUTE: os.getenv("CONTEXTLAB_OTEL_PROJECT") or "contextlab"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(
        _OneLineExporter(exporter or _exporter(endpoint, protocol), endpoint), schedule_delay_millis=500))
    with _lock:
        previous, _provider, _configured = _provider, provider, True
    if previous is not None:
        previous.shutdown()
    return provider


def disable() -> None:
    """Stop exporting, flushing what is queued."""
    global _provider, _configured
    with _lock:
        previous, _provider, _configured = _provider, None, True
    if previous is not None:
        previous.shutdown()


def tracer() -> Tracer | None:
    """The tracer when export is on, else None (and nothing else is paid for)."""
    global _configured
    if not _configured:
        configured = None
        with _lock:
            if not _configured:
                _configured = True
                configured = endpoint_from_environment()
        if configured is not None:
            configure(*configured)
    provider = _provider
    return provider.get_tracer(TRACER_NAME) if provider is not None else None


def flush(timeout_millis: int = 5_000) -> bool:
    provider = _provider
    return provider.force_flush(timeout_millis) if provider is not None else True


# -- the engine's turns ------------------------------------------------------------------


def _nanos(iso: str | None) -> int | None:
    if not iso:
        return None
    try:
        moment = dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(moment.timestamp() * 1_000_000_000)


def _scalar(value: Any) -> bool | int | float | str | None:
    if isinstance(value, bool | int | float | str):
        return value
    return None


def _step_attributes(step: Mapping[str, Any]) -> dict[str, Any]:
    attributes: dict[str, Any] = {"contextlab.step.name": str(step.get("step") or ""),
                                  "contextlab.step.status": str(step.get("status") or "")}
    if step.get("outcome"):
        attributes["contextlab.step.outcome"] = str(step["outcome"])
    for key, value in (step.get("numbers") or {}).items():
        scalar = _scalar(value)
        if scalar is not None:
            attributes[f"contextlab.step.{key}"] = scalar
    reasons = [str(r) for r in step.get("reasons") or []]
    if reasons:
        attributes["contextlab.step.reasons"] = reasons
    return attributes


def _summary_call_attributes(step: Mapping[str, Any]) -> dict[str, Any]:
    """The GenAI conventions' names for a summary an LLM wrote (none for the offline compactor)."""
    details = step.get("details") or {}
    model = details.get("model")
    if not model:
        return {}
    attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": str(model)}
    usage = details.get("usage") or {}
    for ours, theirs in (("gen_ai.usage.input_tokens", ("prompt_tokens", "input_tokens")),
                         ("gen_ai.usage.output_tokens", ("completion_tokens", "output_tokens"))):
        for name in theirs:
            if isinstance(usage.get(name), int):
                attributes[ours] = usage[name]
                break
    return attributes


def turn_attributes(trace_dict: Mapping[str, Any], *, session_id: Any = None) -> dict[str, Any]:
    """The attributes of a hook-run span, from the engine's trace of that turn."""
    budget = trace_dict.get("budget") or {}
    payload_tokens = ((trace_dict.get("payload") or {}).get("tokens") or {})
    steps = {s.get("step"): s for s in trace_dict.get("steps") or []}
    attributes: dict[str, Any] = {
        "contextlab.turn.number": int(trace_dict.get("turn") or 0),
        "contextlab.turn.trigger": str(trace_dict.get("trigger") or ""),
        "contextlab.turn.outcome": str(trace_dict.get("outcome") or ""),
        "contextlab.policy": str(trace_dict.get("policy") or ""),
        "contextlab.counter": str(trace_dict.get("counter") or ""),
    }
    if session_id is not None:
        attributes["contextlab.session.id"] = str(session_id)
        attributes["session.id"] = str(session_id)
    attributes[SPAN_KIND] = "CHAIN"
    for key in ("window", "threshold", "reserve"):
        if isinstance(budget.get(key), int):
            attributes[f"contextlab.budget.{key}"] = budget[key]
    if isinstance(payload_tokens.get("total"), int):
        attributes["contextlab.payload.tokens"] = payload_tokens["total"]
    gate = (steps.get("gate") or {}).get("numbers") or {}
    for key in ("used", "left"):
        if isinstance(gate.get(key), int):
            attributes[f"contextlab.gate.{key}"] = gate[key]
    split = steps.get("context_check") or {}
    details = split.get("details") or {}
    if "compact_ids" in details:
        attributes["contextlab.split.compacted"] = len(details.get("compact_ids") or [])
        attributes["contextlab.split.kept"] = len(details.get("keep_ids") or [])
    archived = ((steps.get("mark_compressed") or {}).get("numbers") or {}).get("archived")
    attributes["contextlab.archived"] = int(archived) if isinstance(archived, int) else 0
    truncation = (steps.get("tool_result_compaction") or {}).get("numbers") or {}
    truncated = truncation.get("truncated") if isinstance(truncation.get("truncated"), int) else None
    if truncated is not None:
        attributes["contextlab.truncated"] = truncated
    validity = steps.get("validity")
    if validity is not None:
        attributes["contextlab.summary.valid"] = validity.get("status") not in ("failed",)
    return attributes


def record_turn(trace_dict: Mapping[str, Any], *, session_id: Any = None,
                parent: otel_context.Context | None = None) -> None:
    """Emit one hook run as a span tree, timed as the engine timed it. No-op when export is off."""
    tracer_ = tracer()
    if tracer_ is None:
        return
    try:
        _emit_turn(tracer_, trace_dict, session_id=session_id, parent=parent)
    except Exception:  # telemetry must never break a turn
        log.exception("could not record the turn's span")


def _emit_turn(tracer_: Tracer, trace_dict: Mapping[str, Any], *, session_id: Any,
               parent: otel_context.Context | None) -> None:
    start = _nanos(trace_dict.get("started_at"))
    duration_ns = int(float(trace_dict.get("duration_ms") or 0.0) * 1_000_000)
    name = "contextlab.compaction" if trace_dict.get("trigger") == "manual" else "contextlab.turn"
    span = tracer_.start_span(name, context=parent, kind=SpanKind.INTERNAL, start_time=start,
                              attributes=turn_attributes(trace_dict, session_id=session_id))
    inside = trace.set_span_in_context(span)
    previous: int | None = None
    for step in trace_dict.get("steps") or []:
        step_start = _nanos(step.get("started_at")) or start
        if step_start is not None and previous is not None and step_start <= previous:
            # Steps timed within one clock tick: a microsecond apart, so readers list them in order.
            step_start = previous + 1_000
        previous = step_start
        attributes = _step_attributes(step)
        attributes[SPAN_KIND] = "CHAIN"
        if session_id is not None:
            attributes["session.id"] = str(session_id)
        if step.get("step") == "summary":
            attributes.update(_summary_call_attributes(step))
        child = tracer_.start_span(f"contextlab.{step.get('step')}", context=inside, start_time=step_start,
                                   attributes=attributes)
        if step.get("status") == "failed":
            child.set_status(Status(StatusCode.ERROR, "; ".join(str(r) for r in step.get("reasons") or [])[:500]))
        child.end(end_time=(step_start + int(float(step.get("duration_ms") or 0.0) * 1_000_000))
                  if step_start is not None else None)
    over = window_warning(trace_dict)
    if trace_dict.get("error") or trace_dict.get("outcome") == "compaction_failed":
        span.set_status(Status(StatusCode.ERROR, str(trace_dict.get("error") or "the summary failed")[:500]))
    elif over:
        span.set_status(Status(StatusCode.ERROR, over))
    end = start + duration_ns if start is not None else None
    if end is not None and previous is not None:
        end = max(end, previous)
    span.end(end_time=end)


def window_warning(trace_dict: Mapping[str, Any]) -> str:
    """The warning that matters on a turn: its payload is still larger than the window; "" if not."""
    window = (trace_dict.get("budget") or {}).get("window")
    total = ((trace_dict.get("payload") or {}).get("tokens") or {}).get("total")
    if isinstance(window, int) and isinstance(total, int) and window > 0 and total > window:
        return f"the payload ({total} tokens) is larger than the window ({window} tokens)"
    return ""


# -- the gateway -------------------------------------------------------------------------


def caller_context(headers: Mapping[str, str]) -> otel_context.Context:
    """The caller's trace (W3C ``traceparent`` / ``tracestate``), to continue it."""
    return propagate.extract({k.lower(): v for k, v in headers.items() if k.lower() in TRACE_HEADERS})


def start_gateway_span(headers: Mapping[str, str], *, model: str, stream: bool,
                       provider_name: str = "openai") -> Span | None:
    """The span of one gateway call, in the caller's trace when it sent one; None when export is off.

    ``provider_name`` is the GenAI conventions' name of the API the provider
    speaks ("openai" for chat completions). It ends in ``finish_gateway_span``,
    which may run after the view returned (a stream)."""
    tracer_ = tracer()
    if tracer_ is None:
        return None
    return tracer_.start_span(f"chat {model}".strip(), context=caller_context(headers), kind=SpanKind.SERVER,
                              attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                                          "gen_ai.provider.name": provider_name, "gen_ai.system": provider_name,
                                          SPAN_KIND: "LLM", "llm.system": provider_name,
                                          "llm.provider": provider_name, "llm.model_name": model,
                                          "contextlab.gateway.client_model": model,
                                          "contextlab.gateway.stream": stream})


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else json.dumps(content, ensure_ascii=False, default=str)


class _Budget:
    """What is left of the characters of message text one span may carry."""

    def __init__(self, chars: int) -> None:
        self.left = chars

    def take(self, text: str) -> str:
        kept = text[:self.left]
        self.left -= len(kept)
        return kept if len(kept) == len(text) else f"{kept}…[{len(text) - len(kept)} more characters]"


def message_attributes(prefix: str, genai_key: str, messages: Sequence[Mapping[str, Any]],
                       budget: _Budget) -> dict[str, Any]:
    """Messages as OpenInference's flattened attributes (``<prefix>.<i>.message.*``) and as the GenAI
    conventions' JSON (``genai_key``), their text within ``budget``."""
    attributes: dict[str, Any] = {}
    structured: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role = str(message.get("role") or "")
        text = budget.take(_text(message.get("content")))
        base = f"{prefix}.{index}.message"
        attributes[f"{base}.role"] = role
        parts: list[dict[str, Any]] = []
        if text:
            attributes[f"{base}.content"] = text
            parts.append({"type": "text", "content": text})
        if message.get("tool_call_id"):
            attributes[f"{base}.tool_call_id"] = str(message["tool_call_id"])
            parts = [{"type": "tool_call_response", "id": str(message["tool_call_id"]), "response": text}]
        for number, call in enumerate(message.get("tool_calls") or []):
            if not isinstance(call, Mapping):
                continue
            found = call.get("function")
            function: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
            name, arguments = str(function.get("name") or ""), budget.take(_text(function.get("arguments")))
            attributes[f"{base}.tool_calls.{number}.tool_call.id"] = str(call.get("id") or "")
            attributes[f"{base}.tool_calls.{number}.tool_call.function.name"] = name
            attributes[f"{base}.tool_calls.{number}.tool_call.function.arguments"] = arguments
            parts.append({"type": "tool_call", "id": str(call.get("id") or ""), "name": name,
                          "arguments": arguments})
        structured.append({"role": role, "parts": parts})
    attributes[genai_key] = json.dumps(structured, ensure_ascii=False)
    return attributes


def note_completion(span: Span | None, content: bytes) -> None:
    """The response model and finish reasons of a completion, on the gateway's span (export on only)."""
    if span is None:
        return
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return
    if not isinstance(data, dict):
        return
    reasons = [str(c.get("finish_reason")) for c in data.get("choices") or []
               if isinstance(c, dict) and c.get("finish_reason")]
    note_answer(span, model=str(data.get("model") or ""), finish_reasons=reasons)


def note_answer(span: Span | None, *, model: str, finish_reasons: Sequence[str]) -> None:
    if span is None:
        return
    try:
        if model:
            span.set_attribute("gen_ai.response.model", model)
        if finish_reasons:
            span.set_attribute("gen_ai.response.finish_reasons", list(finish_reasons))
    except Exception:
        log.exception("could not note the answer on the gateway span")


def current_context() -> otel_context.Context | None:
    """The current context when export is on (the parent of spans recorded later), else None."""
    return otel_context.get_current() if _provider is not None else None


@contextmanager
def current(span: Span | None) -> Iterator[None]:
    """Make ``span`` the current span meanwhile, so the hook runs recorded inside become its children."""
    if span is None:
        yield
        return
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        otel_context.detach(token)


def upstream_trace_headers(incoming: Mapping[str, str], span: Span | None) -> dict[str, str]:
    """The trace headers to send upstream: the gateway span's context when there is one,
    else the caller's own headers passed on unchanged (the gateway never breaks a trace)."""
    if span is None:
        lowered = {k.lower(): v for k, v in incoming.items()}
        return {name: lowered[name] for name in TRACE_HEADERS if name in lowered}
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def finish_gateway_span(span: Span | None, *, status_code: int | None, usage: Mapping[str, Any] | None,
                        response_model: str = "", session_id: Any = None, turn: int | None = None,
                        managed: bool = False, error: str = "", request: Mapping[str, Any] | None = None,
                        reply: Mapping[str, Any] | None = None, warning: str = "") -> None:
    """End the gateway's span: ``request`` is the body sent upstream (the payload after compaction,
    the mapped model), ``reply`` the assistant message, ``warning`` a problem that makes the call an
    ERROR although the provider answered (the payload still over the window)."""
    if span is None:
        return
    try:
        attributes: dict[str, Any] = {"contextlab.gateway.managed": managed}
        if request is not None:
            model = str(request.get("model") or "")
            if model:
                attributes["gen_ai.request.model"] = model
                attributes["llm.model_name"] = model
            messages = [m for m in request.get("messages") or [] if isinstance(m, Mapping)]
            if capture_content():
                budget = _Budget(content_limit())
                attributes.update(message_attributes("llm.input_messages", "gen_ai.input.messages", messages,
                                                     budget))
                if reply is not None:
                    attributes.update(message_attributes("llm.output_messages", "gen_ai.output.messages",
                                                         [reply], budget))
        if isinstance(usage, Mapping):
            for ours, theirs in (("llm.token_count.prompt", "prompt_tokens"),
                                 ("llm.token_count.completion", "completion_tokens"),
                                 ("llm.token_count.total", "total_tokens")):
                if isinstance(usage.get(theirs), int):
                    attributes[ours] = usage[theirs]
        if session_id is not None:
            attributes["session.id"] = str(session_id)
        if status_code is not None:
            attributes["http.response.status_code"] = status_code
        if response_model:
            attributes["gen_ai.response.model"] = response_model
        if session_id is not None:
            attributes["contextlab.session.id"] = str(session_id)
        if turn is not None:
            attributes["contextlab.turn.number"] = turn
        for ours, theirs in (("gen_ai.usage.input_tokens", "prompt_tokens"),
                             ("gen_ai.usage.output_tokens", "completion_tokens")):
            if usage and isinstance(usage.get(theirs), int):
                attributes[ours] = usage[theirs]
        span.set_attributes(attributes)
        if error or (status_code is not None and status_code >= 400):
            span.set_status(Status(StatusCode.ERROR, (error or f"HTTP {status_code}")[:500]))
        elif warning:
            span.set_status(Status(StatusCode.ERROR, warning[:500]))
        span.end()
    except Exception:
        log.exception("could not finish the gateway span")
