from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0013_recovery_and_metrics_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="taskwakeup",
            name="queued_count",
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="taskwakeup",
            name="deduplicated_count",
            field=models.PositiveBigIntegerField(default=0),
        ),
    ]
