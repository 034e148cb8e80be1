"""The policy interface: the manager calls a policy by name and imports none of them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from contextlab.engine.core.errors import InvalidProfile
from contextlab.engine.core.profile import Profile
from contextlab.engine.core.trace import TurnTrace
from contextlab.engine.hook import ContextManager
from contextlab.engine.policies.base import Policy, build_policy, register_policy, unregister_policy
from contextlab.engine.stages.split import SplitPreview
from tests.corpus import REPO
from tests.engine.sessions import assistant, user

ENGINE = REPO / "contextlab" / "engine"
POLICY_MODULES = {"contextlab.engine.policies.copaw.policy", "contextlab.engine.policies.eviction.policy",
                  "contextlab.engine.policies.contextlab.policy"}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at run time or for type checking."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_it_imports_no_policy_module_from_the_manager_or_the_interface() -> None:
    for name in ("hook.py", "policies/base.py", "policies/contextlab/flaw_notes.py", "policies/copaw/shape.py",
                 "stages/split.py", "stages/window_fit.py"):
        assert not imported_modules(ENGINE / name) & POLICY_MODULES, name


@pytest.mark.parametrize("name", ["contextlab", "copaw", "eviction"])
def test_it_builds_each_built_in_policy_by_its_name(name: str) -> None:
    policy = build_policy(name)
    assert policy.name == name and isinstance(policy, Policy)
    assert policy.exact_counts == (name != "copaw")


def test_it_refuses_an_unknown_policy_name() -> None:
    with pytest.raises(InvalidProfile):
        build_policy("no-such-policy")


class CountingPolicy(Policy[ContextManager]):
    """A policy of a few lines: it never compacts and counts its calls."""

    name = "contextlab"
    calls: list[str] = []

    def turn(self, manager: ContextManager, trace: TurnTrace) -> None:
        self.calls.append(f"turn {trace.turn}")
        trace.outcome = "no_action"

    def manual(self, manager: ContextManager, trace: TurnTrace, instruction: str | None) -> None:
        self.calls.append(f"manual {instruction}")
        trace.outcome = "nothing_to_compact"

    def preview(self, manager: ContextManager) -> SplitPreview:
        return SplitPreview([], manager.live_ids(), [], 0, manager.live_tokens, 0, ["never compacts"])


def test_it_runs_a_registered_policy_through_the_manager(tmp_path: Path) -> None:
    register_policy("contextlab", CountingPolicy)
    try:
        manager = ContextManager(Profile(max_input_length=8_000), tmp_path / "ws")
        manager.append([user("hello"), assistant("hi")])
        assert manager.prepare().trace.outcome == "no_action"
        assert manager.compact("keep it").trace.outcome == "nothing_to_compact"
        assert manager.preview_compaction().notes == ["never compacts"]
        assert CountingPolicy.calls == ["turn 1", "manual keep it"]
    finally:
        unregister_policy("contextlab")
    assert build_policy("contextlab").name == "contextlab" and not isinstance(build_policy("contextlab"), CountingPolicy)


@pytest.mark.parametrize("name", ["policies/contextlab/policy.py", "policies/copaw/policy.py",
                                  "policies/eviction/policy.py"])
def test_it_keeps_policy_modules_free_of_run_time_imports_of_the_manager(name: str) -> None:
    tree = ast.parse((ENGINE / name).read_text(encoding="utf-8"))
    run_time = {node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    assert "contextlab.engine.hook" not in run_time
