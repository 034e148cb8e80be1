"""Tool calls get rows of their own (``SessionCall``), so the state header stops growing with them.

Forwards: every header's ``calls`` and ``answered`` become rows and leave the header;
its ``live_ids`` stay (a load reads either form; the next commit writes the rows' order).
States saved whole, before headers, keep their calls: their next commit writes the rows.
Backwards: the rows go back into the headers, with the live order listed again.
"""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

import contextlab.lib.textsafe


def _to_rows(apps, schema_editor):
    AgentSession = apps.get_model("contextlab_sessions", "AgentSession")
    SessionCall = apps.get_model("contextlab_sessions", "SessionCall")
    for session in AgentSession.objects.filter(engine_state__has_key="live_ids").iterator(chunk_size=200):
        state = dict(session.engine_state or {})
        calls = state.pop("calls", None) or {}
        answered = set(state.pop("answered", None) or [])
        rows = [SessionCall(session=session, call_id=call_id, name=str(entry.get("name") or ""),
                            input=entry.get("input") or {}, raw_input=entry.get("raw_input"), made=True,
                            answered=call_id in answered)
                for call_id, entry in calls.items()]
        rows += [SessionCall(session=session, call_id=call_id, name="", input={}, made=False, answered=True)
                 for call_id in sorted(answered - calls.keys())]
        SessionCall.objects.bulk_create(rows)
        session.engine_state = state
        # An engine a running process kept from before holds no record of these rows.
        session.state_version += 1
        session.save(update_fields=["engine_state", "state_version"])


def _to_header(apps, schema_editor):
    AgentSession = apps.get_model("contextlab_sessions", "AgentSession")
    SessionCall = apps.get_model("contextlab_sessions", "SessionCall")
    SessionMessage = apps.get_model("contextlab_sessions", "SessionMessage")
    for session in AgentSession.objects.all().iterator(chunk_size=200):
        state = dict(session.engine_state or {})
        if "live" not in state and "live_ids" not in state:
            continue
        calls, answered = {}, []
        for row in SessionCall.objects.filter(session=session).order_by("pk"):
            if row.made:
                calls[row.call_id] = {"id": row.call_id, "name": row.name, "input": row.input,
                                      "raw_input": row.raw_input}
            if row.answered:
                answered.append(row.call_id)
        state["calls"], state["answered"] = calls, sorted(answered)
        if "live" in state:
            live_ids = list(SessionMessage.objects.filter(session=session, live_form__isnull=False)
                            .order_by("seq").values_list("message_id", flat=True))
            for message_id, index in sorted((state.pop("live").get("unrowed_at") or {}).items(),
                                            key=lambda kv: kv[1]):
                live_ids.insert(index, message_id)
            state["live_ids"] = live_ids
        session.engine_state = state
        session.state_version += 1
        session.save(update_fields=["engine_state", "state_version"])


class Migration(migrations.Migration):

    dependencies = [
        ('contextlab_sessions', '0011_compaction_review_and_pins'),
    ]

    operations = [
        migrations.CreateModel(
            name='SessionCall',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('call_id', models.TextField()),
                ('name', models.TextField(blank=True)),
                ('input', models.JSONField(blank=True, decoder=contextlab.lib.textsafe.RepairingJSONDecoder, default=dict)),
                ('raw_input', models.TextField(blank=True, null=True)),
                ('made', models.BooleanField(default=True)),
                ('answered', models.BooleanField(default=False)),
                ('session', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='calls', to='contextlab_sessions.agentsession')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('session', 'call_id'), name='sessioncall_session_call_unique')],
            },
        ),
        migrations.RunPython(_to_rows, _to_header),
    ]
