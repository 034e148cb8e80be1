"""The API reference page: the OpenAPI document of this server, readable in a browser."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from contextlab.api import reference
from contextlab.api.openapi import schema


@require_GET
def api_docs(request: HttpRequest) -> HttpResponse:
    document = schema(request.build_absolute_uri("/api/v1"))
    return render(request, "api/docs.html", {
        "info": document["info"],
        "base_url": document["servers"][0]["url"],
        "operations": reference.operations(document),
        "models": reference.models(document),
        "nav": "api",
    })


@require_GET
def api_root(request: HttpRequest) -> HttpResponse:
    return redirect("cl-api-docs")
