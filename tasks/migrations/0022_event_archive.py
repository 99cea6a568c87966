"""Ended tasks' events move to an archive so the hot table holds the live work (tasks/engine/archive.py).

- ``tasks_archivedevent``: the archive, append-only in the database as the hot table is (no update, no delete, no
  truncate on PostgreSQL).
- The hot table's delete trigger (migration 0009 refused every delete) now lets a row go only when an identical copy
  — every column — is in the archive: nothing leaves the log, it only moves.
- ``tasks_event_log``: the view every read of a task's log goes through (``LoggedEvent``), both tables as one.

A later migration that makes SQLite rebuild either table (an altered column) must drop the view first and make it
again after (``VIEW_DROP``, ``VIEW``), as it must the triggers: SQLite checks the views when it renames the rebuilt
table into place.
"""

import django.db.models.deletion
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

COLUMNS = "id, task_id, seq, type, payload, prev_digest, digest, created_at"
VIEW = f"CREATE VIEW tasks_event_log AS SELECT {COLUMNS} FROM tasks_event UNION ALL SELECT {COLUMNS} FROM tasks_archivedevent"
VIEW_DROP = "DROP VIEW IF EXISTS tasks_event_log"
# Every column equal: the key (id, task, seq: never NULL) with "=", which the (task, seq) index serves — a row's check
# is one index probe, not a scan of the archive; the others with IS NOT DISTINCT FROM (PostgreSQL) or IS (SQLite).
_KEY = ("id", "task_id", "seq")
_SAME = " AND ".join(f"a.{c} = OLD.{c}" if c in _KEY else f"a.{c} {{same}} OLD.{c}" for c in COLUMNS.split(", "))

POSTGRES = f"""
CREATE OR REPLACE FUNCTION event_refuse_delete() RETURNS trigger AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM tasks_archivedevent a WHERE {_SAME.format(same="IS NOT DISTINCT FROM")}) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'events are append-only (DELETE refused: event %#% has no identical archived copy)',
        OLD.task_id, OLD.seq;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS event_no_delete ON tasks_event;
CREATE TRIGGER event_no_delete BEFORE DELETE ON tasks_event FOR EACH ROW EXECUTE FUNCTION event_refuse_delete();
CREATE TRIGGER archived_event_no_update BEFORE UPDATE ON tasks_archivedevent FOR EACH ROW
    EXECUTE FUNCTION event_refuse_change();
CREATE TRIGGER archived_event_no_delete BEFORE DELETE ON tasks_archivedevent FOR EACH ROW
    EXECUTE FUNCTION event_refuse_change();
CREATE TRIGGER archived_event_no_truncate BEFORE TRUNCATE ON tasks_archivedevent FOR EACH STATEMENT
    EXECUTE FUNCTION event_refuse_change();
"""
POSTGRES_DROP = """
DROP TRIGGER IF EXISTS archived_event_no_update ON tasks_archivedevent;
DROP TRIGGER IF EXISTS archived_event_no_delete ON tasks_archivedevent;
DROP TRIGGER IF EXISTS archived_event_no_truncate ON tasks_archivedevent;
DROP TRIGGER IF EXISTS event_no_delete ON tasks_event;
CREATE TRIGGER event_no_delete BEFORE DELETE ON tasks_event FOR EACH ROW EXECUTE FUNCTION event_refuse_change();
DROP FUNCTION IF EXISTS event_refuse_delete();
"""
# Made again after migration 0009's (tests/conftest.py drops and re-makes the triggers in migration order).
SQLITE = [
    "DROP TRIGGER IF EXISTS event_no_delete;",
    "CREATE TRIGGER event_no_delete BEFORE DELETE ON tasks_event FOR EACH ROW WHEN NOT EXISTS "
    f"(SELECT 1 FROM tasks_archivedevent a WHERE {_SAME.format(same='IS')}) "
    "BEGIN SELECT RAISE(ABORT, 'events are append-only (DELETE refused: no identical archived copy)'); END;",
    "CREATE TRIGGER archived_event_no_update BEFORE UPDATE ON tasks_archivedevent "
    "BEGIN SELECT RAISE(ABORT, 'events are append-only (UPDATE refused)'); END;",
    "CREATE TRIGGER archived_event_no_delete BEFORE DELETE ON tasks_archivedevent "
    "BEGIN SELECT RAISE(ABORT, 'events are append-only (DELETE refused)'); END;",
]
SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS archived_event_no_update;",
    "DROP TRIGGER IF EXISTS archived_event_no_delete;",
    "DROP TRIGGER IF EXISTS event_no_delete;",
]
# Back to migration 0009's unconditional delete trigger.
SQLITE_UNDO = [
    *SQLITE_DROP,
    "CREATE TRIGGER event_no_delete BEFORE DELETE ON tasks_event "
    "BEGIN SELECT RAISE(ABORT, 'events are append-only (DELETE refused)'); END;",
]


def create(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    statements = [POSTGRES] if vendor == "postgresql" else SQLITE if vendor == "sqlite" else []
    for sql in [VIEW, *statements]:
        schema_editor.execute(sql, params=None)  # no parameters: the '%' of RAISE is not a placeholder


def drop(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    statements = [POSTGRES_DROP] if vendor == "postgresql" else SQLITE_UNDO if vendor == "sqlite" else []
    for sql in [VIEW_DROP, *statements]:
        schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0021_event_type_task_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="LoggedEvent",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("seq", models.PositiveBigIntegerField()),
                ("type", models.CharField(max_length=50)),
                ("payload", models.JSONField(default=dict)),
                ("prev_digest", models.CharField(max_length=64)),
                ("digest", models.CharField(max_length=64)),
                ("created_at", models.DateTimeField()),
            ],
            options={
                "db_table": "tasks_event_log",
                "ordering": ["task", "seq"],
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="ArchivedEvent",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("seq", models.PositiveBigIntegerField()),
                ("type", models.CharField(max_length=50)),
                ("payload", models.JSONField(default=dict)),
                ("prev_digest", models.CharField(max_length=64)),
                ("digest", models.CharField(max_length=64)),
                ("created_at", models.DateTimeField()),
                ("archived_at", models.DateTimeField()),
                (
                    "task",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="archived_events",
                        to="tasks.task",
                    ),
                ),
            ],
            options={
                "ordering": ["task", "seq"],
                "indexes": [models.Index(fields=["type", "task"], name="archived_event_type_task_idx")],
                "constraints": [
                    models.UniqueConstraint(fields=("task", "seq"), name="archived_event_seq_unique_per_task")
                ],
            },
        ),
        migrations.RunPython(create, drop),
    ]
