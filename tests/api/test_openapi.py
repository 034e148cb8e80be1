from __future__ import annotations

import re
import uuid

from django.test import Client
from django.urls import URLPattern, URLResolver

from contextlab.api import urls as api_urls
from contextlab.insights import api_urls as insights_api_urls


def _documented_path(pattern: str) -> str:
    path = re.sub(r"<uuid:(\w+)>", r"{\1}", pattern)
    return "/" + re.sub(r"<int:(\w+)>", r"{\1}", path)


def test_it_serves_an_openapi_3_document_without_a_token(db):
    response = Client().get("/api/v1/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert schema["servers"][0]["url"] == "http://testserver/api/v1"
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_it_documents_every_route_with_its_methods(db):
    schema = Client().get("/api/v1/openapi.json").json()
    routes = set()
    # The insights app mounts its endpoint under /api/v1/ too.
    for entry in [*api_urls.urlpatterns, *insights_api_urls.urlpatterns]:
        assert isinstance(entry, URLPattern | URLResolver)
        if entry.name:
            routes.add(_documented_path(str(entry.pattern)))
    assert routes == set(schema["paths"])
    client_methods = {"get", "post"}
    for path in routes:
        documented = set(schema["paths"][path]) & client_methods
        assert documented, path
        # The decorated view answers 405 to every method it does not document.
        url = "/api/v1" + path.replace("{session_id}", str(uuid.UUID(int=0))).replace("{number}", "1").replace(
            "{run_id}", "1")
        for method in client_methods - documented:
            response = getattr(Client(), method)(url)
            assert response.status_code == 405, (path, method)


def test_it_resolves_every_reference(db):
    schema = Client().get("/api/v1/openapi.json").json()
    text = repr(schema)
    for name in re.findall(r"#/components/schemas/(\w+)", text):
        assert name in schema["components"]["schemas"], name
