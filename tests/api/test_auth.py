from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from contextlab.api.models import ApiToken, hash_token


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer nope", "Basic YWxpY2U6eA==", "Token cl_x"])
def test_it_answers_401_json_without_a_valid_token(db, header):
    headers = {"Authorization": header} if header else {}
    response = Client().get("/api/v1/sessions", headers=headers)
    assert response.status_code == 401
    assert response.json()["field"] == "Authorization"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_it_accepts_a_valid_token_and_notes_its_use(api, alice_token):
    assert api.get("/api/v1/sessions").status_code == 200
    token = ApiToken.objects.get(key_hash=hash_token(alice_token))
    assert token.last_used is not None


def test_it_refuses_the_token_of_an_inactive_user(api, alice):
    alice.is_active = False
    alice.save()
    assert api.get("/api/v1/sessions").status_code == 401


def test_it_stores_only_a_hash(alice_token):
    token = ApiToken.objects.get()
    assert alice_token not in (token.key_hash, token.prefix)
    assert token.key_hash == hash_token(alice_token)


def test_it_answers_405_json_for_a_wrong_method(api):
    response = api.client.delete("/api/v1/sessions", headers=api.headers)
    assert response.status_code == 405
    assert response["Allow"] == "GET, POST"
    assert response.json()["field"] == "method"


def test_it_answers_404_json_for_an_unknown_endpoint(api):
    response = api.get("/api/v1/nothing-here")
    assert response.status_code == 404
    assert "error" in response.json()


def test_createapitoken_prints_a_working_token_on_its_last_line(alice):
    out = io.StringIO()
    call_command("createapitoken", "alice", "--name", "laptop", stdout=out, stderr=io.StringIO())
    token = out.getvalue().strip().splitlines()[-1]
    response = Client().get("/api/v1/sessions", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    assert ApiToken.objects.get().name == "laptop"


def test_createapitoken_refuses_an_unknown_user(db):
    with pytest.raises(CommandError):
        call_command("createapitoken", "nobody", stdout=io.StringIO(), stderr=io.StringIO())
