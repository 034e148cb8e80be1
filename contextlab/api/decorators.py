"""What every JSON API view shares: method check, bearer-token auth, JSON errors.

Every error leaves as ``{"error": sentence, "field": name-or-null}`` with a 4xx
status, so an agent can show what was wrong with its request; an unexpected
exception is logged and answered with a JSON 500 rather than an HTML page.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections.abc import Callable, Mapping
from functools import wraps
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.utils.timezone import now

from contextlab.api.models import ApiToken, hash_token
from contextlab.engine.core.errors import (
    CompactorFailed,
    ContextLabError,
    InputTooLarge,
    InvalidProfile,
    TokenizerUnavailable,
)
from contextlab.engine.core.unicode import first_unencodable
from contextlab.sessions.services import SessionUnavailable
from contextlab.support import ratelimit

log = logging.getLogger(__name__)

MAX_JSON_DEPTH = 100
# Writing last_used on every request would add a write to each hook call.
LAST_USED_RESOLUTION = dt.timedelta(minutes=5)


class ApiRequest(HttpRequest):
    user: User
    token: ApiToken


class ApiError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


ApiView = Callable[..., HttpResponse]


def error(status: int, message: str, field: str | None = None, **extra: Any) -> JsonResponse:
    return JsonResponse({"error": message, "field": field, **extra}, status=status)


def _status_for(exc: ContextLabError) -> int:
    if isinstance(exc, InputTooLarge):
        return 413
    if isinstance(exc, InvalidProfile):
        return 422
    if isinstance(exc, SessionUnavailable):
        return 409
    if isinstance(exc, TokenizerUnavailable):
        return 503
    if isinstance(exc, CompactorFailed):
        return 502
    return 400


def require_methods(*methods: str) -> Callable[[ApiView], ApiView]:
    """Like Django's ``require_http_methods``, with a JSON 405."""

    def decorator(view: ApiView) -> ApiView:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                response = error(405, f"use {' or '.join(methods)} here", "method")
                response["Allow"] = ", ".join(methods)
                return response
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


def _token_for(request: HttpRequest) -> ApiToken | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    token = ApiToken.objects.select_related("user").filter(key_hash=hash_token(value.strip())).first()
    if token is None or not token.user.is_active:
        return None
    return token


def authorize(view: ApiView) -> ApiView:
    """Bearer-token auth, then the view; ContextLab errors become JSON 4xx answers."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        token = _token_for(request)
        if token is None:
            response = error(401, "missing or invalid API token: send 'Authorization: Bearer <token>'",
                             "Authorization")
            response["WWW-Authenticate"] = 'Bearer realm="contextlab"'
            return response
        retry_after = ratelimit.check("api", token.key_hash)
        if retry_after is not None:
            response = error(429, f"too many requests for this API token; try again in {retry_after} s", None)
            response["Retry-After"] = str(retry_after)
            return response
        moment = now()
        if token.last_used is None or moment - token.last_used > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used=moment)
        request.user = token.user
        api_request: ApiRequest = request  # type: ignore[assignment]
        api_request.token = token
        try:
            return view(api_request, *args, **kwargs)
        except ApiError as exc:
            return error(exc.status, exc.message, exc.field)
        except ContextLabError as exc:
            return JsonResponse(exc.as_dict(), status=_status_for(exc))
        except ObjectDoesNotExist:
            return error(404, "not found", None)
        except RequestDataTooBig:
            return error(413, "the request body is larger than this server accepts", "body")
        except MultiPartParserError as exc:
            return error(400, f"the body is not a readable multipart form: {exc}", "body")
        except Exception:
            log.exception("API error in %s", request.path)
            return error(500, "internal error; the server log has the details", None)

    return wrapper


def json_body(request: HttpRequest, schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The request body as a JSON object; every way it can be bad names "body".

    With ``schema`` (the operation's request body in the API document), a field
    the document does not list is refused, naming it: a misspelt option must
    not be silently ignored.
    """
    try:
        raw = request.body
    except RequestDataTooBig as exc:
        raise ApiError(413, "the request body is larger than this server accepts", "body") from exc
    if not raw.strip():
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the body is not valid UTF-8 (at byte {exc.start})", "body") from exc
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                       "body") from exc
    except RecursionError as exc:
        raise ApiError(400, f"the body is nested deeper than {MAX_JSON_DEPTH} levels", "body") from exc
    except ValueError as exc:  # NaN/Infinity, or an integer too long to convert
        raise ApiError(400, f"the body is not valid JSON: {exc}", "body") from exc
    if _deeper_than(value, MAX_JSON_DEPTH):
        raise ApiError(400, f"the body is nested deeper than {MAX_JSON_DEPTH} levels", "body")
    if not isinstance(value, dict):
        raise ApiError(400, "the body must be a JSON object", "body")
    # "\ud800" is valid JSON but no text: stored, it would break every page and
    # the export that shows it. Refused here, naming where it is.
    where = first_unencodable(value)
    if where is not None:
        raise ApiError(400, f"{where} holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text", where)
    if schema is not None:
        refuse_unknown_fields(value, schema)
    return value


def refuse_unknown_fields(value: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    known = schema.get("properties") or {}
    unknown = sorted(str(key) for key in value if key not in known)
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0]!r}; this request takes {', '.join(known) or 'no fields'}",
                       unknown[0])


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    # 1e400 parses to infinity, which no database stores as JSON (a 500 at save).
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is too large")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, dict | list))
    return False
