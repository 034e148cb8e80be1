"""OpenTelemetry traces in: the LLM calls an agent's spans record, as chat-completions requests.

Teams that trace their agents already hold every request the agent sent: an LLM
span carries its input messages (and the reply) as attributes. This module reads
OTLP traces in their JSON encoding (what ``opentelemetry-proto``'s JSON mapping
and the file exporters write; the web tier converts protobuf to it) and turns
each LLM span into a request record ``{"seq", "body": {"model", "messages",
"tools"}, "response_text", "response_tool_calls", "usage", "session_id"}`` that
the observe inference (``contextlab.engine.observe.inference``) reads like a request log.

Three attribute layouts are understood:

* the GenAI semantic conventions: ``gen_ai.input.messages`` /
  ``gen_ai.output.messages`` / ``gen_ai.system_instructions`` (JSON, messages of
  typed parts), ``gen_ai.request.model``, ``gen_ai.usage.*``,
  ``gen_ai.conversation.id``;
* the older flattened prompt attributes: ``gen_ai.prompt.<i>.role`` /
  ``.content`` / ``.tool_calls.<j>.*`` and ``gen_ai.completion.<i>.*``;
* OpenInference (Arize Phoenix): ``llm.input_messages.<i>.message.*``,
  ``llm.output_messages.<i>.message.*``, ``llm.model_name``,
  ``llm.token_count.*``, ``llm.tools.<i>.tool.json_schema``, ``session.id``.

Everything a file import parses, the JSON inside span attributes included,
counts against one ``ParseBudget``; a span whose attribute JSON would pass it is
left out alone, with its reason, and costs the others nothing.

Pure: no Django, no network.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from contextlab.engine.core.errors import InputTooLarge, MalformedInput
from contextlab.engine.importers.json_stream import (
    JsonSyntaxError,
    ParseBudget,
    StreamParser,
    bounded_lines,
    load,
    load_line,
)


@dataclass
class Span:
    """The parts of one OTLP span that matter here."""

    trace_id: str
    span_id: str
    name: str
    start_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)


class RejectedSpan(ValueError):
    """A span this reader cannot take as sent: a field of the wrong type, text no encoding can hold."""


def _checked_text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RejectedSpan(f"{where} is not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        # A lone surrogate (a "\\ud800" escape in JSON): no UTF-8 text holds it.
        raise RejectedSpan(f"{where} holds a lone surrogate") from exc
    return value


def _any_value(value: Any, where: str = "value") -> Any:
    """An OTLP JSON ``AnyValue`` as a plain value; ``RejectedSpan`` when it is not one."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise RejectedSpan(f"{where} is not an OTLP AnyValue object")
    if "stringValue" in value:
        return _checked_text(value["stringValue"], where)
    if "boolValue" in value:
        if not isinstance(value["boolValue"], bool):
            raise RejectedSpan(f"{where}: boolValue is not a boolean")
        return value["boolValue"]
    if "doubleValue" in value:
        number = value["doubleValue"]
        if isinstance(number, bool) or not isinstance(number, (int, float, str)):
            raise RejectedSpan(f"{where}: doubleValue is not a number")
        return number
    if "intValue" in value:
        number = value["intValue"]
        # int64 travels as a string in OTLP JSON, as a number from some writers.
        if isinstance(number, bool) or not isinstance(number, (int, str)):
            raise RejectedSpan(f"{where}: intValue is not an integer")
        try:
            return int(number)
        except ValueError as exc:
            raise RejectedSpan(f"{where}: intValue is not an integer") from exc
    if "arrayValue" in value:
        items = (value["arrayValue"] or {}).get("values") if isinstance(value["arrayValue"], Mapping) else None
        if items is not None and not isinstance(items, list):
            raise RejectedSpan(f"{where}: arrayValue.values is not a list")
        return [_any_value(v, where) for v in items or []]
    if "kvlistValue" in value:
        items = (value["kvlistValue"] or {}).get("values") if isinstance(value["kvlistValue"], Mapping) else None
        return _attributes(items or [], where)
    if "bytesValue" in value:
        return _checked_text(value["bytesValue"], where)
    return None


def _attributes(items: Any, where: str = "attributes") -> dict[str, Any]:
    if items is None:
        return {}
    if not isinstance(items, list):
        raise RejectedSpan(f"{where} is not a list of key-value objects")
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, Mapping) or not isinstance(item.get("key"), str):
            raise RejectedSpan(f"{where}: an item is not a key-value object")
        key = _checked_text(item["key"], f"{where} key")
        out[key] = _any_value(item.get("value"), f"attribute {key[:80]!r}")
    return out


def _span(raw: Any, resource: dict[str, Any]) -> Span:
    if not isinstance(raw, Mapping):
        raise RejectedSpan("a span is not an object")
    ids = {}
    for field_name, alias in (("traceId", "trace_id"), ("spanId", "span_id")):
        value = raw.get(field_name, raw.get(alias, ""))
        ids[field_name] = _checked_text(value if value is not None else "", field_name)
    name = raw.get("name")
    start_raw = raw.get("startTimeUnixNano", raw.get("start_time_unix_nano", 0))
    if isinstance(start_raw, bool) or not isinstance(start_raw, (int, str)) or (
            isinstance(start_raw, str) and start_raw and not start_raw.isdigit()):
        raise RejectedSpan("startTimeUnixNano is not an integer")
    return Span(trace_id=ids["traceId"], span_id=ids["spanId"],
                name=_checked_text(name, "name") if name is not None else "",
                start_ns=int(start_raw or 0), attributes=_attributes(raw.get("attributes")), resource=resource)


@dataclass
class Export:
    """The spans of an OTLP export this reader took, and why it rejected the others."""

    spans: list[Span] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)


def read_export(data: Any) -> Export:
    """Every span of an OTLP JSON export (``{"resourceSpans": [...]}``), or of several, one per
    line; a span with a field of the wrong type or a lone surrogate is rejected alone, with its
    reason, and the valid spans of the same export are kept."""
    export = Export()
    if isinstance(data, list):
        for item in data:
            inner = read_export(item)
            export.spans += inner.spans
            export.rejected += inner.rejected
        return export
    if not isinstance(data, Mapping):
        raise ValueError("an OTLP trace export is a JSON object with \"resourceSpans\"")
    groups = data.get("resourceSpans") or data.get("resource_spans") or []
    if not isinstance(groups, list):
        raise ValueError("\"resourceSpans\" is not a list")
    for resource_spans in groups:
        if not isinstance(resource_spans, Mapping):
            export.rejected.append("a resourceSpans item is not an object")
            continue
        scopes = resource_spans.get("scopeSpans") or resource_spans.get("scope_spans") or []
        raws: list[Any] = []
        for scope in scopes if isinstance(scopes, list) else [None]:
            spans = scope.get("spans") if isinstance(scope, Mapping) else None
            if isinstance(spans, list):
                raws += spans
            elif spans is not None or not isinstance(scope, Mapping):
                export.rejected.append("a scopeSpans item is not an object with a list of spans")
        try:
            resource_raw = resource_spans.get("resource") or {}
            if not isinstance(resource_raw, Mapping):
                raise RejectedSpan("resource is not an object")
            resource = _attributes(resource_raw.get("attributes"), "resource attributes")
        except RejectedSpan as exc:
            # Every span of a resource that cannot be read goes with it.
            export.rejected += [str(exc)] * max(1, len(raws))
            continue
        for raw in raws:
            try:
                export.spans.append(_span(raw, resource))
            except RejectedSpan as exc:
                export.rejected.append(str(exc))
    return export


def spans_from_json(data: Any) -> list[Span]:
    """The spans of an OTLP JSON export that ``read_export`` takes."""
    return read_export(data).spans


def load_export(text: str) -> Export:
    """An OTLP JSON file: one export object, or one per line (the collector's file exporter)."""
    stripped = text.strip()
    if not stripped:
        return Export()
    try:
        return read_export(json.loads(stripped))
    except json.JSONDecodeError:
        return read_export([json.loads(line) for line in stripped.splitlines() if line.strip()])


def read_export_file(fh: BinaryIO, budget: ParseBudget) -> Export:
    """What ``load_export`` gives for a file's text, parsed as it is read within ``budget``: one
    export object, or one export per line, a line at a time (each within the line limit)."""
    spent = budget.spent
    # The attribute texts of a trace are all different and let go once read: never kept for the upload.
    parser = StreamParser(fh, budget=budget, where="in the trace file", share=False)
    if parser.at_end():
        return Export()
    try:
        value = parser.value()
        if parser.at_end():
            return read_export(value)
        del value
    except JsonSyntaxError:
        pass  # not one document: one export per line, as load_export reads it
    del parser
    budget.release(budget.spent - spent)
    fh.seek(0)
    exports: list[Any] = []
    for number, offset, raw in bounded_lines(fh, budget):
        if raw.strip():
            try:
                exports.append(load_line(raw, where=f"in line {number} of the trace file", budget=budget,
                                         offset=offset, share=False))
            except JsonSyntaxError as exc:
                raise ValueError(f"line {number} is not JSON: {exc}") from None
    return read_export(exports)


def load_json_lines(text: str) -> list[Span]:
    """The spans ``load_export`` takes from an OTLP JSON file."""
    return load_export(text).spans


# -- attributes to chat messages ---------------------------------------------------------


def _json(value: Any, budget: ParseBudget | None) -> Any:
    """The JSON an attribute's string holds (None when it holds none), parsed within ``budget``."""
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        if budget is not None:
            budget.spend(len(data), "in a span attribute")
        try:
            return load(io.BytesIO(data), where="in a span attribute", budget=budget)
        except InputTooLarge:
            raise
        except (JsonSyntaxError, MalformedInput):
            return None
        finally:
            if budget is not None:
                budget.release(len(data))
    return value


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False)


def _from_parts(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A GenAI-conventions message (role + typed parts) as OpenAI chat messages (tool responses split out)."""
    role = str(message.get("role") or "user")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for part in message.get("parts") or []:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind == "text":
            texts.append(_text(part.get("content")))
        elif kind == "tool_call":
            calls.append({"id": str(part.get("id") or ""), "type": "function",
                          "function": {"name": str(part.get("name") or ""),
                                       "arguments": _arguments(part.get("arguments"))}})
        elif kind == "tool_call_response":
            out.append({"role": "tool", "tool_call_id": str(part.get("id") or ""),
                        "content": _text(part.get("response", part.get("result")))})
    if role == "tool":
        return out or [{"role": "tool", "tool_call_id": "", "content": "\n".join(texts)}]
    if texts or calls or not out:
        chat: dict[str, Any] = {"role": role, "content": "\n".join(texts) if texts or not calls else None}
        if calls:
            chat["tool_calls"] = calls
        out.insert(0, chat)
    return out


def _indexed(attributes: Mapping[str, Any], prefix: str) -> dict[int, dict[str, Any]]:
    """``prefix.<i>.rest`` attributes grouped by ``i``: {i: {rest: value}}."""
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.(.+)$")
    grouped: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        match = pattern.match(key)
        if match:
            grouped.setdefault(int(match.group(1)), {})[match.group(2)] = value
    return dict(sorted(grouped.items()))


def _flat_message(fields: Mapping[str, Any], *, call_key: str, id_key: str, name_key: str, args_key: str,
                  content_key: str, role_key: str, call_id_key: str) -> dict[str, Any]:
    role = str(fields.get(role_key) or "user")
    content = fields.get(content_key)
    if content is None:
        # OpenInference content parts: message.contents.<k>.message_content.text
        parts = _indexed(fields, content_key + "s")
        content = "\n".join(str(p.get("message_content.text") or "") for p in parts.values()) if parts else None
    message: dict[str, Any] = {"role": role, "content": _text(content) if content is not None else None}
    calls = _indexed(fields, call_key)
    if calls:
        message["tool_calls"] = [{"id": str(c.get(id_key) or ""), "type": "function",
                                  "function": {"name": str(c.get(name_key) or ""),
                                               "arguments": _arguments(c.get(args_key))}}
                                 for c in calls.values()]
    if fields.get(call_id_key):
        message["tool_call_id"] = str(fields[call_id_key])
    if message["content"] is None and not calls:
        message["content"] = ""
    return message


def _openinference(attributes: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    return [_flat_message(fields, call_key="message.tool_calls", id_key="tool_call.id",
                          name_key="tool_call.function.name", args_key="tool_call.function.arguments",
                          content_key="message.content", role_key="message.role",
                          call_id_key="message.tool_call_id")
            for fields in _indexed(attributes, prefix).values()]


def _legacy(attributes: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    return [_flat_message(fields, call_key="tool_calls", id_key="id", name_key="name", args_key="arguments",
                          content_key="content", role_key="role", call_id_key="tool_call_id")
            for fields in _indexed(attributes, prefix).values()]


def _input_messages(attributes: Mapping[str, Any], budget: ParseBudget | None) -> list[dict[str, Any]] | None:
    structured = _json(attributes.get("gen_ai.input.messages"), budget)
    if isinstance(structured, list):
        messages = [m for item in structured if isinstance(item, Mapping) for m in _from_parts(item)]
        system = _json(attributes.get("gen_ai.system_instructions"), budget)
        if isinstance(system, list) and system:
            text = "\n".join(_text(p.get("content")) for p in system if isinstance(p, Mapping))
            messages.insert(0, {"role": "system", "content": text})
        return messages
    if any(key.startswith("llm.input_messages.") for key in attributes):
        return _openinference(attributes, "llm.input_messages")
    if any(key.startswith("gen_ai.prompt.") for key in attributes):
        return _legacy(attributes, "gen_ai.prompt")
    return None


def _output_message(attributes: Mapping[str, Any], budget: ParseBudget | None) -> dict[str, Any] | None:
    structured = _json(attributes.get("gen_ai.output.messages"), budget)
    if isinstance(structured, list) and structured and isinstance(structured[0], Mapping):
        converted = _from_parts({**structured[0], "role": "assistant"})
        return converted[0] if converted else None
    if any(key.startswith("llm.output_messages.") for key in attributes):
        messages = _openinference(attributes, "llm.output_messages")
        return messages[0] if messages else None
    if any(key.startswith("gen_ai.completion.") for key in attributes):
        messages = _legacy(attributes, "gen_ai.completion")
        return messages[0] if messages else None
    return None


def _tools(attributes: Mapping[str, Any], budget: ParseBudget | None) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    for fields in _indexed(attributes, "llm.tools").values():
        schema = _json(fields.get("tool.json_schema"), budget)
        if isinstance(schema, Mapping):
            tools.append(dict(schema))
    definitions = _json(attributes.get("gen_ai.tool.definitions"), budget)
    if isinstance(definitions, list):
        tools.extend(dict(d) for d in definitions if isinstance(d, Mapping))
    return tools


def _usage(attributes: Mapping[str, Any]) -> dict[str, int] | None:
    usage: dict[str, int] = {}
    for ours, names in (("prompt_tokens", ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens",
                                           "llm.token_count.prompt")),
                        ("completion_tokens", ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
                                               "llm.token_count.completion"))):
        for name in names:
            if isinstance(attributes.get(name), int):
                usage[ours] = attributes[name]
                break
    return usage or None


def resource_digest(resource: Mapping[str, Any]) -> str:
    """What tells one sender (an agent's process) from another: its resource, without the SDK's own
    attributes; "" for an empty resource."""
    own = {k: v for k, v in resource.items() if not k.startswith("telemetry.")}
    if not own:
        return ""
    text = json.dumps(own, sort_keys=True, ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:32]


def _unencodable(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, ValueError, TypeError):
        return True
    return False


def llm_requests(spans: list[Span], rejected: list[str] | None = None, budget: ParseBudget | None = None,
                 *, consume: bool = False) -> list[dict[str, Any]]:
    """The LLM calls among ``spans``, oldest first, as request records (see the module's doc).

    A call whose messages hold text no UTF-8 can store (a lone surrogate inside
    the JSON of ``gen_ai.input.messages``), or whose attribute JSON would pass
    ``budget``, is left out alone, its reason added to ``rejected``. With
    ``consume``, each span's attributes are dropped once read, so the spans'
    text and the records built from it are not held twice over."""
    calls: list[tuple[int, str, dict[str, Any]]] = []
    for span in spans:
        attributes = span.attributes
        if consume:
            span.attributes = {}
        spent = budget.spent if budget is not None else 0
        try:
            record = _llm_request(span, attributes, budget)
        except InputTooLarge as exc:
            assert budget is not None
            budget.release(budget.spent - spent)
            if rejected is not None:
                rejected.append(f"span {span.span_id or span.name!r}: {exc.message}")
            continue
        if record is None:
            continue
        if _unencodable(record):
            if rejected is not None:
                rejected.append(f"span {span.span_id or span.name!r}: its messages hold a lone surrogate")
            continue
        calls.append((span.start_ns, span.span_id, record))
    calls.sort(key=lambda item: (item[0], item[1]))
    return [{"seq": seq, **record} for seq, (_, _, record) in enumerate(calls, start=1)]


def _llm_request(span: Span, attributes: Mapping[str, Any], budget: ParseBudget | None) -> dict[str, Any] | None:
    """The request record of one span, None when it records no LLM call."""
    messages = _input_messages(attributes, budget)
    if not messages:
        return None
    model = (attributes.get("gen_ai.request.model") or attributes.get("llm.model_name")
             or attributes.get("gen_ai.response.model") or "")
    body: dict[str, Any] = {"model": str(model), "messages": messages}
    tools = _tools(attributes, budget)
    if tools:
        body["tools"] = tools
    raw = _json(attributes.get("input.value"), budget) if attributes.get("input.mime_type") == "application/json" else None
    if isinstance(raw, dict) and isinstance(raw.get("messages"), list) and raw["messages"]:
        # OpenInference also records the request body itself: the agent's exact bytes win.
        body = raw
    reply = _output_message(attributes, budget) or {}
    session = (attributes.get("gen_ai.conversation.id") or attributes.get("session.id")
               or span.resource.get("session.id") or "")
    record = {
        "resource": resource_digest(span.resource),
        "body": body,
        "response_text": reply.get("content") or "",
        "response_tool_calls": reply.get("tool_calls") or [],
        "usage": _usage(attributes),
        "session_id": str(session),
        "trace_id": span.trace_id,
        "span_id": span.span_id,
    }
    return record


def looks_like_otlp(head: bytes) -> bool:
    """True when a file starting with ``head`` is an OTLP JSON trace export."""
    return b'"resourceSpans"' in head or b'"resource_spans"' in head


def iter_requests(text: str) -> Iterator[dict[str, Any]]:
    """The request records of an OTLP JSON file's text."""
    yield from llm_requests(load_json_lines(text))


def file_requests(fh: BinaryIO, budget: ParseBudget) -> tuple[list[dict[str, Any]], list[str]]:
    """The request records of an OTLP JSON file, and why the spans left out were rejected; all it
    parses (the JSON inside span attributes too) within ``budget``."""
    export = read_export_file(fh, budget)
    rejected = list(export.rejected)
    return llm_requests(export.spans, rejected, budget, consume=True), rejected
