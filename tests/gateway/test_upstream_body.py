"""The upstream body is written by the fast encoder in the standard encoder's exact form, and by
the standard one where the two would differ."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest

from contextlab.gateway import upstream


def _standard(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")


BODY: dict[str, Any] = {
    "model": "gpt-4o", "temperature": 0.7, "max_tokens": 512, "stream": False, "seed": None,
    "messages": [{"role": "system", "content": "Keep paths: /srv/shop, C:\\build\\out"},
                 {"role": "user", "content": "héllo \u2028 \"quoted\" \t tab 😀"},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": "{\"a\": 1}"}}]}],
    "tools": [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "minimum": -1.5}}}],
}


def test_it_writes_the_body_with_the_fast_encoder_in_the_standard_form(monkeypatch: pytest.MonkeyPatch):
    calls: list[Any] = []
    fast = orjson.dumps
    monkeypatch.setattr(upstream.orjson, "dumps", lambda value: calls.append(value) or fast(value))
    assert upstream.encode_body(BODY, nonfinite=False) == _standard(BODY)
    assert calls == [BODY]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_it_writes_nan_and_infinity_as_the_client_sent_them(value: float):
    body = {**BODY, "temperature": value}
    assert upstream.encode_body(body, nonfinite=True) == _standard(body)


@pytest.mark.parametrize("value", ["lone \ud800 surrogate", 2**70])
def test_it_falls_back_to_the_standard_encoder_for_what_the_fast_one_refuses(value: Any):
    body = {**BODY, "metadata": {"x": value}}
    assert upstream.encode_body(body, nonfinite=False) == _standard(body)
