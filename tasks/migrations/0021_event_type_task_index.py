# One task's events of a type (a temp resource's resets, its receipts) read through the index, not the task's whole
# log; the metrics' counts by type still read its leading column.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0020_cleanup_not_before"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="event",
            name="event_type_idx",
        ),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(fields=["type", "task"], name="event_type_task_idx"),
        ),
    ]
