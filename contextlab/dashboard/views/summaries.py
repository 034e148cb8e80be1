"""The summary diff viewer: one version against the previous one, section by
section and word by word, with lost identifiers and possibly invented sentences
flagged, and the size of every version."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.db.models.functions import Length
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from contextlab.dashboard.views.common import AuthenticatedHttpRequest, session_for_user
from contextlab.lib import summary_diff
from contextlab.lib.blocks import first_text
from contextlab.sessions import loss_records
from contextlab.sessions.models import AgentSession, SessionMessage, SummaryVersion

SIZE_BARS = 80  # versions drawn in the size chart (the newest)
SOURCE_CHARS = 200_000  # of one source message, for the support check


def _sources(session: AgentSession, version: SummaryVersion) -> list[str]:
    """What version K may draw on: the messages compacted into it, as ingested."""
    ids = list(version.compacted_ids or [])
    texts = []
    for content in SessionMessage.objects.filter(session=session, message_id__in=ids).order_by().values_list("content",
                                                                                                 flat=True):
        texts.append(first_text(content)[:SOURCE_CHARS])
    return texts


def _lost_at_compaction(session: AgentSession, version: SummaryVersion) -> dict[str, Any]:
    """The version's loss flags, each with the compacted message that held the identifier."""
    flags = list(version.lost_at_compaction or [])
    seqs = dict(SessionMessage.objects.filter(session=session, message_id__in={f["message_id"] for f in flags})
                .order_by().values_list("message_id", "seq"))
    return {"compaction_lost": [{**f, "seq": seqs.get(f["message_id"])} for f in flags],
            "compaction_lost_count": version.lost_count or 0, "compaction_loss": version.loss()}


@require_GET
@login_required
def session_summaries(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    # Versions written before the check existed (or restored from a bundle) are checked now, once.
    loss_records.record(session)
    sizes = list(session.summary_versions.order_by("version")
                 .annotate(chars=Length("text")).values("version", "turn", "chars", "compactor", "fallback"))
    context: dict[str, Any] = {"session": session, "versions": sizes, "current": None}
    if not sizes:
        return render(request, "sessions/summaries.html", context)
    raw = request.GET.get("v", "")
    number = int(raw) if raw.isdigit() else sizes[-1]["version"]
    current = session.summary_versions.filter(version=number).first()
    if current is None:
        raise Http404("No such summary version")
    # Any two versions: "from" picks the one to compare with (the previous one by default).
    raw_from = request.GET.get("from", "")
    if raw_from.isdigit() and int(raw_from) != number:
        previous = session.summary_versions.filter(version=int(raw_from)).first()
        if previous is None:
            raise Http404("No such summary version to compare with")
    else:
        previous = session.summary_versions.filter(version__lt=number).order_by("-version").first()
    old_text = previous.text if previous else ""
    sources = _sources(session, current) + ([old_text] if old_text else [])
    # What the new version names (the identifier index, offloaded outputs) still holds what it dropped.
    elsewhere = [text for _, text in loss_records.kept_texts(session, current.text)[0]]
    biggest = max(s["chars"] for s in sizes) or 1
    shown = sizes[-SIZE_BARS:]
    context.update({
        "current": current,
        "previous": previous,
        "compare_from": raw_from.isdigit() and previous is not None and int(raw_from) == previous.version,
        "sections": summary_diff.section_diffs(old_text, current.text, elsewhere),
        "lost": summary_diff.lost_identifiers(old_text, current.text, elsewhere) if previous else [],
        "unsupported": summary_diff.unsupported_sentences(current.text, sources),
        "source_count": len(current.compacted_ids or []),
        **_lost_at_compaction(session, current),
        "size": summary_diff.size_of(current.text),
        "previous_size": summary_diff.size_of(old_text) if previous else None,
        "delta_chars": len(current.text) - len(old_text),
        "bars": [{**s, "percent": round(100 * s["chars"] / biggest, 1)} for s in shown],
        "bars_clipped": len(sizes) - len(shown),
        "growth": round(current_chars / first_chars, 1)
        if (first_chars := sizes[0]["chars"]) and (current_chars := len(current.text)) else None,
    })
    if request.GET.get("format") == "md":
        response = HttpResponse(review_markdown(session, context), content_type="text/markdown; charset=utf-8")
        name = f"summary-v{current.version}" + (f"-from-v{previous.version}" if previous else "") + ".md"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response
    return render(request, "sessions/summaries.html", context)


def review_markdown(session: AgentSession, context: dict[str, Any]) -> str:
    """A summary version with its diff and its flags, as Markdown for a review outside ContextLab."""
    current: SummaryVersion = context["current"]
    previous: SummaryVersion | None = context["previous"]
    against = f" against v{previous.version}" if previous else ", the first version"
    lines = [f"# Summary v{current.version}{against}", "",
             f"Session: {session.display_title} · written at turn {current.turn} by {current.compactor}"
             + (" (fallback)" if current.fallback else ""), ""]
    loss = current.loss()
    if loss is not None:
        lines += ["## Lost at compaction", ""]
        if loss["lost"]:
            lines += [f"- {f['kind']} `{f['value']}` (message {f['message_id']})" for f in loss["lost"]]
        elif loss["nothing_lost"]:
            lines.append(f"Nothing lost: all {loss['checked']} identifiers are in the summary or a file it names.")
        else:
            lines.append(f"No loss found among the {loss['checked']} identifiers searched for.")
        lines += [f"- not checked: {u['count']} × {u['what']} ({u['why']})" for u in loss["unchecked"]]
        lines.append("")
    if previous is not None:
        lines += [f"## Identifiers gone since v{previous.version}", ""]
        lines += [f"- {i.kind} `{i.value}`" for i in context["lost"]] or ["(none)"]
        lines.append("")
    lines += ["## Diff", "", "Removed text is ~~struck through~~, added text is **bold**; a rewritten line is "
              "shown as the old line (-) and the new one (+).", ""]
    for section in context["sections"]:
        lines += [f"### {section.heading.lstrip('#').strip()} ({section.status})", ""]
        for row in section.rows:
            if row.kind == "lines":
                lines += ["- " + _md(row.old).strip(), "+ " + _md(row.new).strip()]
            else:
                lines += [part for part in _md(row.ops).split("\n") if part.strip()]
        lines.append("")
    lines += ["## Full text", "", "```markdown", current.text.rstrip("\n"), "```", ""]
    return "\n".join(lines)


def _md(ops: list[tuple[str, str]]) -> str:
    out = []
    for op, text in ops:
        body = text.strip()
        if op == "equal" or not body:
            out.append(text)
        else:
            mark = "~~" if op == "delete" else "**"
            lead, tail = text[:len(text) - len(text.lstrip())], text[len(text.rstrip()):]
            out.append(f"{lead}{mark}{body}{mark}{tail}")
    return "".join(out)
