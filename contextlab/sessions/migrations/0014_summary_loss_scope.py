from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    # Every version is checked again (loss_scope None) with the one identifier definition:
    # the counts stored before it missed codes, ids and quoted names written in prose.

    dependencies = [
        ('contextlab_sessions', '0013_session_live_view'),
    ]

    operations = [
        migrations.AddField(
            model_name='summaryversion',
            name='loss_scope',
            field=models.JSONField(blank=True, null=True),
        ),
    ]
