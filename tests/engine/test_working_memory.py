"""Working memory, operation history and file-state tracking."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from contextlab.engine.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock
from contextlab.engine.importers import load_transcript
from contextlab.engine.memory.working import (
    FileTracker,
    OperationHistory,
    call_outcome,
    command_program,
    describe_call,
    extract_working_memory,
    shell_file_events,
    stale_reads,
)
from tests.corpus import corpus_path
from tests.engine.sessions import assistant, user

PONYC = "openhands/multi_swe_bench_output.ponylang__ponyc-4588.jsonl"
MARSHMALLOW = "swe-agent/replay__marshmallow-1867__function_calling_replace_from_source.traj"


def call(name: str, args: dict[str, Any], output: str, *, is_error: bool = False,
         ts: tuple[str, str] | None = None, inferred: bool = False) -> list[Message]:
    use = ToolUseBlock(id=f"c-{name}-{abs(hash((name, str(args), output))) % 10**8}", name=name, input=args)
    meta = {"timestamp_inferred": True} if inferred else {}
    head = Message(role="assistant", content=(use,), id=f"a-{use.id}", metadata=dict(meta))
    result = Message(role="tool", content=(ToolResultBlock(use.id, name, output, is_error),), id=f"t-{use.id}",
                     metadata=dict(meta))
    if ts is not None:
        head = dataclasses.replace(head, timestamp=ts[0])
        result = dataclasses.replace(result, timestamp=ts[1])
    return [head, result]


def outcome_of(name: str, args: dict[str, Any], output: str, *, is_error: bool = False) -> tuple[bool | None, str | None]:
    head, result = call(name, args, output, is_error=is_error)
    o = call_outcome(head.tool_uses[0], result.tool_results[0])
    return o.ok, o.error


# -- outcomes ------------------------------------------------------------------------------------


def test_it_reads_outcomes_from_flags_exit_codes_and_error_replies() -> None:
    assert outcome_of("bash", {"command": "make"}, "ok\n[The command completed with exit code 0.]")[0] is True
    ok, error = outcome_of("bash", {"command": "make"}, "make: *** [all] Error 2\n[The command completed with exit code 2.]")
    assert ok is False and error == "make: *** [all] Error 2"
    assert outcome_of("Bash", {"command": "ls"}, "Exit code 1\nls: x: No such file", is_error=True)[0] is False
    assert outcome_of("str_replace_editor", {"command": "str_replace"},
                      "ERROR:\nNo replacement was performed")[0] is False
    ok, error = outcome_of("bash", {"command": "python x.py"},
                           "Traceback (most recent call last):\n  File x\nValueError: boom")
    assert ok is False and error == "ValueError: boom"
    assert outcome_of("read_file", {"path": "log.txt"}, "line 1: an error happened yesterday")[0] is True
    # grep's exit code 1 means "no match": an answer, not a failure.
    assert outcome_of("execute_bash", {"command": "cd /w && grep -n iso f.c"},
                      "\n[The command completed with exit code 1.]")[0] is True
    head, _ = call("bash", {"command": "ls"}, "x")
    assert call_outcome(head.tool_uses[0], None).ok is None


def test_it_describes_calls_and_commands() -> None:
    def use(name: str, **args: object) -> ToolUseBlock:
        return ToolUseBlock(id="x", name=name, input=dict(args))

    assert describe_call(use("str_replace_editor", command="view", path="/a/b.c")) == "view /a/b.c"
    assert describe_call(use("bash", command="pytest -q\n  tests")) == "pytest -q tests"
    assert describe_call(use("write_todos", todos=[{}, {}])) == "2 todo item(s)"
    assert command_program("cd /w && export A=1 && make clean && make") == "make"
    assert command_program("git push --set-upstream origin main 2>&1") == "git push"
    assert command_program("source env.sh && mix dialyzer 2>&1 | tail -20") == "mix dialyzer"
    assert command_program("apt-get update && apt-get install -y llvm-dev") == "package-manager install"


# -- working memory --------------------------------------------------------------------------------


def test_it_extracts_goal_constraints_and_todo_subtasks() -> None:
    todos_v1 = ToolUseBlock("t1", "write_todos", {"todos": [
        {"content": "Write the parser", "status": "in_progress"}, {"content": "Add tests", "status": "pending"}]})
    todos_v2 = ToolUseBlock("t2", "write_todos", {"todos": [
        {"content": "Write the parser", "status": "completed"}, {"content": "Add tests", "status": "in_progress"},
        {"content": "Publish the package", "status": "cancelled"}]})
    messages = [
        user("Build a CSV parser in parser.py. Please use only the standard library. Never touch setup.cfg."),
        Message(role="assistant", content=(todos_v1,), id="a1"),
        Message(role="tool", content=(ToolResultBlock("t1", "write_todos", "ok"),), id="r1"),
        *call("bash", {"command": "python -m pytest"}, "1 failed\n[The command completed with exit code 1.]"),
        Message(role="assistant", content=(todos_v2,), id="a2"),
        Message(role="tool", content=(ToolResultBlock("t2", "write_todos", "ok"),), id="r2"),
        *call("bash", {"command": "python -m pytest -q"}, "3 passed\n[The command completed with exit code 0.]"),
        assistant("All done: the parser works and the tests pass."),
    ]
    memory = extract_working_memory(messages)
    assert memory.goal.startswith("Build a CSV parser in parser.py.")
    assert memory.constraints == ["Please use only the standard library.", "Never touch setup.cfg."]
    todo = [(s.title, s.status, s.evidence) for s in memory.subtasks if s.source == "todo"]
    assert todo == [("Write the parser", "done", ("a1", "a2")), ("Add tests", "open", ("a1", "a2")),
                    ("Publish the package", "failed", ("a2",))]
    [ask] = [s for s in memory.subtasks if s.source == "user"]
    assert ask.status == "done" and ask.evidence[0] == messages[0].id
    assert "[x] Write the parser" in memory.render()

    history = OperationHistory.from_messages(messages)
    assert [op.name for op in history.operations] == ["write_todos", "bash", "write_todos", "bash"]
    assert [op.ok for op in history.operations] == [True, False, True, True]
    assert [op.subtask for op in history.operations] == ["Write the parser", "Write the parser", "Add tests",
                                                         "Add tests"]
    [failed] = history.failures()
    assert failed.arguments == "python -m pytest" and failed.exit_code == 1
    assert history.by_subtask("Add tests")[-1].status == "ok"


def test_it_takes_subtasks_from_a_numbered_plan_and_user_asks() -> None:
    messages = [
        user("Speed up the import job."),
        assistant("Here is my plan:\n1. Profile the job\n2. Batch the inserts\n3. Add an index"),
        *call("bash", {"command": "python profile.py"}, "Error: database locked"),
        user("Also, write a short report."),
    ]
    memory = extract_working_memory(messages)
    plan = [s.title for s in memory.subtasks if s.source == "plan"]
    assert plan == ["Profile the job", "Batch the inserts", "Add an index"]
    asks = [(s.title, s.status) for s in memory.subtasks if s.source == "user"]
    assert asks == [("Speed up the import job.", "failed"), ("Also, write a short report.", "open")]


def test_it_records_durations_only_for_real_timestamps() -> None:
    real = call("bash", {"command": "sleep 2"}, "done", ts=("2026-03-20T10:00:00.000Z", "2026-03-20T10:00:02.500Z"))
    invented = call("bash", {"command": "sleep 1"}, "done", inferred=True)
    ops = OperationHistory.from_messages([user("wait"), *real, *invented]).operations
    assert ops[0].duration_ms == pytest.approx(2500.0)
    assert ops[1].duration_ms is None


# -- file state ------------------------------------------------------------------------------------


def test_it_reads_files_touched_by_shell_commands() -> None:
    events, cwd = shell_file_events(
        "cd /repo && cat src/a.py | head -n 5 && sed -n '1,20p' b.py && sed -i 's/x/y/' c.py "
        "&& echo hi > out.txt 2>/dev/null && tee -a log.txt < in.txt && rm -f old.py", None)
    assert cwd == "/repo"
    assert events == [("read", "/repo/src/a.py"), ("read", "/repo/b.py"), ("write", "/repo/c.py"),
                      ("write", "/repo/out.txt"), ("write", "/repo/log.txt"), ("write", "/repo/old.py")]


def test_it_flags_a_read_whose_file_was_written_later() -> None:
    view = call("str_replace_editor", {"command": "view", "path": "/w/app.py"}, "1 print('a')")
    failed_edit = call("str_replace_editor", {"command": "str_replace", "path": "/w/app.py"},
                       "ERROR:\nNo replacement was performed")
    other = call("Read", {"file_path": "/w/other.py"}, "x = 1")
    edit = call("Edit", {"file_path": "/w/app.py", "old_string": "a", "new_string": "b"}, "The file was updated")
    fresh = call("read_file", {"path": "/w/app.py"}, "print('b')")
    messages = [user("fix app.py"), *view, *failed_edit, *other, *edit, *fresh]
    assert stale_reads(messages) == [
        # The failed edit changed nothing; the successful Edit made the first view stale.
        type(stale_reads(messages)[0])(view[1].id, "/w/app.py", edit[0].id, "str_replace_editor", "Edit"),
    ]
    tracker = FileTracker.from_messages(messages)
    assert [e.path for e in tracker.reads()] == ["/w/app.py", "/w/other.py", "/w/app.py"]
    assert [e.ok for e in tracker.writes()] == [False, True]


def test_it_matches_relative_paths_against_absolute_ones() -> None:
    read = call("bash", {"command": "cd /repo && cat lib/util.py"}, "def f(): pass")
    write = call("write_file", {"path": "lib/util.py", "content": "def g(): pass"}, "written")
    [stale] = stale_reads([user("refactor"), *read, *write])
    assert stale.path == "/repo/lib/util.py" and stale.written_by_message_id == write[0].id


@pytest.mark.corpus
def test_it_finds_stale_reads_in_the_openhands_ponyc_session() -> None:
    messages = load_transcript(corpus_path(PONYC)).messages
    stale = stale_reads(messages)
    match_c = "/workspace/ponylang__ponyc__0.1/src/libponyc/expr/match.c"
    # Five views of match.c were followed by a successful edit (the insert at 29,
    # the str_replace at 43, the insert at 56); the view at 65, after the last
    # write (sed -i at 62), is current, and the Makefile is never written.
    assert [(s.read_message_id, s.written_by_message_id) for s in stale] == [
        ("14", "29"), ("20", "29"), ("26", "29"), ("38", "43"), ("50", "56")]
    assert {s.path for s in stale} == {match_c}
    reads = FileTracker.from_messages(messages).reads()
    assert {r.result_message_id for r in reads} - {s.read_message_id for s in stale} == {"65", "73", "75"}
    history = OperationHistory.from_messages(messages)
    assert len(history.operations) == 49
    assert any("Unable to locate package llvm-dev" in (op.error or "") for op in history.failures())


@pytest.mark.corpus
def test_it_finds_the_stale_read_in_the_swe_agent_marshmallow_session() -> None:
    # SWE-agent's `edit` names no path: it edits the file `open` showed, which
    # the tracker follows through the "(Open file: …)" line of each observation.
    messages = load_transcript(corpus_path(MARSHMALLOW)).messages
    [stale] = stale_reads(messages)
    assert (stale.read_message_id, stale.written_by_message_id) == ("swe_agent-19", "swe_agent-20")
    assert stale.path == "/testbed/src/marshmallow/fields.py"
    assert (stale.read_tool, stale.write_tool) == ("open", "edit")


def test_it_ignores_messages_that_are_not_requests() -> None:
    summary = Message(role="user", content=(TextBlock("[summary] never do X"),), id="s", name="summary")
    memory = extract_working_memory([summary, user("Do Y, never Z.")])
    assert memory.goal == "Do Y, never Z." and memory.constraints == ["Do Y, never Z."]
