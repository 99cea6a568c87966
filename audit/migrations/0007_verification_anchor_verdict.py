"""A verification run keeps what the anchor file said of the chains (audit.anchors.AnchorVerdict): the console's
"Verify now" shows it beside the chains' verdict."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0006_account_changes"),
    ]

    operations = [
        migrations.AddField(
            model_name="verificationrun",
            name="anchor_verdict",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
