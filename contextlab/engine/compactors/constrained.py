"""Constrained output for the summary model: the six headings forced by the server.

Off by default. Small or weak models often drop headings, write a preamble or
echo the prompt, and the validity check then rejects the whole reply. A server
that supports constrained decoding can be made to emit the template itself:

* ``grammar``: a GBNF grammar in the request body (llama.cpp's ``llama-server``
  only). The reply is the Markdown document itself.
* ``json_schema``: ``response_format`` with a JSON schema (OpenAI, vLLM,
  llama.cpp and others). The reply is a JSON object, rendered here into the
  same Markdown document; a reply that is not such an object is passed on as it
  came, so the validity check rejects it and the engine saves it.

Either way the structure is forced but not the content, and a reply cut at
``max_tokens`` still misses its last sections: this raises the share of
replies the validity check accepts, it does not make a model summarise well.
"""

from __future__ import annotations

import json
from typing import Any

from contextlab.engine.core.profile import CONSTRAINED_OUTPUTS
from contextlab.engine.stages.summary.prompts import (
    SECTION_HEADINGS,
    SECTION_IDS,
    SUBSECTION_HEADINGS,
    SUBSECTION_IDS,
)

__all__ = ["CONSTRAINED_OUTPUTS", "render_json_summary", "request_options", "summary_grammar", "summary_schema"]

# Bounds that keep a looping model from spending its whole token budget in one
# section: at most this many bullet items per section, of at most this many characters.
MAX_ITEMS = 3
MAX_ITEM_CHARS = 160


def _gbnf_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def summary_grammar(language: str) -> str:
    """A GBNF grammar accepting exactly the summary template of ``language`` ("en" or "zh")."""
    sections = SECTION_HEADINGS[language]
    subsections = SUBSECTION_HEADINGS[language]
    rules = ["root ::= " + " ".join(f"section{i}" for i in range(len(sections)))]
    for index, (section_id, heading) in enumerate(zip(SECTION_IDS, sections, strict=True)):
        if section_id == "progress":
            parts = " ".join(f"{_gbnf_literal(sub + chr(10))} body" for sub in subsections)
            rules.append(f"section{index} ::= {_gbnf_literal(heading + chr(10))} {parts}")
        else:
            rules.append(f"section{index} ::= {_gbnf_literal(heading + chr(10))} body")
    rules.append(f'body ::= item{{1,{MAX_ITEMS}}} "\\n"')
    # An item starts with anything but a heading mark, so no extra heading sneaks in.
    rules.append(f'item ::= "- " [^\\n#] [^\\n]{{0,{MAX_ITEM_CHARS - 1}}} "\\n"')
    return "\n".join(rules) + "\n"


def _items_schema() -> dict[str, Any]:
    return {"type": "array", "minItems": 1, "maxItems": MAX_ITEMS,
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_ITEM_CHARS}}


def summary_schema() -> dict[str, Any]:
    """The JSON schema of a summary: one list of items per section, Progress split in three."""
    properties: dict[str, Any] = {}
    for section_id in SECTION_IDS:
        if section_id == "progress":
            properties[section_id] = {
                "type": "object",
                "properties": {sub: _items_schema() for sub in SUBSECTION_IDS},
                "required": list(SUBSECTION_IDS),
                "additionalProperties": False,
            }
        else:
            properties[section_id] = _items_schema()
    return {"type": "object", "properties": properties, "required": list(SECTION_IDS),
            "additionalProperties": False}


def request_options(mode: str, language: str) -> dict[str, Any]:
    """The extra body fields that ask the server for constrained output (none when off)."""
    if mode == "grammar":
        return {"grammar": summary_grammar(language)}
    if mode == "json_schema":
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "context_summary", "schema": summary_schema()}}}
    return {}


def render_json_summary(text: str, language: str) -> str:
    """The Markdown document for a JSON reply; the text unchanged when it is not one."""
    try:
        data = json.loads(text)
    except ValueError:
        return text
    if not isinstance(data, dict):
        return text
    lines: list[str] = []
    for section_id, heading in zip(SECTION_IDS, SECTION_HEADINGS[language], strict=True):
        if section_id not in data:
            continue  # left out, so the validity check names it as missing
        lines.append(heading)
        value = data[section_id]
        if section_id == "progress" and isinstance(value, dict):
            for sub_id, sub_heading in zip(SUBSECTION_IDS, SUBSECTION_HEADINGS[language], strict=True):
                lines.append(sub_heading)
                lines.extend(_bullets(value.get(sub_id)))
        else:
            lines.extend(_bullets(value))
        lines.append("")
    return "\n".join(lines).strip()


def _bullets(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value] if value not in (None, "") else []
    bullets = [f"- {' '.join(str(item).split())}" for item in items if str(item).strip()]
    return bullets or ["- (none)"]
