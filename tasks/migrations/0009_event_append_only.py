"""The database refuses UPDATE, DELETE and (PostgreSQL) TRUNCATE on events, whoever connects (raw SQL included).

Events are the log the projection is rebuilt from: nothing in Reckon rewrites or removes one, so nothing needs a
way around these triggers in production. Someone with the rights to drop or disable a trigger can still do it —
what they then change is found by verify_log (the chain, and the head each task row keeps); anchoring the heads
outside the database is the answer to that actor. The test suite empties tables between transactional tests the
way such an actor would, and only there (tests/conftest.py).
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

POSTGRES = """
CREATE OR REPLACE FUNCTION event_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'events are append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER event_no_update BEFORE UPDATE ON tasks_event FOR EACH ROW EXECUTE FUNCTION event_refuse_change();
CREATE TRIGGER event_no_delete BEFORE DELETE ON tasks_event FOR EACH ROW EXECUTE FUNCTION event_refuse_change();
CREATE TRIGGER event_no_truncate BEFORE TRUNCATE ON tasks_event FOR EACH STATEMENT
    EXECUTE FUNCTION event_refuse_change();
"""
POSTGRES_DROP = """
DROP TRIGGER IF EXISTS event_no_update ON tasks_event;
DROP TRIGGER IF EXISTS event_no_delete ON tasks_event;
DROP TRIGGER IF EXISTS event_no_truncate ON tasks_event;
DROP FUNCTION IF EXISTS event_refuse_change();
"""
SQLITE = [
    "CREATE TRIGGER event_no_update BEFORE UPDATE ON tasks_event "
    "BEGIN SELECT RAISE(ABORT, 'events are append-only (UPDATE refused)'); END;",
    "CREATE TRIGGER event_no_delete BEFORE DELETE ON tasks_event "
    "BEGIN SELECT RAISE(ABORT, 'events are append-only (DELETE refused)'); END;",
]
SQLITE_DROP = ["DROP TRIGGER IF EXISTS event_no_update;", "DROP TRIGGER IF EXISTS event_no_delete;"]


def create(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    statements = [POSTGRES] if vendor == "postgresql" else SQLITE if vendor == "sqlite" else []
    for sql in statements:
        schema_editor.execute(sql, params=None)  # no parameters: the '%' of RAISE is not a placeholder


def drop(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    statements = [POSTGRES_DROP] if vendor == "postgresql" else SQLITE_DROP if vendor == "sqlite" else []
    for sql in statements:
        schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):
    dependencies = [("tasks", "0008_log_head")]
    operations = [migrations.RunPython(create, drop)]
