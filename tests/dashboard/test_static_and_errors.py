"""Static files, the favicon and the error pages, served as in production (DEBUG off)."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path

from contextlab.urls import urlpatterns as app_urlpatterns


def _boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a bug in a view")


# The application's own URLs, plus a view that fails (the 500 test uses them).
urlpatterns = [*app_urlpatterns, path("boom/", _boom)]


def _static_urls(html: str) -> list[str]:
    return re.findall(r'(?:href|src)="(/static/[^"]+)"', html)


def _body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def test_it_serves_every_static_file_the_pages_link_with_debug_off(alice_client, worked_session):
    assert settings.DEBUG is False
    pages = [Client().get("/accounts/login/"), alice_client.get("/"),
             alice_client.get(worked_session.get_absolute_url())]
    linked = sorted({url for page in pages for url in _static_urls(page.content.decode())})
    # The stylesheet, the icon, htmx and its websocket extension, uPlot and the session page's own script.
    for expected in ("/static/css/app.css", "/static/favicon.svg", "htmx", "ws", "uPlot", "/static/js/session.js"):
        assert any(expected in url for url in linked), (expected, linked)
    for url in linked:
        response = Client().get(url)
        assert response.status_code == 200, url
        assert len(_body(response)) > 100, url


def test_it_answers_the_favicon_that_browsers_ask_for_on_every_page(db):
    client = Client()
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"] == "/static/favicon.svg"
    icon = client.get(response["Location"])
    assert icon.status_code == 200
    assert icon["Content-Type"].startswith("image/svg+xml")
    assert b"<svg" in _body(icon)


def test_it_shows_a_styled_page_for_a_missing_page(alice_client):
    response = alice_client.get("/no-such-page/")
    assert response.status_code == 404
    html = response.content.decode()
    assert "Nothing here" in html and "/no-such-page/" in html
    assert "/static/css/app.css" in _static_urls(html)
    assert "alice" in html  # the frame of every page, with its navigation


@pytest.mark.urls(__name__)
def test_it_shows_a_styled_page_for_a_server_error(db):
    response = Client(raise_request_exception=False).get("/boom/")
    assert response.status_code == 500
    html = response.content.decode()
    assert "Something went wrong on the server" in html
    assert "a bug in a view" not in html
    assert "/static/css/app.css" in _static_urls(html)
