"""Importing a real CoPaw 1.0.2 workspace: it must agree with what happened (analysis.json)."""

from __future__ import annotations

import json
import shutil
import stat
import zipfile
from pathlib import Path
from typing import Any

import pytest

from contextlab.cli import main
from contextlab.engine.core.errors import MalformedInput
from contextlab.engine.importers.copaw_workspace import (
    REPORT_KEYS,
    UnpackBudget,
    import_copaw_workspace,
    safe_extract,
)
from tests.corpus import COPAW_RUN

WORKSPACE = COPAW_RUN / "workspace-sample"
REQUESTS = COPAW_RUN / "requests"


@pytest.fixture(scope="module")
def analysis() -> dict[str, Any]:
    if not WORKSPACE.is_dir():
        pytest.skip(f"the CoPaw sample is missing at {COPAW_RUN}")
    return json.loads((COPAW_RUN / "analysis.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def report(analysis: dict[str, Any]) -> dict[str, Any]:
    return import_copaw_workspace(WORKSPACE, REQUESTS)[1]


def test_it_turns_the_running_config_into_a_copaw_profile(report: dict[str, Any]) -> None:
    assert report["profile"] == {
        "policy": "copaw", "max_input_length": 12000, "compact_ratio": 0.75, "reserve_ratio": 0.15,
        "estimate_divisor": 4.0, "recent_n": 2, "old_max_bytes": 1000, "recent_max_bytes": 5000,
        "retention_days": 5, "summary_language": "en"}


def test_it_agrees_with_the_run_on_messages_and_compactions(report: dict[str, Any],
                                                            analysis: dict[str, Any]) -> None:
    assert report["live_messages"] == analysis["session_live_messages"]
    assert report["archived_messages"] == sum(analysis["dialog_files"].values())
    assert report["dialog_lines"] == {f"dialog/{k}": v for k, v in analysis["dialog_files"].items()}
    assert report["compactions"] == 4 and report["manual_compactions"] == 1
    assert report["invalid_compactions"] == len(analysis["compact_invalid_files"]) == 0
    assert report["summary_erased"] == 0
    detail = report["compaction_detail"]
    assert [c["seq"] for c in detail] == [w["from_seq"] for w in analysis["summary_wrapper_changes"]]
    assert [c["trigger"] for c in detail] == ["auto", "auto", "manual", "auto"]
    assert [len(c["archived"]) for c in detail] == [27, 33, 25, 16]
    assert detail[1]["archived"][0] == "dialog/2026-12-02.jsonl line 28"
    assert len(report["summary"]) == analysis["session_summary_chars"]
    assert [s["version"] for s in report["summaries"]] == [1, 2, 3, 4]


def test_it_finds_every_truncated_tool_result_with_its_sizes(report: dict[str, Any],
                                                              analysis: dict[str, Any]) -> None:
    assert report["tool_results"] == analysis["tool_results_total"]
    assert report["truncated_tool_results"] == analysis["tool_results_shrunk_any_way"]
    assert report["tool_result_files"] == analysis["tool_result_files"]
    last_size = {row["id"]: int(row["trajectory"][-1].split(":")[1].split("B")[0]) for row in analysis["tool_rows"]}
    marked = {row["id"]: row["trajectory"][-1].endswith("+marker") for row in analysis["tool_rows"]}
    for row in report["tool_result_detail"]:
        # What the workspace holds is the last version the agent sent.
        assert row["bytes"] == last_size[row["id"]], row["id"]
        assert row["notice"] == marked[row["id"]], row["id"]
    silent = [r["id"] for r in report["tool_result_detail"] if r["silent_cut"]]
    assert silent == ["call_0014_0", "call_0034_0"]


def test_it_names_the_known_copaw_losses(report: dict[str, Any]) -> None:
    kinds = [loss["kind"] for loss in report["losses"]]
    assert kinds.count("silent_single_line_cut") == 2
    assert kinds.count("turn_split") == 1
    split = next(loss for loss in report["losses"] if loss["kind"] == "turn_split")
    assert split["turn"] == 17 and "request 40" in split["detail"]
    archived_cuts = [loss for loss in report["losses"] if loss["kind"] == "archive_truncated_text"]
    assert archived_cuts and all("dialog/2026-12-02.jsonl line" in loss["detail"] for loss in archived_cuts)
    assert any("tool_result/" in loss["detail"] and "bytes) is only in" in loss["detail"] for loss in archived_cuts)


def test_it_reads_the_same_from_a_zip(tmp_path: Path, report: dict[str, Any]) -> None:
    archive = tmp_path / "ws.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in WORKSPACE.rglob("*"):
            if path.is_file():
                zf.write(path, f"default/{path.relative_to(WORKSPACE)}")
    requests = tmp_path / "requests.zip"
    shutil.make_archive(str(requests.with_suffix("")), "zip", COPAW_RUN, "requests")
    zipped = import_copaw_workspace(archive, requests)[1]
    assert {k: zipped[k] for k in REPORT_KEYS} == {k: report[k] for k in REPORT_KEYS}


def test_it_never_writes_outside_the_folder_from_a_hostile_zip(tmp_path: Path) -> None:
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("../escaped.txt", "x")
        zf.writestr("/abs.txt", "x")
        link = zipfile.ZipInfo("link")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "/etc/passwd")
        zf.writestr("ok/agent.json", "{}")
    target = tmp_path / "out"
    target.mkdir()
    skipped = safe_extract(archive, target)
    assert len(skipped) == 3
    assert not (tmp_path / "escaped.txt").exists()
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == ["ok/agent.json"]


def test_it_counts_the_bytes_it_unpacks_not_the_headers(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("dialog/big.jsonl", b"\n" * 200_000)
    with pytest.raises(MalformedInput, match="dialog/big.jsonl unpacks to more than 100,000 bytes .the rule."):
        safe_extract(archive, tmp_path / "out", budget=UnpackBudget(member_bytes=100_000, member_text="the rule"))
    with pytest.raises(MalformedInput, match="members"):
        safe_extract(archive, tmp_path / "out2", max_members=0)


def test_it_refuses_a_folder_that_is_not_a_workspace(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(MalformedInput, match="not a CoPaw workspace"):
        import_copaw_workspace(tmp_path)


def test_it_prints_the_report_keys_from_the_command_line(capsys: pytest.CaptureFixture[str],
                                                         analysis: dict[str, Any]) -> None:
    assert main(["import-copaw", str(WORKSPACE), "--requests", str(REQUESTS), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert list(printed)[:len(REPORT_KEYS)] == list(REPORT_KEYS)
    assert all(set(loss) == {"kind", "turn", "detail"} for loss in printed["losses"])
    assert printed["compactions"] == 4
    assert main(["import-copaw", str(WORKSPACE)]) == 0
    text = capsys.readouterr().out
    assert "18 live, 101 archived" in text and "without the request log" in text


def test_it_reports_a_request_folder_from_the_command_line(capsys: pytest.CaptureFixture[str],
                                                           analysis: dict[str, Any]) -> None:
    assert main(["import-requests", str(REQUESTS), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["requests"] == analysis["requests"]
    [conversation] = printed["conversations"]
    assert [c["seq"] for c in conversation["compactions"]] == [18, 40, 55, 69]
    assert len(conversation["truncated_tool_results"]) == analysis["tool_results_shrunk_any_way"]
    assert main(["import-requests", str(REQUESTS)]) == 0
    assert "request 55 (turn 23): manual compaction" in capsys.readouterr().out


def test_it_counts_an_invalid_compaction_and_names_the_loss(tmp_path: Path, analysis: dict[str, Any]) -> None:
    workspace = tmp_path / "default"
    shutil.copytree(WORKSPACE, workspace)
    for path in workspace.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (workspace / "compact_invalid_0a1b2c3d.json").write_text(json.dumps({
        "user_message": "# conversation\n...", "history_compact": "no headings here", "is_valid": False}, indent=2))
    report = import_copaw_workspace(workspace)[1]
    assert report["invalid_compactions"] == 1 and report["summary_erased"] == 1
    assert report["compactions"] == 2  # the invalid one and the evidence of at least one that worked
    [loss] = [x for x in report["losses"] if x["kind"] == "failed_summary_drops_messages"]
    assert "compact_invalid_0a1b2c3d.json" in loss["detail"]
