"""Observed calls keep what tells one conversation from another besides its messages:
the client's own conversation id, the caller's trace and the sender's resource.

Existing rows get empty values: the inference then weighs their messages alone.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("gateway", "0008_upstream_key_variable_prefix"),
    ]

    operations = [
        migrations.AddField(
            model_name="observedcall",
            name="client_id",
            field=models.CharField(blank=True, max_length=300),
        ),
        migrations.AddField(
            model_name="observedcall",
            name="trace_id",
            field=models.CharField(blank=True, max_length=32),
        ),
        migrations.AddField(
            model_name="observedcall",
            name="resource",
            field=models.CharField(blank=True, max_length=64),
        ),
    ]
