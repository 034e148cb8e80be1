"""A profile's what-if as a background job: enqueued at the commit, progress and result on its row."""

from __future__ import annotations

import pytest

from contextlab.sessions import services
from contextlab.sessions.models import WhatIfRun
from contextlab.support import jobs
from tests.dashboard.conftest import work

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_runs_after_the_commit_and_records_its_result(alice, small_profile):
    session = services.session_create(owner=alice, system_prompt="You are a careful coding agent.",
                                      profile=small_profile)
    work(session, 4)
    run = services.whatif_start(profile=small_profile, session=session,
                                values={**small_profile.recorded_values(), "max_input_length": 2_500}, by=alice)
    assert jobs.drain(60)
    run.refresh_from_db()
    assert run.status == WhatIfRun.Status.DONE, run.error
    assert (run.turns_total, run.turns_done, run.result["replayed"]) == (4, 4, 4)
    assert run.started is not None and run.finished is not None


def test_a_second_delivery_of_a_finished_run_does_nothing(alice, small_profile):
    session = services.session_create(owner=alice, system_prompt="s", profile=small_profile)
    work(session, 1)
    run = services.whatif_start(profile=small_profile, session=session, values=small_profile.recorded_values(),
                                by=alice)
    assert jobs.drain(60)
    assert services.whatif_execute(run.pk) == "gone"
