"""Tool output is data: escaped, stripped of terminal codes, collapsed when long."""

from __future__ import annotations

from contextlab.sessions import services
from contextlab.sessions.models import SessionMessage

EVIL = '<script>window.pwned = 1</script><img src=x onerror="alert(1)">'


def _tool_exchange(output: str) -> list[dict]:
    return [
        {"role": "user", "content": "look at the page"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "fetch", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": output},
    ]


def test_it_escapes_html_in_tool_output_everywhere(alice_client, alice_session):
    services.messages_append(session=alice_session, messages=_tool_exchange(EVIL))
    services.session_prepare(session=alice_session)
    seq = SessionMessage.objects.get(session=alice_session, role="tool").seq
    base = alice_session.get_absolute_url()
    for url in (base, f"{base}turns/1/", f"{base}payload/?turn=1", f"{base}messages/{seq}/",
                f"{base}search?q=pwned"):
        page = alice_client.get(url).content.decode()
        assert "<script>window.pwned" not in page, url
        assert "<img src=x" not in page, url
        assert "&lt;script&gt;window." in page, url  # shown, as text


def test_it_strips_terminal_escape_codes(alice_client, alice_session):
    services.messages_append(session=alice_session, messages=_tool_exchange(
        "\x1b[1;31mFAILED\x1b[0m tests/test_app.py::test_login"))
    services.session_prepare(session=alice_session)
    page = alice_client.get(f"{alice_session.get_absolute_url()}payload/?turn=1").content.decode()
    assert "FAILED tests/test_app.py::test_login" in page
    assert "\x1b" not in page


def test_it_collapses_long_output_behind_details(alice_client, alice_session):
    output = "\n".join(f"log line {i}" for i in range(40))
    services.messages_append(session=alice_session, messages=_tool_exchange(output))
    services.session_prepare(session=alice_session)
    page = alice_client.get(f"{alice_session.get_absolute_url()}payload/?turn=1").content.decode()
    assert '<details class="long">' in page
    assert "show all 40 lines" in page
    head = page.index("log line 0")
    assert page.index("<summary>") < head < page.index("</summary>")
    assert page.index("log line 39") > page.index("</summary>")
