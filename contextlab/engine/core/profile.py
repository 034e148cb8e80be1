"""Agent profiles: every knob of the context manager, with bounds.

Defaults come from the design card (seed 001): a 128,000-token window, compaction
at 70 % (89,600 tokens), a 10 % reserve (12,800 tokens) kept from the tail, the
newest 3 tool results at 50,000 bytes and older ones at 3,000 bytes, offloaded
outputs kept 30 days.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import zoneinfo
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from contextlab.engine.core.errors import InvalidProfile
from contextlab.engine.core.unicode import encodable

Policy = Literal["contextlab", "copaw", "eviction"]
POLICIES: tuple[str, ...] = ("contextlab", "copaw", "eviction")
EVICTION_STRATEGIES: tuple[str, ...] = ("lowest_score_first", "sliding_window", "hierarchical_quota")
LANGUAGES: tuple[str, ...] = ("en", "zh", "auto")
COMPACTORS: tuple[str, ...] = ("extractive", "openai")
# How the openai compactor may constrain the summary model's reply (compactors/constrained.py).
CONSTRAINED_OUTPUTS: tuple[str, ...] = ("off", "grammar", "json_schema")
TOKENIZERS: tuple[str, ...] = ("o200k_base", "cl100k_base")

# Bytes of slack before a tool result is cut. CoPaw uses 100 so that an output
# barely over the limit is not offloaded for a handful of bytes; we keep it.
TRUNCATION_SLACK_BYTES = 100


@dataclass(frozen=True)
class Bound:
    low: float
    high: float
    help: str


# One place for the bounds, so forms, the admin and the engine agree.
BOUNDS: dict[str, Bound] = {
    "max_input_length": Bound(1_000, 10_000_000, "context window in tokens"),
    "compact_ratio": Bound(0.1, 0.95, "compaction threshold as a share of the window"),
    "reserve_ratio": Bound(0.01, 0.5, "tokens kept from the tail, as a share of the window"),
    "recent_n": Bound(1, 100, "the newest N tool results keep the large byte limit"),
    "recent_max_bytes": Bound(500, 10_000_000, "stage-1 limit, and the limit inside recent_n"),
    "old_max_bytes": Bound(100, 10_000_000, "stage-2 limit once a result slides out of recent_n"),
    "markdown_recent_max_bytes": Bound(500, 10_000_000, "stage-1 limit for Markdown files"),
    "markdown_old_max_bytes": Bound(100, 10_000_000, "stage-2 limit for Markdown files"),
    "retention_days": Bound(1, 3650, "days an offloaded full output is kept"),
    "estimate_divisor": Bound(2.0, 5.0, "bytes per token of CoPaw's estimator"),
    "compaction_timeout": Bound(1.0, 600.0, "seconds before a summary call is abandoned"),
    "compaction_retries": Bound(0, 5, "extra attempts after a failed summary call"),
    "max_message_bytes": Bound(1_000, 64 * 1024 * 1024, "largest message accepted, in UTF-8 bytes"),
    "eviction_target_ratio": Bound(0.05, 0.9, "eviction frees the context down to this share of the window"),
    "eviction_weight_relevance": Bound(0.0, 1.0, "weight of relevance to the current request in a unit's score"),
    "eviction_weight_recency": Bound(0.0, 1.0, "weight of recency in a unit's score"),
    "eviction_weight_density": Bound(0.0, 1.0, "weight of information density in a unit's score"),
}


# How far the eviction weights' sum may be from 1 (a form rounds each to a hundredth).
WEIGHT_SUM_TOLERANCE = 0.01
WHOLE_NUMBER_KNOBS = ("max_input_length", "recent_n", "recent_max_bytes", "old_max_bytes",
                      "markdown_recent_max_bytes", "markdown_old_max_bytes", "retention_days",
                      "compaction_retries", "max_message_bytes")


def bound_problem(name: str, value: Any) -> InvalidProfile | None:
    """The one message for a bounded knob's value, or None: the real bound and what the knob is for."""
    bound = BOUNDS[name]
    whole = name in WHOLE_NUMBER_KNOBS
    kind = "a whole number" if whole else "a number"
    rule = f"{name} must be {kind} from {_fmt(bound.low)} to {_fmt(bound.high)} ({bound.help})"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return InvalidProfile(rule, field=name)
    if whole and not isinstance(value, int):
        return InvalidProfile(f"{rule}; {value:g} is not whole", field=name)
    if not bound.low <= value <= bound.high:
        return InvalidProfile(f"{rule}; {value:g} is {'below' if value < bound.low else 'above'} that",
                              field=name)
    return None


# The knobs that are text; each must be a string a database and a page can hold.
TEXT_KNOBS: tuple[str, ...] = ("name", "policy", "tokenizer", "compactor", "compaction_base_url", "compaction_model",
                               "compaction_api_key_env", "summary_language", "timezone", "eviction_strategy")


@functools.cache
def known_timezones() -> frozenset[str]:
    """The IANA zone names this machine knows ("UTC" always)."""
    return frozenset(zoneinfo.available_timezones()) | {"UTC"}


@dataclass(frozen=True)
class Profile:
    """The knobs of one agent. Immutable; use ``replace`` to derive a variant."""

    name: str = "default"
    policy: Policy = "contextlab"
    max_input_length: int = 128_000
    compact_ratio: float = 0.7
    reserve_ratio: float = 0.1
    recent_n: int = 3
    recent_max_bytes: int = 50_000
    old_max_bytes: int = 3_000
    # Markdown files (skills, rules, plans) carry instructions that lose their
    # meaning when cut in the middle, so they get limits about 3x larger.
    markdown_recent_max_bytes: int = 150_000
    markdown_old_max_bytes: int = 10_000
    retention_days: int = 30
    tokenizer: str = "o200k_base"
    # CoPaw's byte estimator; the `copaw` policy counts with it, and the trace
    # shows it beside the exact count under both policies.
    estimate_divisor: float = 4.0
    compactor: str = "extractive"
    compaction_base_url: str = ""
    compaction_model: str = ""
    compaction_api_key_env: str = "OPENAI_API_KEY"
    compaction_timeout: float = 60.0
    compaction_retries: int = 2
    # Off by default: the six headings forced by the server's constrained decoding
    # ("grammar": llama.cpp GBNF; "json_schema": response_format). Structure only, not quality.
    compaction_constrained_output: str = "off"
    summary_language: str = "auto"
    exempt_tool_names: tuple[str, ...] = ()
    browser_tool_names: tuple[str, ...] = ("browser_use", "browser", "browser_navigate", "browser_snapshot")
    read_file_tool_names: tuple[str, ...] = ("read_file", "Read", "view", "open_file")
    timezone: str = "UTC"
    max_message_bytes: int = 16 * 1024 * 1024
    # The `eviction` policy (seed 003): instead of summarising the whole head
    # of the history, score information units and evict the weakest. It starts
    # above the compaction threshold (soft limit), must end under the window
    # (hard limit) and frees down to this target.
    eviction_strategy: str = "lowest_score_first"
    eviction_target_ratio: float = 0.55
    eviction_weight_relevance: float = 0.45
    eviction_weight_recency: float = 0.35
    eviction_weight_density: float = 0.20
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def problems_of(cls, **values: Any) -> list[InvalidProfile]:
        """Every problem of the profile ``values`` would make, without making it (a form shows them all)."""
        draft = object.__new__(cls)
        defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
                    for f in dataclasses.fields(cls) if f.init}
        for name, value in {**defaults, **values}.items():
            object.__setattr__(draft, name, value)
        return draft.problems()

    # -- derived numbers ---------------------------------------------------------
    @property
    def threshold(self) -> int:
        return int(self.max_input_length * self.compact_ratio)

    @property
    def reserve(self) -> int:
        return int(self.max_input_length * self.reserve_ratio)

    def derived(self) -> dict[str, int]:
        return {"threshold": self.threshold, "reserve": self.reserve, "window": self.max_input_length}

    # -- validation --------------------------------------------------------------
    def validate(self) -> None:
        """Raise the first problem of ``problems`` (forms show them all at once)."""
        for problem in self.problems():
            raise problem

    def problems(self) -> list[InvalidProfile]:
        """Every problem of the profile, at most one per field, each stating the rule and why.

        A combination (reserve below threshold, stage-2 limit below stage-1...) is
        judged only when the knobs it combines are each within their bounds: a
        knob out of bounds is one message, not two.
        """
        found: dict[str, InvalidProfile] = {}

        def add(problem: InvalidProfile) -> None:
            found.setdefault(problem.field or "profile", problem)

        for name in TEXT_KNOBS:
            value = getattr(self, name)
            # A client's JSON can carry any type here; str(True) must not become a setting.
            if not isinstance(value, str):
                add(InvalidProfile(f"{name} must be a string", field=name))
            elif "\x00" in value or not encodable(value):
                add(InvalidProfile(f"{name} holds a character that cannot be stored", field=name))
        if "timezone" not in found and self.timezone not in known_timezones():
            add(InvalidProfile(f"unknown timezone {self.timezone!r}; use an IANA name such as Europe/Paris or UTC",
                               field="timezone"))
        if "policy" not in found and self.policy not in POLICIES:
            add(InvalidProfile(f"unknown policy {self.policy!r}; use one of {', '.join(POLICIES)}", field="policy"))
        if "summary_language" not in found and self.summary_language not in LANGUAGES:
            add(InvalidProfile(f"unknown summary language {self.summary_language!r}; use en, zh or auto",
                               field="summary_language"))
        if "eviction_strategy" not in found and self.eviction_strategy not in EVICTION_STRATEGIES:
            add(InvalidProfile(
                f"unknown eviction strategy {self.eviction_strategy!r}; use one of {', '.join(EVICTION_STRATEGIES)}",
                field="eviction_strategy"))
        if "compactor" not in found and self.compactor not in COMPACTORS:
            add(InvalidProfile(f"unknown compactor {self.compactor!r}; use extractive or openai", field="compactor"))
        if self.compaction_constrained_output not in CONSTRAINED_OUTPUTS:
            add(InvalidProfile(
                f"unknown constrained output {self.compaction_constrained_output!r}; "
                f"use one of {', '.join(CONSTRAINED_OUTPUTS)}",
                field="compaction_constrained_output"))
        for name in BOUNDS:
            problem = bound_problem(name, getattr(self, name))
            if problem is not None:
                add(problem)
        if found.keys() & {"max_input_length", "compact_ratio", "reserve_ratio"}:
            return list(found.values())  # the combinations below need the three
        if self.reserve >= self.threshold:
            add(InvalidProfile(
                f"the reserve ({self.reserve:,} tokens) must be smaller than the compaction threshold "
                f"({self.threshold:,} tokens): it is what a compaction keeps, so it must fit under the line "
                "that starts one; lower reserve_ratio or raise compact_ratio",
                field="reserve_ratio"))
        elif self.reserve < 1:
            add(InvalidProfile("the reserve rounds down to 0 tokens: a compaction would keep no message; "
                               "raise reserve_ratio", field="reserve_ratio"))
        if not found.keys() & {"old_max_bytes", "recent_max_bytes"} and self.old_max_bytes > self.recent_max_bytes:
            add(InvalidProfile(
                f"old_max_bytes ({self.old_max_bytes:,}) must not exceed recent_max_bytes "
                f"({self.recent_max_bytes:,}): stage 2 only ever cuts further",
                field="old_max_bytes"))
        if (not found.keys() & {"markdown_old_max_bytes", "markdown_recent_max_bytes"}
                and self.markdown_old_max_bytes > self.markdown_recent_max_bytes):
            add(InvalidProfile(
                f"markdown_old_max_bytes ({self.markdown_old_max_bytes:,}) must not exceed markdown_recent_max_bytes "
                f"({self.markdown_recent_max_bytes:,}): stage 2 only ever cuts further",
                field="markdown_old_max_bytes"))
        if ("eviction_target_ratio" not in found and self.policy == "eviction"
                and self.eviction_target_ratio >= self.compact_ratio):
            add(InvalidProfile(
                f"the eviction target ({self.eviction_target_ratio:g} of the window) must be below the "
                f"compaction threshold ratio ({self.compact_ratio:g}): eviction starts there and frees down to it",
                field="eviction_target_ratio"))
        weights = ("eviction_weight_relevance", "eviction_weight_recency", "eviction_weight_density")
        if not found.keys() & set(weights):
            total = self.eviction_weight_relevance + self.eviction_weight_recency + self.eviction_weight_density
            if abs(total - 1) > WEIGHT_SUM_TOLERANCE:
                add(InvalidProfile(
                    f"the three eviction weights add up to {total:g}; they are the shares of relevance, recency "
                    f"and density in a unit's score, so they must add up to 1 "
                    f"(within {WEIGHT_SUM_TOLERANCE:g})",
                    field="eviction_weight_relevance"))
        if self.compactor == "openai" and not (self.compaction_base_url or self.compaction_model):
            add(InvalidProfile(
                "the openai compactor needs compaction_model (and usually compaction_base_url)",
                field="compaction_model"))
        return list(found.values())

    def warnings(self) -> list[str]:
        """Legal but risky settings, shown beside the form."""
        notes: list[str] = []
        # ~2 bytes per token is what JSON and logs cost: the newest results
        # alone could fill the compaction threshold.
        worst = self.recent_n * self.recent_max_bytes // 2
        if worst > self.threshold:
            notes.append(
                f"the {self.recent_n} newest tool results may hold up to {self.recent_max_bytes:,} bytes each "
                f"(about {worst:,} tokens of JSON or logs together), more than the {self.threshold:,}-token "
                "threshold; the contextlab policy re-cuts tool output in the kept tail when the window would overflow"
            )
        if self.threshold > self.max_input_length * 0.9:
            notes.append("a threshold above 90 % leaves little room for the model's reply")
        return notes

    # -- (de)serialisation ---------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key in ("exempt_tool_names", "browser_tool_names", "read_file_tool_names"):
            data[key] = list(data[key])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidProfile(f"unknown profile setting(s): {', '.join(unknown)}", field=unknown[0])
        values = dict(data)
        for key in ("exempt_tool_names", "browser_tool_names", "read_file_tool_names"):
            if key in values:
                if not isinstance(values[key], list | tuple) or not all(isinstance(v, str) for v in values[key]):
                    raise InvalidProfile(f"{key} must be a list of tool names", field=key)
                values[key] = tuple(values[key])
        return cls(**values)

    @classmethod
    def from_json_file(cls, path: str | Path) -> Profile:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidProfile(f"cannot read profile file {path}: {exc}", field="profile") from exc
        except json.JSONDecodeError as exc:
            raise InvalidProfile(
                f"profile file {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                field="profile",
            ) from exc
        if not isinstance(data, dict):
            raise InvalidProfile("a profile file must hold a JSON object", field="profile")
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> Profile:
        return dataclasses.replace(self, **changes)


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:g}"
