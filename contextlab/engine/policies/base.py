"""The interface between the context manager and a context policy.

``ContextManager`` (``hook.py``) owns the state: live messages, summary,
archive, offloaded files, counts. A policy owns the decisions: what the hook
does before an LLM call (``turn``), what ``/compact`` does (``manual``), which
split a manual compaction would make (``preview``) and how the summary is worded
in the payload (``summary_text``). The manager looks a policy up by the name in
the profile; a new policy is one module with a ``Policy`` subclass, named in
``_BUILT_IN`` or added with ``register_policy``. The manager never imports a
policy module itself, so a policy may import any part of the engine.

This module does not import the manager either, not even for its types: a
policy is generic in the manager it works on (``CopawPolicy(Policy[ContextManager])``),
and the base reads only what ``Manager`` lists. So the arrows run one way:
``hook`` -> ``policy`` <- ``policy_*`` -> ``hook``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from contextlab.engine.core.errors import InvalidProfile
from contextlab.engine.core.messages import Message
from contextlab.engine.core.trace import TurnTrace
from contextlab.engine.stages.split import SplitPreview
from contextlab.engine.stages.summary.prompts import wrap_summary


class Manager(Protocol):
    """What the base policy reads of the manager that runs it (``hook.ContextManager``)."""

    messages: list[Message]

    def archive_hint(self) -> str: ...

    def language_for_summary(self, messages: Sequence[Message]) -> str: ...


ManagerT = TypeVar("ManagerT", bound=Manager)


class Policy(Generic[ManagerT]):
    """Base of every policy; subclasses override ``turn`` at least."""

    name: ClassVar[str] = ""
    # Decide with exact tokenizer counts. Only a faithful reproduction of a
    # system that estimated (CoPaw) sets this False, and its trace says so.
    exact_counts: ClassVar[bool] = True
    # Cut oversized tool results as they enter the context (stage 1).
    cuts_on_ingest: ClassVar[bool] = False

    def turn(self, manager: ManagerT, trace: TurnTrace) -> None:
        raise NotImplementedError

    def manual(self, manager: ManagerT, trace: TurnTrace, instruction: str | None) -> None:
        raise NotImplementedError

    def preview(self, manager: ManagerT) -> SplitPreview:
        raise NotImplementedError

    def summary_text(self, manager: ManagerT, summary: str) -> str:
        return wrap_summary(summary, archive_hint=manager.archive_hint(),
                            language=manager.language_for_summary(manager.messages[-20:]))


# Built-in policies by name -> "module:class", imported on first use.
_BUILT_IN: dict[str, str] = {
    "contextlab": "contextlab.engine.policies.contextlab.policy:ContextlabPolicy",
    "copaw": "contextlab.engine.policies.copaw.policy:CopawPolicy",
    "eviction": "contextlab.engine.policies.eviction.policy:EvictionPolicy",
}
_REGISTERED: dict[str, Callable[[], Policy[Any]]] = {}


def register_policy(name: str, factory: Callable[[], Policy[Any]]) -> None:
    """Make ``factory`` the policy of that name (a plug-in or a test)."""
    _REGISTERED[name] = factory


def unregister_policy(name: str) -> None:
    _REGISTERED.pop(name, None)


def policy_names() -> list[str]:
    return sorted({*_BUILT_IN, *_REGISTERED})


def build_policy(name: str) -> Policy[Any]:
    if name in _REGISTERED:
        return _REGISTERED[name]()
    target = _BUILT_IN.get(name)
    if target is None:
        raise InvalidProfile(f"unknown policy {name!r}; use one of {', '.join(policy_names())}", field="policy")
    module_name, _, class_name = target.partition(":")
    policy_class: type[Policy[Any]] = getattr(importlib.import_module(module_name), class_name)
    return policy_class()
