"""The LLM compactor: any OpenAI-compatible chat-completions endpoint.

The client's own retries are switched off (``max_retries=0``) and replaced by
our loop, so every attempt is counted, timed and explained in the trace
("attempt 1: HTTP 500 ..."), which the SDK's silent retries would hide.

What is retried: timeouts, connection errors, HTTP 408/409/429/5xx and empty
answers. What is not: other 4xx (a wrong key or model name will not fix
itself). A reply without headings is *returned*, not raised: judging it is the
validity check's job, and the engine saves it for debugging.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import openai

from contextlab.engine.compactors.base import SummaryFailed, SummaryRequest, SummaryResult
from contextlab.engine.compactors.constrained import CONSTRAINED_OUTPUTS, render_json_summary, request_options
from contextlab.engine.core.errors import CompactorFailed, InvalidProfile
from contextlab.engine.stages.summary.prompts import TextCounter, build_summary_messages, resolve_language
from contextlab.engine.stages.summary.validity import normalize_summary

if TYPE_CHECKING:
    import httpx2

_RETRYABLE_STATUS = {408, 409, 429}
_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")
# Used as the key for endpoints that need none (a local vLLM or Ollama): the
# SDK refuses to build a client without some key.
_NO_KEY = "not-needed"


class OpenAICompactor:
    """Summaries from a chat-completions model (a cheap one, separate from the agent's)."""

    name = "openai"

    def __init__(
        self,
        base_url: str | None,
        model: str,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout: float = 60.0,
        retries: int = 2,
        temperature: float = 0.2,
        http_client: httpx2.Client | None = None,
        *,
        retry_backoff: float = 1.0,
        counter: TextCounter | None = None,
        max_chars_per_block: int = 4000,
        max_tokens: int | None = None,
        constrained_output: str = "off",
        api_key: str | None = None,
    ) -> None:
        """``api_key_env`` names the environment variable holding the key (None or "" for
        endpoints without authentication); an ``api_key`` given by the caller wins over it
        and names no variable (a server resolves keys itself, see contextlab.support.providers).
        ``retries`` counts extra attempts; ``retry_backoff`` is the first pause between
        attempts, doubled each time. ``max_tokens`` bounds the reply (None: the server's own
        limit); ``constrained_output`` is "off", "grammar" or "json_schema" (see constrained.py)."""
        if not model or not model.strip():
            raise InvalidProfile("the openai compactor needs a model name", field="compaction_model")
        if retries < 0:
            raise InvalidProfile("retries cannot be negative", field="compaction_retries")
        if timeout <= 0:
            raise InvalidProfile("the timeout must be positive", field="compaction_timeout")
        if max_tokens is not None and max_tokens < 1:
            raise InvalidProfile("max_tokens must be at least 1", field="compaction_max_tokens")
        if constrained_output not in CONSTRAINED_OUTPUTS:
            raise InvalidProfile(
                f"unknown constrained output {constrained_output!r}; use one of {', '.join(CONSTRAINED_OUTPUTS)}",
                field="compaction_constrained_output",
            )
        if api_key is not None:
            api_key, api_key_env = api_key or _NO_KEY, None
        elif api_key_env:
            api_key = os.environ.get(api_key_env, "").strip()
            if not api_key:
                # Fail when the profile is loaded, not in the middle of a turn.
                raise CompactorFailed(
                    f"the environment variable {api_key_env} is not set: the openai compactor "
                    f"needs the API key for {base_url or 'the OpenAI API'} there "
                    "(or set api_key_env to empty for an endpoint without a key)",
                    field="api_key_env",
                )
        else:
            api_key = _NO_KEY
        self.base_url = base_url
        self.model = model.strip()
        self.api_key_env = api_key_env
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.temperature = temperature
        self.retry_backoff = retry_backoff
        self.counter = counter
        self.max_chars_per_block = max_chars_per_block
        self.max_tokens = max_tokens
        self.constrained_output = constrained_output
        host = urlsplit(base_url).netloc if base_url else "api.openai.com"
        self.label = f"{self.model} via {host or base_url} (OpenAI-compatible)"
        self._client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key,
            timeout=self.timeout,
            max_retries=0,
            http_client=http_client,
        )

    def close(self) -> None:
        self._client.close()

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        messages = build_summary_messages(
            request, counter=self.counter, max_chars_per_block=self.max_chars_per_block
        )
        language = resolve_language(request.language, request.messages)
        options: dict[str, Any] = {}
        if self.max_tokens is not None:
            options["max_tokens"] = self.max_tokens
        constraint = request_options(self.constrained_output, language)
        body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature,
                                **options, **constraint}
        raw_request: dict[str, Any] = {
            "base_url": str(self._client.base_url),
            "endpoint": "chat/completions",
            "timeout": self.timeout,
            "body": body,
        }
        started = time.perf_counter()
        errors: list[str] = []
        raw_response: dict[str, Any] | None = None
        attempt = 0
        while True:
            attempt += 1
            retryable = True
            try:
                response = self._client.chat.completions.with_raw_response.create(
                    model=self.model,
                    messages=cast(Any, messages),
                    temperature=self.temperature,
                    **options,
                    # Not every SDK version types these fields; the body is what matters.
                    extra_body=constraint or None,
                )
            except openai.APITimeoutError:
                reason = f"no answer within the {self.timeout:g} s timeout"
            except openai.APIConnectionError as exc:
                cause = exc.__cause__ or exc
                reason = f"could not reach {raw_request['base_url']}: {cause}"
            except openai.APIStatusError as exc:
                raw_response = {"status_code": exc.status_code, "body": exc.body}
                retryable = exc.status_code in _RETRYABLE_STATUS or exc.status_code >= 500
                reason = f"HTTP {exc.status_code} from {raw_request['base_url']}: {_error_text(exc)}"
            except openai.OpenAIError as exc:
                retryable = False
                reason = f"the OpenAI client failed: {exc}"
            else:
                try:
                    payload: Any = response.http_response.json()
                except ValueError:
                    payload = None
                if not isinstance(payload, dict):
                    raw_response = {
                        "status_code": response.http_response.status_code,
                        "text": response.http_response.text[:20_000],
                    }
                    reason = "the endpoint answered with something that is not a JSON object"
                else:
                    raw_response = payload
                    text, reason = _reply_text(payload)
                    if text and self.constrained_output == "json_schema":
                        text = render_json_summary(text, language)
                    if text:
                        return SummaryResult(
                            text=text,
                            compactor=self.name,
                            model=str(payload.get("model") or self.model),
                            latency_ms=(time.perf_counter() - started) * 1000,
                            usage=_usage(payload),
                            raw_request=raw_request,
                            raw_response=raw_response,
                            attempts=attempt,
                            attempt_errors=errors,
                        )
            errors.append(f"attempt {attempt}: {reason}")
            if not retryable or attempt > self.retries:
                break
            if self.retry_backoff > 0:
                time.sleep(min(self.retry_backoff * 2 ** (attempt - 1), 30.0))
        tried = f"after {attempt} attempt{'s' if attempt != 1 else ''}"
        raise SummaryFailed(
            f"the summary model {self.model} gave no usable answer {tried}: {reason}",
            compactor=self.name,
            model=self.model,
            attempts=attempt,
            latency_ms=(time.perf_counter() - started) * 1000,
            raw_request=raw_request,
            raw_response=raw_response,
            attempt_errors=errors,
        )


def _error_text(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return exc.message


def _reply_text(payload: dict[str, Any]) -> tuple[str, str]:
    """(summary text, "") or ("", why there is none)."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "", "the answer has no choices"
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return "", "the answer has no message"
    content = message.get("content")
    if isinstance(content, list):
        # Some compatible servers send content parts instead of a string.
        content = "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    text = normalize_summary(content) if isinstance(content, str) else ""
    if text:
        return text, ""
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal.strip():
        return "", f"the model refused: {refusal.strip()}"
    finish = choices[0].get("finish_reason")
    return "", "the model answered with an empty summary" + (f" (finish_reason={finish})" if finish else "")


def _usage(payload: dict[str, Any]) -> dict[str, int] | None:
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    counts = {k: int(usage[k]) for k in _USAGE_KEYS if isinstance(usage.get(k), int | float)}
    return counts or None
