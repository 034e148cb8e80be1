"""Provider keys entered in the admin are stored encrypted; the ones stored in clear are encrypted here."""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


def _encrypt(apps: Any, schema_editor: Any) -> None:
    from contextlab.support import providers

    rows = apps.get_model("gateway", "UpstreamProvider")
    for row in rows.objects.exclude(api_key=""):
        if not row.api_key.startswith("fernet:"):
            row.api_key = providers.encrypt_secret(row.api_key)
            row.save(update_fields=["api_key"])


class Migration(migrations.Migration):
    dependencies = [("gateway", "0001_initial")]

    operations = [
        migrations.AlterField(
            model_name="upstreamprovider",
            name="api_key",
            field=models.CharField(
                blank=True, max_length=1000,
                help_text="the provider key, stored encrypted (leave empty when the variable above is used)"),
        ),
        migrations.RunPython(_encrypt, migrations.RunPython.noop),
    ]
