"""Indexes the step writes for nothing: each is written again on every insert and on every update that cannot stay
on its page (about two per step each), and none serves a query another index does not.

- ``tasks_event(task_id)`` and ``tasks_node(task_id)``: the unique indexes ``(task_id, seq)`` and
  ``(task_id, plan_version, key)`` lead with the same column and serve every lookup by task;
- ``tasks_operation(compensates_id)``: almost every operation compensates nothing; the index is now partial
  (``operation_compensates_idx``, where set), which still serves the foreign key's checks.

Only the indexes are dropped, by name (``DROP INDEX``): altering the fields would make SQLite rebuild its tables, and
a rebuilt ``tasks_event`` would lose its append-only triggers (migration 0009).
"""

import django.db.models.deletion
from django.db import migrations, models

DROPPED = ("tasks_event_task_id_9f848980", "tasks_node_task_id_2e71f175", "tasks_operation_compensates_id_c881aeeb")


class Migration(migrations.Migration):
    dependencies = [("tasks", "0016_batch_refusal")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="event",
                    name="task",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="events",
                        to="tasks.task",
                    ),
                ),
                migrations.AlterField(
                    model_name="node",
                    name="task",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="nodes",
                        to="tasks.task",
                    ),
                ),
                migrations.AlterField(
                    model_name="operation",
                    name="compensates",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="compensations",
                        to="tasks.operation",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    [f'DROP INDEX IF EXISTS "{name}"' for name in DROPPED],
                    reverse_sql=[
                        'CREATE INDEX "tasks_event_task_id_9f848980" ON "tasks_event" ("task_id")',
                        'CREATE INDEX "tasks_node_task_id_2e71f175" ON "tasks_node" ("task_id")',
                        'CREATE INDEX "tasks_operation_compensates_id_c881aeeb"'
                        ' ON "tasks_operation" ("compensates_id")',
                    ],
                )
            ],
        ),
        migrations.AddIndex(
            model_name="operation",
            index=models.Index(
                condition=models.Q(("compensates__isnull", False)),
                fields=["compensates"],
                name="operation_compensates_idx",
            ),
        ),
    ]
