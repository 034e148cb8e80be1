"""The templates hold nothing the pages' CSP (script-src 'self', no eval) would refuse."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

TEMPLATES = Path(settings.BASE_DIR) / "templates"
# An inline handler (onclick=, onchange=...), htmx's evaluated hx-on / hx-vars / js: values, a
# trigger filter ([...] is compiled with Function), or a <script> with a body instead of a src.
REFUSED = [
    (re.compile(r"\son[a-z]+\s*=", re.I), "inline event handler"),
    (re.compile(r"\shx-on[:\-]"), "hx-on attribute"),
    (re.compile(r"\shx-vars\s*="), "hx-vars attribute"),
    (re.compile(r"\shx-vals\s*=\s*['\"]\s*(js|javascript):"), "hx-vals evaluated as script"),
    (re.compile(r"\shx-trigger\s*=\s*\"[^\"]*\["), "hx-trigger filter"),
    (re.compile(r"<script(?![^>]*\ssrc=)[^>]*>", re.I), "inline <script>"),
    (re.compile(r"javascript:", re.I), "javascript: URL"),
]


def test_it_keeps_every_script_in_a_file_of_static():
    found = []
    for path in sorted(TEMPLATES.rglob("*.html")):
        text = path.read_text()
        for pattern, what in REFUSED:
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(TEMPLATES)}:{line}: {what}")
    assert not found, "\n".join(found)
