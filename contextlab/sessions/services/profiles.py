"""Creating profiles from knob values and resolving a client's reference to one."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from contextlab.engine.core.errors import InvalidProfile
from contextlab.engine.core.profile import Profile
from contextlab.sessions.models import (
    LIST_KNOBS,
    OPERATOR_KNOBS,
    PROFILE_KNOBS,
    AgentProfile,
)
from contextlab.sessions.services.inputs import check_text

log = logging.getLogger(__name__)


def profile_default(*, owner: User) -> AgentProfile:
    profile, _ = AgentProfile.objects.get_or_create(owner=owner, name="default")
    return profile


def profile_observed(*, owner: User, ref: str = "", named: str = "") -> AgentProfile:
    """The profile an observed agent's calls land in, when the user did not pick one per call.

    ``ref`` (a header) or ``named`` (a resource attribute of the agent's spans)
    names it; else the user's only profile; else, among several, the one named
    "default", or the oldest. A profile is created only for a user who has none.
    """
    for name in (ref, named):
        if name:
            return profile_resolve(owner=owner, ref=name)
    profiles = list(AgentProfile.objects.filter(owner=owner).order_by("pk"))
    if not profiles:
        return profile_default(owner=owner)
    if len(profiles) == 1:
        return profiles[0]
    return next((p for p in profiles if p.name == "default"), profiles[0])


def profile_create(*, owner: User, name: str, knobs: Mapping[str, Any], change_source: str = "code") -> AgentProfile:
    """Create a profile from knob values; errors name the knob (``InvalidProfile``).

    ``change_source`` says where the creation came from in the profile's history ("api")."""
    name = check_text(name, "name", max_length=100).strip()
    if not name:
        raise InvalidProfile("a profile needs a name", field="name")
    if not isinstance(knobs, Mapping):
        raise InvalidProfile("a profile must be an object of settings", field="profile")
    knobs = dict(knobs)
    for knob in OPERATOR_KNOBS:
        if knob in knobs:
            raise InvalidProfile(f"{knob} is set by the server's operator; choose one of the server's "
                                 "providers with compaction_provider", field=knob)
    provider = knobs.pop("compaction_provider", "")
    if not isinstance(provider, str):
        raise InvalidProfile("compaction_provider must be the name of one of the server's providers",
                             field="compaction_provider")
    # The engine checks names, types, bounds and combinations first, so the
    # error is the engine's sentence naming the knob at fault.
    engine = Profile.from_dict({**knobs, "name": name})
    if AgentProfile.objects.filter(owner=owner, name=name).exists():
        raise InvalidProfile(f"you already have a profile named {name!r}", field="name")
    values = {k: (list(v) if k in LIST_KNOBS else v) for k, v in engine.to_dict().items() if k in PROFILE_KNOBS}
    profile = AgentProfile(owner=owner, name=name, compaction_provider=provider, **values)
    try:
        profile.full_clean()
    except ValidationError as exc:
        field, messages = next(iter(exc.message_dict.items()))
        raise InvalidProfile(" ".join(messages), field=field) from exc
    profile.save(changed_by=owner, change_source=change_source)
    return profile


def profile_resolve(*, owner: User, ref: Any, change_source: str = "code") -> AgentProfile:
    """A profile of ``owner`` by id, by name, or created from an object of knobs."""
    if isinstance(ref, dict):
        knobs = dict(ref)
        name = knobs.pop("name", None) or f"profile-{uuid.uuid4().hex[:8]}"
        return profile_create(owner=owner, name=name, knobs=knobs, change_source=change_source)
    profiles = AgentProfile.objects.filter(owner=owner)
    found: AgentProfile | None = None
    if isinstance(ref, int) and not isinstance(ref, bool):
        found = profiles.filter(pk=ref).first()
    elif isinstance(ref, str):
        found = profiles.filter(name=ref).first()
        if found is None and ref.isdigit():
            found = profiles.filter(pk=int(ref)).first()
    else:
        raise InvalidProfile("profile must be a profile id, a profile name or an object of settings",
                             field="profile")
    if found is None:
        raise InvalidProfile(f"you have no profile {ref!r}", field="profile")
    return found


