"""Structured context eviction (seed 003): an alternative to whole-history compaction.

The context is cut into information units (``units``), each scored by
relevance, recency and density (``scoring``); a strategy plans, per unit,
keep / summarize / externalize / drop under a soft and a hard limit, respecting
tool-call dependencies (``plan``); ``apply_plan`` turns the plan into a valid
message list, storing every original it replaces (``store``), so nothing is
lost. All of it is pure Python and deterministic.

    units = build_units(messages, [counter.count_message(m) for m in messages])
    plan = plan_eviction(units, strategy="hierarchical_quota", soft_limit=11_200,
                         hard_limit=16_000, target=8_800)
    messages, records = apply_plan(messages, plan, store=ExternalStore(workspace))
"""

from __future__ import annotations

from contextlab.engine.policies.eviction.apply import Summarizer, apply_plan, extractive_summary
from contextlab.engine.policies.eviction.plan import (
    DEFAULT_QUOTAS,
    DROP_BELOW_TOKENS,
    EXTERNALIZE_FROM_TOKENS,
    EvictionAction,
    EvictionPlan,
    EvictionStrategy,
    LayerQuotas,
    plan_eviction,
    summary_budget,
)
from contextlab.engine.policies.eviction.scoring import (
    DEFAULT_WEIGHTS,
    ScoreWeights,
    core_reasons,
    default_query,
    score_units,
)
from contextlab.engine.policies.eviction.store import ExternalStore
from contextlab.engine.policies.eviction.units import UNIT_TYPES, InformationUnit, UnitType, build_units

__all__ = [
    "DEFAULT_QUOTAS",
    "DEFAULT_WEIGHTS",
    "DROP_BELOW_TOKENS",
    "EXTERNALIZE_FROM_TOKENS",
    "UNIT_TYPES",
    "EvictionAction",
    "EvictionPlan",
    "EvictionStrategy",
    "ExternalStore",
    "InformationUnit",
    "LayerQuotas",
    "ScoreWeights",
    "Summarizer",
    "UnitType",
    "apply_plan",
    "build_units",
    "core_reasons",
    "default_query",
    "extractive_summary",
    "plan_eviction",
    "score_units",
    "summary_budget",
]
