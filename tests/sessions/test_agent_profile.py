from __future__ import annotations

import dataclasses

import pytest
from django.core.exceptions import ValidationError

from contextlab.engine.core.profile import BOUNDS, Profile
from contextlab.sessions.models import OPERATOR_KNOBS, PROFILE_KNOBS, AgentProfile


def test_it_has_a_field_for_every_engine_knob_but_the_operators():
    engine_fields = {f.name for f in dataclasses.fields(Profile)} - {"name", "extra"}
    model_fields = {f.name for f in AgentProfile._meta.get_fields()}
    assert engine_fields - set(OPERATOR_KNOBS) <= model_fields
    assert not set(OPERATOR_KNOBS) & model_fields
    assert set(PROFILE_KNOBS) == engine_fields - set(OPERATOR_KNOBS) | {"compaction_provider"}


def test_it_defaults_to_the_engine_defaults(alice):
    profile = AgentProfile.objects.create(owner=alice, name="default")
    # No key variable ever reaches the engine from a stored profile.
    assert profile.to_engine() == Profile(name="default", compaction_api_key_env="")
    assert profile.threshold == 89_600
    assert profile.reserve == 12_800


def test_it_takes_its_validators_from_the_engine_bounds():
    field = AgentProfile._meta.get_field("max_input_length")
    limits = sorted(v.limit_value for v in field.validators if hasattr(v, "limit_value"))
    assert limits[0] == BOUNDS["max_input_length"].low
    assert limits[-1] == BOUNDS["max_input_length"].high


def test_it_rejects_a_reserve_at_or_above_the_threshold_on_reserve_ratio(alice):
    profile = AgentProfile(owner=alice, name="bad", compact_ratio=0.3, reserve_ratio=0.3)
    with pytest.raises(ValidationError) as info:
        profile.full_clean()
    assert "reserve_ratio" in info.value.message_dict
    assert "threshold" in " ".join(info.value.message_dict["reserve_ratio"])


def test_it_rejects_an_out_of_bounds_knob_on_its_field(alice):
    profile = AgentProfile(owner=alice, name="bad", max_input_length=10)
    with pytest.raises(ValidationError) as info:
        profile.full_clean()
    assert "max_input_length" in info.value.message_dict


def test_it_rejects_old_limit_above_recent_limit_on_old_max_bytes(alice):
    profile = AgentProfile(owner=alice, name="bad", recent_max_bytes=1_000, old_max_bytes=2_000)
    with pytest.raises(ValidationError) as info:
        profile.full_clean()
    assert "old_max_bytes" in info.value.message_dict


def test_it_converts_list_knobs_to_tuples(alice):
    profile = AgentProfile.objects.create(owner=alice, name="p", exempt_tool_names=["todo_write"])
    assert profile.to_engine().exempt_tool_names == ("todo_write",)
