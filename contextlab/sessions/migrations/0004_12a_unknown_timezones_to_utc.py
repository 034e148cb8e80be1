"""Profiles saved with a timezone this machine does not know now fail validation.

They always ran as UTC (the memory jobs fell back to it silently); this makes
that explicit so such a profile keeps loading.
"""
from __future__ import annotations

import zoneinfo

from django.db import migrations


def unknown_to_utc(apps, schema_editor):
    AgentProfile = apps.get_model("contextlab_sessions", "AgentProfile")
    known = zoneinfo.available_timezones() | {"UTC"}
    for profile in AgentProfile.objects.exclude(timezone__in=known).only("pk", "timezone"):
        profile.timezone = "UTC"
        profile.save(update_fields=["timezone"])


class Migration(migrations.Migration):

    dependencies = [
        ("contextlab_sessions", "0003_12a_repair_text_on_read"),
    ]

    operations = [
        migrations.RunPython(unknown_to_utc, migrations.RunPython.noop),
    ]
