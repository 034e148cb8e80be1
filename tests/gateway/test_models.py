"""GET /v1/models passes the provider's list through."""

from __future__ import annotations

import openai
import pytest

from tests.gateway.conftest import UPSTREAM_KEY
from tests.gateway.provider import MODELS


def test_it_passes_the_model_list_through(openai_client, provider):
    raw = openai_client.models.with_raw_response.list()
    assert raw.http_response.json() == MODELS
    assert [m.id for m in raw.parse()] == ["fake-model-2026", "fake-mini"]
    assert provider.requests[-1].path == "/v1/models"
    assert provider.requests[-1].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"


def test_it_passes_one_model_and_its_absence_through(openai_client):
    assert openai_client.models.retrieve("fake-mini").owned_by == "tests"
    with pytest.raises(openai.NotFoundError) as caught:
        openai_client.models.retrieve("no-such-model")
    assert caught.value.code == "model_not_found"
