"""Observed calls remember their wire protocol, the provider's answer id and the agent's request kind.

Existing rows are chat-completions calls with no answer id and no kind.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("gateway", "0006_observed_call_span"),
    ]

    operations = [
        migrations.AddField(
            model_name="observedcall",
            name="endpoint",
            field=models.CharField(default="chat.completions", max_length=32),
        ),
        migrations.AddField(
            model_name="observedcall",
            name="response_id",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.AddField(
            model_name="observedcall",
            name="kind",
            field=models.CharField(blank=True, max_length=32),
        ),
    ]
