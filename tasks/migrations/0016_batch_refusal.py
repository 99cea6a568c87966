"""PostgreSQL: ``reckon_refuse(message)``, which aborts the statement that calls it.

A compare-and-set's writes are one statement on PostgreSQL (tasks/engine/sql.py, Batch), committed on its own when it is the
whole change. If the task row's UPDATE matched but a row gated on it did not (a node or an operation no longer in
the status the change was computed on, a node's attempt budget spent), the statement calls this function and
everything it wrote is rolled back with it: a change lands whole or not at all, without a transaction around it.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

SQLSTATE = "RK001"  # tasks.engine.sql.REFUSED
POSTGRES = f"""
CREATE OR REPLACE FUNCTION reckon_refuse(message text) RETURNS integer AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '{SQLSTATE}', MESSAGE = message;
END;
$$ LANGUAGE plpgsql;
"""
POSTGRES_DROP = "DROP FUNCTION IF EXISTS reckon_refuse(text);"


def create(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES, params=None)


def drop(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("tasks", "0015_scope_grant_changes_captured")]
    operations = [migrations.RunPython(create, drop)]
