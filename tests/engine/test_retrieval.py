"""Search across a workspace's archive, externalized units, offloaded output and memory."""

from __future__ import annotations

from pathlib import Path

from contextlab.engine.core.messages import Message, check_sequence
from contextlab.engine.memory.retrieval import (
    Bm25,
    Hit,
    recollection_message,
    search_workspace,
    term_counts,
    terms,
)
from contextlab.engine.policies.eviction import ExternalStore, build_units
from contextlab.engine.policies.eviction.store import recall
from contextlab.engine.stages.archive import DialogArchive
from contextlab.engine.stages.truncation import OffloadStore
from tests.engine.sessions import assistant, log_lines, tool_round, user


def build_workspace(root: Path) -> dict[str, str]:
    archive = DialogArchive(root)
    old_ask = user("Please migrate the billing service to PostgreSQL 16.")
    old_answer = assistant("I updated docker-compose.yml to postgres:16 and ran the migrations.")
    archive.append([(old_ask, {}), (old_answer, {})])
    head, result = tool_round("bash", {"command": "pytest tests/test_invoices.py"},
                              ["FAILED tests/test_invoices.py::test_totals - KeyError: 'vat_rate'\n"])
    key = ExternalStore(root).put(build_units([head, result], [10, 20]), [head, result])
    offload = OffloadStore(root)
    offloaded = offload.save(log_lines(200) + "linker error: undefined reference to `ssl_ctx_new`\n" + log_lines(50))
    (root / "memory").mkdir()
    (root / "memory" / "2026-03-20.md").write_text("# 2026-03-20\n\n## Preferences\n- [09:00] I prefer pnpm over npm\n",
                                                  encoding="utf-8")
    return {"ask": old_ask.id, "answer": old_answer.id, "result": result.id, "key": key,
            "offloaded": offloaded.relative}


def test_it_finds_each_kind_of_archived_text(tmp_path: Path) -> None:
    ids = build_workspace(tmp_path)
    [top, *_] = search_workspace(tmp_path, "PostgreSQL migration")
    assert (top.kind, top.message_id) == ("dialog", ids["ask"])
    assert top.location.startswith("dialog/") and top.location.endswith(":1")

    ext = search_workspace(tmp_path, "vat_rate KeyError")[0]
    assert (ext.kind, ext.message_id, ext.location) == ("externalized", ids["result"], f"externalized/{ids['key']}.json")
    assert "vat_rate" in ext.snippet

    linker = search_workspace(tmp_path, "undefined reference ssl_ctx_new")[0]
    assert linker.kind == "tool_result" and linker.location.startswith(ids["offloaded"] + ":")
    start = int(linker.location.rsplit(":", 1)[1])
    assert start <= 201 < start + 40  # the window of lines that holds the hit

    memory = search_workspace(tmp_path, "pnpm")[0]
    assert memory.kind == "memory" and memory.location == "memory/2026-03-20.md:4"


def test_it_ranks_a_verbatim_match_first_and_respects_the_limit(tmp_path: Path) -> None:
    build_workspace(tmp_path)
    hits = search_workspace(tmp_path, "docker-compose.yml")
    assert hits[0].kind == "dialog" and "docker-compose.yml" in hits[0].snippet
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert len(search_workspace(tmp_path, "line compiling", limit=3)) == 3
    assert search_workspace(tmp_path, "   ") == []
    assert search_workspace(tmp_path / "missing", "anything") == []


def test_it_recalls_an_externalized_unit(tmp_path: Path) -> None:
    head, result = tool_round("read_file", {"path": "a.py"}, ["print('hi')\n"])
    key = ExternalStore(tmp_path).put(build_units([head, result], [5, 5]), [head, result])
    assert recall(tmp_path, key) == [head, result]


def test_it_matches_identifier_parts_and_chinese_bigrams() -> None:
    counts = term_counts("Edited src/app/models.py and parse_args in TimeDelta")
    assert {"src/app/models.py", "models", "parse_args", "args", "timedelta", "delta"} <= set(counts)
    assert "the" not in terms("the and of models")
    assert {"外卖", "大战"} <= set(term_counts("如何看待外卖大战"))


def test_it_weighs_rare_terms_higher() -> None:
    docs = [term_counts(t) for t in ("alpha beta", "alpha gamma", "alpha delta")]
    scores = Bm25(docs).scores(["alpha", "gamma"])
    assert scores[1] > scores[0] == scores[2] > 0


def test_it_builds_a_marked_recollection_message(tmp_path: Path) -> None:
    build_workspace(tmp_path)
    hits = search_workspace(tmp_path, "vat_rate")
    msg = recollection_message(hits, query="vat_rate")
    text = msg.plain_text()
    assert msg.role == "user" and msg.name == "recollection"
    assert text.startswith('[recollection from the archive for "vat_rate": recalled material, not a new request]')
    assert text.rstrip().endswith("[end of recollection]")
    assert hits[0].location in text
    assert msg.metadata["recollection"]["sources"][0]["location"] == hits[0].location
    # Deterministic id, and the message can follow a user turn in a valid sequence.
    assert recollection_message(hits, query="vat_rate").id == msg.id
    check_sequence([user("what broke?"), msg], allow_pending_tail=False)
    units = build_units([msg], [10])
    assert units[0].type == "recollection" and not units[0].user_turn


def test_it_builds_a_recollection_from_messages() -> None:
    big = Message.text("assistant", "x" * 5_000, id="m1")
    msg = recollection_message([user("the earlier plan"), big], query="plan")
    text = msg.plain_text()
    assert "(user, message " in text and "more characters]" in text
    empty = recollection_message([], query="nothing")
    assert "nothing matching was found" in empty.plain_text()
    assert isinstance(Hit("dialog", "dialog/x.jsonl:1", None, "s", 1.0).to_dict()["score"], float)
