"""Working memory and the operation history page."""

from __future__ import annotations

from django.urls import reverse

from tests.insights.conftest import XSS


def _url(session) -> str:
    return reverse("cl-insights-operations", args=[session.id])


def test_it_lists_every_call_with_the_failure_and_its_first_error_line(alice_client, tool_session):
    response = alice_client.get(_url(tool_session))
    assert response.status_code == 200
    html = response.content.decode()
    assert "make build" in html and "make all" in html
    assert "No rule to make target" in html
    assert 'class="chip chip--failed">failed<' in html
    assert 'class="chip chip--ok">ok<' in html
    # Goal and constraints come from the request.
    assert "Please always run the tests with pytest -q." in html


def test_it_filters_the_failures(alice_client, tool_session):
    html = alice_client.get(_url(tool_session), {"status": "failed"}).content.decode()
    table = html[html.index('id="operations-table"'):]
    assert "make build" in table
    assert "make all" not in table
    assert "1 call shown of 2" in table


def test_the_filter_swaps_only_the_table_for_htmx(alice_client, tool_session):
    response = alice_client.get(_url(tool_session), {"status": "ok"}, headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="operations-table">')
    assert "make all" in html and "make build" not in html


def test_it_links_each_call_to_its_messages(alice_client, tool_session):
    html = alice_client.get(_url(tool_session)).content.decode()
    assert reverse("cl-message-detail", args=[tool_session.id, 2]) in html  # the first call
    assert reverse("cl-message-detail", args=[tool_session.id, 3]) in html  # its result


def test_it_paginates_long_sessions(alice_client, alice_session):
    from contextlab.sessions import services
    from tests.insights.conftest import call, result

    messages = [{"role": "user", "content": "List the files one by one."}]
    for i in range(60):
        messages += [call(f"c{i}", "bash", {"command": f"ls /srv/dir{i}"}), result(f"c{i}", f"file{i}.txt")]
    services.messages_append(session=alice_session, messages=messages)
    html = alice_client.get(_url(alice_session)).content.decode()
    assert "page 1 of 2" in html
    assert "ls /srv/dir49" in html and "ls /srv/dir50" not in html
    html = alice_client.get(_url(alice_session), {"page": 2}).content.decode()
    assert "ls /srv/dir50" in html


def test_content_is_escaped(alice_client, tool_session):
    html = alice_client.get(_url(tool_session)).content.decode()
    assert XSS not in html
    assert "&lt;script&gt;" in html


def test_another_user_gets_a_404(bob_client, tool_session):
    assert bob_client.get(_url(tool_session)).status_code == 404


def test_it_requires_a_login(client, tool_session):
    response = client.get(_url(tool_session))
    assert response.status_code == 302
    assert "/accounts/login/" in response["Location"]
