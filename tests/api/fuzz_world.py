"""The data the live fuzz runs against: one account holding every kind of session.

Run inside the server's own database before daphne starts (``python -m
tests.api.fuzz_world``): it prints, as JSON, the API tokens of two users and
the ids the fuzzer puts in its path parameters. Every policy is present (contextlab,
copaw, eviction with evicted turns), with a manual compaction run, summary
versions and an imported transcript, so the lists and details the fuzzer reads
carry every enum value and optional shape the document declares.
"""

from __future__ import annotations

import json
from typing import Any

SMALL = {"max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400}


def seed() -> dict[str, Any]:
    from django.contrib.auth.models import User
    from django.core.files.uploadedfile import SimpleUploadedFile

    from contextlab.api.models import ApiToken
    from contextlab.sessions import services
    from contextlab.sessions.models import AgentSession
    from contextlab.support import jobs
    from tests.conversations import answer, tool_turn

    owner = User.objects.create_user("fuzzer")
    token = ApiToken.issue(user=owner, name="fuzz")[1]

    def worked(policy: str, turns: int, *, name: str = "") -> AgentSession:
        profile = services.profile_create(owner=owner, name=name or policy, knobs={**SMALL, "policy": policy})
        session = services.session_create(owner=owner, system_prompt="You are a careful coding agent.",
                                          profile=profile, title=f"a {policy} session")
        for i in range(1, turns + 1):
            services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                *tool_turn(i, output_bytes=1_200)])
            services.session_prepare(session=session)
        return session

    contextlab = worked("contextlab", 4)
    run = services.compaction_run(session=contextlab, instruction="Keep the target names.", requested_by=owner)
    # A dry run with its draft waiting for review, and pins: the review
    # operations (accept, discard, cancel, pins) meet a run they apply to.
    reviewed = worked("contextlab", 4, name="reviewed")
    services.pin_fact(session=reviewed, fact="The nightly log is /srv/app/nightly.log")
    dry_run = services.dry_run_start(session=reviewed, instruction="Keep the target names.", requested_by=owner)
    assert jobs.drain(60)
    copaw = worked("copaw", 4)
    services.compaction_run(session=copaw, requested_by=owner)
    eviction = worked("eviction", 7)
    evicted = eviction.turns.filter(outcome="evicted").count()
    transcript = json.dumps([{"role": "user", "content": "Where is the nightly log?"},
                             {"role": "assistant", "content": "In /srv/app/nightly.log."}])
    imported = services.transcript_import(
        owner=owner, upload=SimpleUploadedFile("chat.json", transcript.encode()),
        title="an imported transcript")
    # Another account, whose session the fuzzer's user must never reach
    # (schemathesis' object-level authorization check swaps their tokens).
    bob = User.objects.create_user("bob")
    services.session_create(owner=bob, system_prompt="You are Bob's agent.", title="Bob's session")
    contextlab.refresh_from_db()
    return {
        "token": token,
        "peer_token": ApiToken.issue(user=bob, name="fuzz")[1],
        "session_id": str(contextlab.pk),
        "number": contextlab.turns.count(),
        "run_id": run.pk,
        "run_ids": [run.pk, dry_run.pk],
        "sessions": {"reviewed": str(reviewed.pk), "copaw": str(copaw.pk), "eviction": str(eviction.pk), "imported": str(imported.pk)},
        "evicted_turns": evicted,
        "summary_version": contextlab.summary_version,
    }


if __name__ == "__main__":
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    print(json.dumps(seed()))
