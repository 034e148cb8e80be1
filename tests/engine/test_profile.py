from __future__ import annotations

import json

import pytest

from contextlab.engine.core.errors import InvalidProfile
from contextlab.engine.core.profile import Profile


def test_it_has_the_design_card_defaults() -> None:
    p = Profile()
    assert (p.max_input_length, p.threshold, p.reserve) == (128_000, 89_600, 12_800)
    assert (p.recent_n, p.recent_max_bytes, p.old_max_bytes, p.retention_days) == (3, 50_000, 3_000, 30)
    assert p.policy == "contextlab"


def test_it_rejects_a_reserve_not_below_the_threshold() -> None:
    with pytest.raises(InvalidProfile) as info:
        Profile(compact_ratio=0.3, reserve_ratio=0.3)
    assert info.value.field == "reserve_ratio"
    assert "must be smaller than the compaction threshold" in info.value.message


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"max_input_length": 10}, "max_input_length"),
        ({"compact_ratio": 1.5}, "compact_ratio"),
        ({"recent_n": 0}, "recent_n"),
        ({"old_max_bytes": 60_000}, "old_max_bytes"),
        ({"policy": "lossy"}, "policy"),
        ({"summary_language": "fr"}, "summary_language"),
        ({"compactor": "openai"}, "compaction_model"),
        ({"recent_n": 2.5}, "recent_n"),
    ],
)
def test_it_names_the_field_of_an_impossible_setting(changes, field) -> None:
    with pytest.raises(InvalidProfile) as info:
        Profile(**changes)
    assert info.value.field == field


def test_it_round_trips_through_json(tmp_path) -> None:
    p = Profile(max_input_length=16_000, exempt_tool_names=("todo",))
    path = tmp_path / "p.json"
    path.write_text(json.dumps(p.to_dict()))
    assert Profile.from_json_file(path) == p


def test_it_explains_a_broken_profile_file(tmp_path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"max_input_length": 16000,')
    with pytest.raises(InvalidProfile, match="not valid JSON"):
        Profile.from_json_file(path)
    path.write_text('{"windw": 1}')
    with pytest.raises(InvalidProfile, match="unknown profile setting"):
        Profile.from_json_file(path)


def test_it_warns_when_a_recent_result_cannot_fit_the_reserve() -> None:
    assert Profile(max_input_length=16_000).warnings()
    assert not Profile().warnings()
