"""A profile names one of the operator's providers instead of a URL and a key variable.

Existing values are mapped to the provider with the same base URL and key
variable; a profile that matches none loses them, and when it used the model
compactor it falls back to the offline one (its owner picks a provider again).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


def _to_provider(apps: Any, schema_editor: Any) -> None:
    from contextlab.support import providers

    offered = providers.configured().values()
    profiles = apps.get_model("contextlab_sessions", "AgentProfile")
    for profile in profiles.objects.all():
        url = (profile.compaction_base_url or "").rstrip("/")
        match = next((p for p in offered if url and p.base_url == url
                      and p.api_key_env == (profile.compaction_api_key_env or "")), None)
        if match is not None:
            profile.compaction_provider = match.name
        elif profile.compactor == "openai":
            profile.compactor = "extractive"
        profile.save(update_fields=["compaction_provider", "compactor"])


class Migration(migrations.Migration):
    dependencies = [("contextlab_sessions", "0002_profile_eviction_knobs")]

    operations = [
        migrations.AddField(
            model_name="agentprofile",
            name="compaction_provider",
            field=models.CharField(
                blank=True, default="", max_length=64,
                help_text="which of the server's providers serves the summary model (the operator lists them)"),
        ),
        migrations.RunPython(_to_provider, migrations.RunPython.noop),
        migrations.RemoveField(model_name="agentprofile", name="compaction_api_key_env"),
        migrations.RemoveField(model_name="agentprofile", name="compaction_base_url"),
    ]
