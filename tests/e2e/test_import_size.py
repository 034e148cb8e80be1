"""A file over the upload limit, chosen in the import form: refused in the page, never sent.

A browser that starts an upload the server refuses at its first bytes usually shows
"connection reset", not the server's 413 page; so the form itself says the file is
too large, names both sizes, and does not submit.
"""

from __future__ import annotations

from django.test import override_settings

from contextlab.sessions.models import AgentSession
from tests.e2e.browser import BrowserTestCase

LIMIT = 4096


@override_settings(CONTEXTLAB_MAX_UPLOAD_BYTES=LIMIT, CONTEXTLAB_MAX_REQUEST_BYTES=LIMIT + 1024)
class TestImportSize(BrowserTestCase):
    def test_it_refuses_a_file_over_the_limit_before_sending_it(self) -> None:
        page = self.page
        self.open("/import/")
        assert "Up to 4.0\xa0KB." in (page.text_content("#id_file_help") or "")
        posts: list[str] = []
        page.on("request", lambda request: posts.append(request.url) if request.method == "POST" else None)
        page.set_input_files("#id_file", files=[{"name": "run.jsonl", "mimeType": "application/json",
                                                 "buffer": b"x" * (LIMIT + 1)}])
        alert = page.locator("#id_file_size")
        assert alert.is_visible()
        assert alert.text_content() == "run.jsonl is 4.0 KB: this server accepts files of up to 4.0 KB."
        page.click(".import-form button[type=submit]")
        page.wait_for_timeout(300)
        assert posts == [] and page.url.endswith("/import/")
        assert not AgentSession.objects.exists()

        # A file within the limit clears the message and is sent.
        page.set_input_files("#id_file", files=[{"name": "ok.json", "mimeType": "application/json",
                                                 "buffer": b'[{"role": "user", "content": "hi"}]'}])
        assert not alert.is_visible()
        page.click(".import-form button[type=submit]")
        page.wait_for_load_state()
        self.wait_until("!location.pathname.endsWith('/import/')", timeout=30)
        assert len(posts) == 1
        assert not self.page_errors
