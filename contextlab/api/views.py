"""The JSON API under ``/api/v1/`` (schema: ``/api/v1/openapi.json``).

Views parse the request, call one service and answer JSON; the services and
the engine say what is wrong with the input, and ``authorize`` turns that into
``{"error", "field"}`` with a 4xx status.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db import DataError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

from contextlab.api.decorators import ApiError, ApiRequest, authorize, error, json_body, require_methods
from contextlab.api.openapi import (
    COMPACT,
    DRY_RUN,
    IMPORT_FORM,
    MAX_PAGE,
    MESSAGES_APPEND,
    NO,
    PIN_ACTIONS,
    PINS_CHANGE,
    PREPARE,
    SESSION_CREATE,
    USAGE_REPORT,
    YES,
    schema,
)
from contextlab.engine.core.errors import InvalidProfile
from contextlab.engine.memory.pins import MAX_FACT_CHARS
from contextlab.sessions import loss_records, services
from contextlab.sessions.models import AgentProfile, AgentSession, CompactionRun, Turn
from contextlab.sessions.services.inputs import MAX_INSTRUCTION_LENGTH

# The largest integer SQLite and PostgreSQL (bigint) store: a bigger one in a
# query is a client's error, not a database error.
MAX_DB_INT = 2**63 - 1


def _session(request: ApiRequest, session_id: UUID) -> AgentSession:
    # Someone else's session answers exactly like a missing one. The state
    # header loads only where a view reads it: it is the engine's, not the API's.
    session = (AgentSession.objects.select_related("profile").defer("engine_state")
               .filter(pk=session_id, owner=request.user).first())
    if session is None:
        raise ApiError(404, f"you have no session {session_id}", "id")
    return session


def _session_ref(request: ApiRequest, session_id: UUID) -> AgentSession:
    """``_session`` for a view whose service locks and reads the row itself: only the id is read
    here (the owner check), not the row and its profile a second time."""
    session = AgentSession.objects.only("id", "owner_id").filter(pk=session_id, owner=request.user).first()
    if session is None:
        raise ApiError(404, f"you have no session {session_id}", "id")
    return session


def _int_param(request: HttpRequest, name: str, default: int, *, low: int = 0, high: int = MAX_DB_INT) -> int:
    raw = request.GET.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ApiError(400, f"{name} must be a whole number", name) from exc
    if low <= value <= high:
        return value
    if value < low and high == MAX_DB_INT:
        raise ApiError(400, f"{name} must be ≥ {low}", name)
    raise ApiError(400, f"{name} must be between {low} and {high}", name)


def _bool_param(request: HttpRequest, name: str) -> bool:
    raw = request.GET.get(name)
    if raw is None:
        return False
    if raw not in ("true", "false"):
        raise ApiError(400, f"{name} must be true or false", name)
    return raw == "true"


def _nul_at(value: Any, path: str) -> str | None:
    """Where a NUL character sits in a JSON value (a key or a string), e.g. ``usage.x``; None if nowhere."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return where
        elif isinstance(item, dict):
            for key, child in item.items():
                if "\x00" in str(key):
                    return where or "body"
                stack.append((child, f"{where}.{key}" if where else str(key)))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{index}]") for index, child in enumerate(item))
    return None


def _refuse_nul(value: Any, field: str) -> None:
    # PostgreSQL text and JSON cannot hold NUL, so it is refused on every
    # database (like the services do for messages) instead of failing at save.
    where = _nul_at(value, field)
    if where is not None:
        raise ApiError(400, f"{where} holds a NUL character (\\u0000), which cannot be stored", where)


def _optional_str(body: dict[str, Any], name: str, default: str = "") -> str:
    value = body.get(name, default)
    if not isinstance(value, str):
        raise ApiError(400, f"{name} must be a string", name)
    return value


# -- sessions ----------------------------------------------------------------------------


@csrf_exempt
@require_methods("GET", "POST")
@authorize
def sessions(request: ApiRequest) -> HttpResponse:
    if request.method == "POST":
        return _session_create(request)
    profile_id = _int_param(request, "profile", 0, low=1) or None
    failed = _bool_param(request, "failed")
    limit = _int_param(request, "limit", 50, low=1, high=MAX_PAGE)
    offset = _int_param(request, "offset", 0)
    qs = AgentSession.objects.filter(owner=request.user).listed(profile_id=profile_id, failed=failed)
    page = list(qs[offset:offset + limit])
    return JsonResponse({"sessions": [s.to_dict() for s in page], "count": qs.count(),
                         "limit": limit, "offset": offset})


def _session_create(request: ApiRequest) -> HttpResponse:
    body = json_body(request, SESSION_CREATE)
    if "system_prompt" not in body:
        raise ApiError(400, "system_prompt is required (it may be empty)", "system_prompt")
    profile = None
    if "profile" in body:
        if body["profile"] is None:
            raise ApiError(400, "profile must be a profile id, a profile name or an object of settings; "
                                "leave it out for your profile named 'default'", "profile")
        _refuse_nul(body["profile"], "profile")
        ref = body["profile"]
        if isinstance(ref, dict) and not isinstance(ref.get("name", ""), str):
            raise ApiError(400, "profile.name must be a string (empty: a generated name)", "profile.name")
        try:
            profile = services.profile_resolve(owner=request.user, ref=body["profile"], change_source="api")
        except InvalidProfile as exc:
            # Knob errors of an inline profile name the knob inside "profile".
            field = exc.field if exc.field in (None, "profile") else f"profile.{exc.field}"
            raise InvalidProfile(exc.message, field=field) from exc
    session = services.session_create(owner=request.user, system_prompt=body["system_prompt"],
                                      profile=profile, title=_optional_str(body, "title"))
    return JsonResponse(session.to_dict(), status=201)


@csrf_exempt
@require_methods("GET")
@authorize
def session_detail(request: ApiRequest, session_id: UUID) -> HttpResponse:
    session = _session(request, session_id)
    data = session.to_dict()
    data["system_prompt"] = session.system_prompt
    data["summary"] = session.summary or None
    data["pending_tool_calls"] = sorted((session.engine_state.get("pending_calls") or {}).keys())
    latest = session.latest_turn()
    data["latest_turn"] = latest.to_dict() if latest else None
    return JsonResponse(data)


@csrf_exempt
@require_methods("POST")
@authorize
def session_messages(request: ApiRequest, session_id: UUID) -> HttpResponse:
    session = _session_ref(request, session_id)
    body = json_body(request, MESSAGES_APPEND)
    if "messages" not in body:
        raise ApiError(400, "messages is required: a list of OpenAI, Anthropic or AgentScope messages", "messages")
    # The append copies the committed counters onto ``session``: no second read of the row.
    rows = services.messages_append(session=session, messages=body["messages"])
    return JsonResponse({"appended": len(rows), "messages": [row.to_dict() for row in rows],
                         "session": session.to_dict()}, status=201)


@csrf_exempt
@require_methods("POST")
@authorize
def session_prepare(request: ApiRequest, session_id: UUID) -> HttpResponse:
    session = _session_ref(request, session_id)
    body = json_body(request, PREPARE)
    # The call's tool definitions and response format, when the client sends them,
    # are a layer of its budget (they are billed as prompt tokens).
    schemas = (body.get("tools"), body.get("response_format")) \
        if "tools" in body or "response_format" in body else None
    payload, trace = services.session_prepare(session=session, request_schemas=schemas)
    return JsonResponse({"turn": trace["turn"], "messages": payload, "trace": trace})


@csrf_exempt
@require_methods("POST")
@authorize
def session_usage(request: ApiRequest, session_id: UUID) -> HttpResponse:
    session = _session(request, session_id)
    body = json_body(request, USAGE_REPORT)
    number = body.get("turn")
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_DB_INT:
        raise ApiError(400, "turn must be the number of a turn (from the prepare answer)", "turn")
    if not isinstance(body.get("usage"), dict):
        raise ApiError(400, "usage must be the usage object the provider returned", "usage")
    _refuse_nul(body.get("usage"), "usage")
    try:
        turn = services.usage_report(session=session, turn_number=number, usage=body.get("usage"))
    except Turn.DoesNotExist as exc:
        # 422, not 404: the session (the URL) exists; the body names a turn it does not have.
        raise ApiError(422, f"the session has no turn {number}", "turn") from exc
    reported = services.reported_prompt_tokens(turn.usage)
    return JsonResponse({
        "turn": turn.number,
        "usage": turn.usage,
        "payload_tokens": turn.payload_tokens,
        "reported_prompt_tokens": reported,
        "difference": None if reported is None else reported - turn.payload_tokens,
    })


@csrf_exempt
@require_methods("POST")
@authorize
def session_compact(request: ApiRequest, session_id: UUID) -> HttpResponse:
    session = _session(request, session_id)
    body = json_body(request, COMPACT)
    # Every field is checked before anything runs: a preview with a bad
    # "background" is a bad request too.
    preview = body.get("preview", False)
    if not isinstance(preview, bool):
        raise ApiError(400, "preview must be true or false", "preview")
    instruction = body.get("instruction")
    if instruction is not None and not isinstance(instruction, str):
        raise ApiError(400, "instruction must be a string", "instruction")
    background = body.get("background", False)
    if not isinstance(background, bool):
        raise ApiError(400, "background must be true or false", "background")
    if preview:
        return JsonResponse({"preview": services.compaction_preview(session=session)})
    if background:
        # Answered at once; the run row (GET .../runs/<id>) and the session's
        # websocket say how it goes.
        run = services.compaction_enqueue(session=session, instruction=instruction, requested_by=request.user)
        return JsonResponse({"run": run.to_dict()}, status=202)
    run = services.compaction_run(session=session, instruction=instruction, requested_by=request.user)
    assert run.turn_number is not None  # a run that finished without raising has its turn
    turn = session.turns.get(number=run.turn_number)
    return JsonResponse({"run": run.to_dict(), "turn": turn.to_dict(), "trace": turn.trace})


def _run(session: AgentSession, run_id: int) -> CompactionRun:
    run = session.compaction_runs.select_related("session").filter(pk=run_id).first()
    if run is None:
        raise ApiError(404, f"the session has no run {run_id}", "run")
    return run


def _run_dict(run: CompactionRun) -> dict[str, Any]:
    """A run, with its draft when it is a dry run that made one (the planned answer stays inside)."""
    data = run.to_dict()
    if run.kind == CompactionRun.Kind.DRY_RUN:
        stored = run.draft or {}
        draft = stored.get("draft")
        data["draft"] = None if draft is None else {
            "summary": draft["summary"], "previous_summary": draft["previous_summary"],
            "summary_version": draft["summary_version"], "outcome": draft["outcome"],
            "compact_ids": draft["compact_ids"], "keep_ids": draft["keep_ids"], "pins": draft["pins"],
            "lost": stored.get("lost") or [], "lost_count": stored.get("lost_count") or 0,
            "failure": stored.get("failure")}
    return data


@csrf_exempt
@require_methods("GET")
@authorize
def session_run(request: ApiRequest, session_id: UUID, run_id: int) -> HttpResponse:
    session = _session(request, session_id)
    return JsonResponse(_run_dict(_run(session, run_id)))


@csrf_exempt
@require_methods("POST")
@authorize
def session_dry_runs(request: ApiRequest, session_id: UUID) -> HttpResponse:
    """Start a dry run with the profile's compactor: a background run whose draft commits nothing."""
    session = _session(request, session_id)
    body = json_body(request, DRY_RUN)
    instruction = body.get("instruction")
    if instruction is not None and not isinstance(instruction, str):
        raise ApiError(400, "instruction must be a string", "instruction")
    if instruction is not None and len(instruction) > MAX_INSTRUCTION_LENGTH:
        raise ApiError(400, f"instruction holds at most {MAX_INSTRUCTION_LENGTH} characters", "instruction")
    try:
        run = services.dry_run_start(session=session, instruction=instruction, requested_by=request.user)
    except services.RunInProgress as exc:
        raise ApiError(409, exc.message, exc.field) from exc
    return JsonResponse({"run": _run_dict(run)}, status=202)


@csrf_exempt
@require_methods("POST")
@authorize
def session_run_action(request: ApiRequest, session_id: UUID, run_id: int, action: str) -> HttpResponse:
    """accept (commit the draft as reviewed), discard (drop it), cancel (a queued or running run)."""
    session = _session(request, session_id)
    run = _run(session, run_id)
    try:
        if action == "accept":
            services.draft_accept(run=run)
            assert run.turn_number is not None
            turn = session.turns.get(number=run.turn_number)
            return JsonResponse({"run": _run_dict(run), "turn": turn.to_dict()})
        if action == "discard":
            services.draft_discard(run=run)
        else:
            services.run_cancel(run=run)
    except (services.DraftStale, services.DraftNotOpen) as exc:
        run.refresh_from_db()
        return error(409, exc.message, exc.field, run=_run_dict(run))
    return JsonResponse({"run": _run_dict(run)})


@csrf_exempt
@require_methods("GET", "POST")
@authorize
def session_pins(request: ApiRequest, session_id: UUID) -> HttpResponse:
    """The session's pins; POST {action, message_id | fact} changes them."""
    session = _session(request, session_id)
    if request.method == "GET":
        return JsonResponse(services.pins_of(session).to_dict())
    body = json_body(request, PINS_CHANGE)
    action = body.get("action")
    if action not in PIN_ACTIONS:
        raise ApiError(400, f"action must be one of {', '.join(PIN_ACTIONS)}", "action")
    # Each field as the document bounds it, whichever action it came with (and
    # before any clean-up of whitespace).
    for field, limit in (("message_id", 200), ("fact", MAX_FACT_CHARS)):
        if field not in body:
            continue
        given = body[field]
        if not isinstance(given, str) or not given.strip() or len(given) > limit:
            raise ApiError(400, f"{field} must be a string of 1 to {limit} characters, not only spaces", field)
    name = "fact" if action.endswith("_fact") else "message_id"
    value = body.get(name)
    if value is None:
        raise ApiError(400, f"{action} needs {name}", name)
    change = {"pin_message": services.pin_message, "unpin_message": services.unpin_message}
    if name == "message_id":
        pins = change[action](session=session, message_id=value)
    elif action == "pin_fact":
        pins = services.pin_fact(session=session, fact=value)
    else:
        pins = services.unpin_fact(session=session, fact=value)
    return JsonResponse(pins.to_dict())


@csrf_exempt
@require_methods("GET")
@authorize
def session_turns(request: ApiRequest, session_id: UUID) -> HttpResponse:
    session = _session(request, session_id)
    after = _int_param(request, "after", 0)
    limit = _int_param(request, "limit", 100, low=1, high=MAX_PAGE)
    turns = list(session.turns.filter(number__gt=after).order_by("number")[:limit])
    return JsonResponse({"turns": [t.to_dict() for t in turns]})


@csrf_exempt
@require_methods("GET")
@authorize
def session_turn(request: ApiRequest, session_id: UUID, number: int) -> HttpResponse:
    session = _session(request, session_id)
    turn = session.turns.filter(number=number).first()
    if turn is None:
        raise ApiError(404, f"the session has no turn {number}", "turn")
    return JsonResponse(turn.to_dict(full=True))


@csrf_exempt
@require_methods("GET")
@authorize
def session_summaries(request: ApiRequest, session_id: UUID) -> HttpResponse:
    session = _session(request, session_id)
    loss_records.record(session)  # versions not checked yet (or by an older check) are checked now, once
    return JsonResponse({"current_version": session.summary_version,
                         "summaries": [s.to_dict() for s in session.summary_versions.order_by("version")]})


@csrf_exempt
@require_methods("GET")
@authorize
def session_export(request: ApiRequest, session_id: UUID) -> HttpResponse:
    session = _session(request, session_id)
    response = HttpResponse(services.session_export(session=session), content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="contextlab-session-{session.id}.zip"'
    return response


# -- imports and profiles ----------------------------------------------------------------


@csrf_exempt
@require_methods("POST")
@authorize
def imports(request: ApiRequest) -> HttpResponse:
    fields = IMPORT_FORM["properties"]
    unknown = sorted(name for name in [*request.POST, *request.FILES] if name not in fields)
    if unknown:
        raise ApiError(400, f"unknown form field {unknown[0]!r}; this form takes {', '.join(fields)}", unknown[0])
    upload = request.FILES.get("file")
    if upload is None or "file" in request.POST:
        raise ApiError(400, "send the transcript as a multipart form field named 'file'", "file")
    background = request.POST.get("background", "no")
    if background not in (*YES, *NO):
        raise ApiError(400, f"background must be one of {', '.join((*YES, *NO))}", "background")
    profile = None
    _refuse_nul(dict(request.POST.items()), "")
    if request.POST.get("profile"):
        profile = services.profile_resolve(owner=request.user, ref=request.POST["profile"])
    title = request.POST.get("title", "")
    if background in YES:
        session, run = services.transcript_import_enqueue(owner=request.user, upload=upload, profile=profile,
                                                          title=title)
        if run is not None:
            return JsonResponse({**session.to_dict(), "run": run.to_dict()}, status=202)
        return JsonResponse(session.to_dict(), status=201)
    try:
        session = services.transcript_import(owner=request.user, upload=upload, profile=profile, title=title)
    except DataError as exc:
        # The importers read any text JSON can carry; PostgreSQL cannot store
        # some of it (a NUL character). The service has removed the session.
        raise ApiError(400, f"the transcript holds a value the database cannot store: {exc}", "file") from exc
    return JsonResponse(session.to_dict(), status=201)


@csrf_exempt
@require_methods("GET", "POST")
@authorize
def profiles(request: ApiRequest) -> HttpResponse:
    if request.method == "POST":
        body = json_body(request)
        _refuse_nul(body, "")
        knobs = {k: v for k, v in body.items() if k != "name"}
        if not isinstance(body.get("name"), str):
            raise ApiError(400, "name is required", "name")
        profile = services.profile_create(owner=request.user, name=body["name"], knobs=knobs, change_source="api")
        return JsonResponse(profile.to_dict(), status=201)
    return JsonResponse({"profiles": [p.to_dict() for p in AgentProfile.objects.filter(owner=request.user)]})


# -- unauthenticated ---------------------------------------------------------------------


@require_GET
def openapi(request: HttpRequest) -> HttpResponse:
    return JsonResponse(schema(request.build_absolute_uri("/api/v1")))


@csrf_exempt
def not_found(request: HttpRequest, rest: str = "") -> HttpResponse:
    return error(404, f"no API endpoint {request.path}; see /api/v1/openapi.json", None)
