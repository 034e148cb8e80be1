"""The API reference page: every operation and model of the OpenAPI document, readable, no script from elsewhere."""

from __future__ import annotations

import html

from contextlab.api import reference
from contextlab.api.openapi import schema


def test_it_lists_every_operation_and_model_of_the_schema_the_code_produces(client):
    response = client.get("/api/docs")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    page = html.unescape(response.content.decode())
    document = schema("http://testserver/api/v1")
    for path, item in document["paths"].items():
        for method in reference.METHODS:
            if method in item:
                assert f"{method.upper()}</span> <code class=\"api-path\">{path}</code>" in page, (method, path)
                if item[method].get("summary"):
                    assert item[method]["summary"] in page
    for name in document["components"]["schemas"]:
        assert f'id="model-{name}"' in page, name
    assert "http://testserver/api/v1" in page
    # Served by this server alone: no script at all, nothing from another origin.
    assert "<script src=\"http" not in page and "cdn" not in page.lower()


def test_it_writes_types_a_reader_can_read():
    assert reference.type_text({"type": "array", "items": {"$ref": "#/components/schemas/Turn"}}) == "array of Turn"
    assert reference.type_text({"type": "integer", "minimum": 1, "maximum": 200}) == "integer ≥ 1, ≤ 200"
    assert reference.type_text({"type": "string", "format": "uuid", "nullable": True}) == "string (uuid), nullable"
    assert reference.type_text({"enum": ["a", "b"]}) == '"a" | "b"'


def test_it_sends_api_and_its_bare_root_to_the_reference(client):
    response = client.get("/api/")
    assert response.status_code == 302 and response["Location"] == "/api/docs"


def test_it_sets_a_content_security_policy_on_html_pages_only(client, alice):
    page = client.get("/api/docs")
    policy = page["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy.split("style-src-attr")[0]
    assert "unsafe-eval" not in policy
    assert "Content-Security-Policy" not in client.get("/api/v1/openapi.json")
    client.force_login(alice)
    assert "script-src 'self'" in client.get("/")["Content-Security-Policy"]
