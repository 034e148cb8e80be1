# Turn.payload becomes a PayloadField: the same JSON column, read through a
# descriptor that rebuilds a stored delta (contextlab/sessions/payload_delta.py).
# Nothing changes in the database, so only the migration state moves (SQLite
# would otherwise copy the whole turn table to "alter" an identical column).

from __future__ import annotations

from django.db import migrations

import contextlab.lib.textsafe
import contextlab.sessions.models


class Migration(migrations.Migration):

    dependencies = [
        ("contextlab_sessions", "0009_profile_versions_and_what_if"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="turn",
                    name="payload",
                    field=contextlab.sessions.models.PayloadField(
                        decoder=contextlab.lib.textsafe.RepairingJSONDecoder, default=list),
                ),
            ],
            database_operations=[],
        ),
    ]
