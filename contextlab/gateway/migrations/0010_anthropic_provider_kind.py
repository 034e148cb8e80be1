"""Upstream providers say which wire protocol they speak, who runs Anthropic context edits and whose
credential goes upstream; observed calls keep the context edits the provider applied.

An observed call's protocol is its ``endpoint`` (0007): "anthropic.messages" for the Messages API.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('gateway', '0009_observed_call_identity'),
    ]

    operations = [
        migrations.AddField(
            model_name='observedcall',
            name='provider_edits',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='upstreamprovider',
            name='context_edits',
            field=models.CharField(choices=[('provider', "the provider applies them (Anthropic's API does)"), ('engine', 'ContextLab applies them before the call and answers applied_edits (manage mode)')], default='provider', help_text="who runs an Anthropic request's context_management.edits (clear_tool_uses_*, clear_thinking_*); engine suits an Anthropic-compatible upstream that cannot", max_length=16),
        ),
        migrations.AddField(
            model_name='upstreamprovider',
            name='credential',
            field=models.CharField(choices=[('stored', 'the provider key stored here (the client authenticates with its ContextLab token)'), ('client', "the client's own provider credential, forwarded as it came")], default='stored', help_text='client: the agent sends its own provider key or subscription token (x-api-key or Authorization) and its ContextLab token in the X-ContextLab-Token header', max_length=16),
        ),
        migrations.AddField(
            model_name='upstreamprovider',
            name='kind',
            field=models.CharField(choices=[('openai', 'OpenAI-compatible (chat completions; Authorization: Bearer)'), ('anthropic', 'Anthropic Messages API (x-api-key, anthropic-version)')], default='openai', help_text="the wire protocol the provider speaks; an anthropic provider's base URL is e.g. https://api.anthropic.com/v1", max_length=16),
        ),
    ]
