"""Upstream key variables are named CONTEXTLAB_UPSTREAM_*: existing names get the prefix.

The gateway no longer reads any other variable as a provider key (a staff
member could name SECRET_KEY or DATABASE_URL). A provider that named
OPENAI_API_KEY now names CONTEXTLAB_UPSTREAM_OPENAI_API_KEY: the operator sets
that variable to the same value (docs/gateway.md). Until then the gateway
answers that the provider has no key configured, and logs the variable's name.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

PREFIX = "CONTEXTLAB_UPSTREAM_"


def add_prefix(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("gateway", "UpstreamProvider")
    for row in model.objects.exclude(api_key_env="").exclude(api_key_env__startswith=PREFIX):
        # At most 100 characters, like the field.
        row.api_key_env = (PREFIX + row.api_key_env)[:100]
        row.save(update_fields=["api_key_env"])


class Migration(migrations.Migration):

    dependencies = [
        ("gateway", "0007_observed_call_endpoint"),
    ]

    operations = [
        migrations.RunPython(add_prefix, migrations.RunPython.noop),
    ]
