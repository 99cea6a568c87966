"""The database refuses UPDATE and DELETE on audit events, whoever connects (raw SQL included)."""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

POSTGRES = """
CREATE OR REPLACE FUNCTION audit_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit_auditevent FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit_auditevent FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
"""
POSTGRES_DROP = """
DROP TRIGGER IF EXISTS audit_no_update ON audit_auditevent;
DROP TRIGGER IF EXISTS audit_no_delete ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_refuse_change();
"""
SQLITE = [
    "CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit_auditevent "
    "BEGIN SELECT RAISE(ABORT, 'audit events are append-only (UPDATE refused)'); END;",
    "CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit_auditevent "
    "BEGIN SELECT RAISE(ABORT, 'audit events are append-only (DELETE refused)'); END;",
]
SQLITE_DROP = ["DROP TRIGGER IF EXISTS audit_no_update;", "DROP TRIGGER IF EXISTS audit_no_delete;"]


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
    dependencies = [("audit", "0001_initial")]
    operations = [migrations.RunPython(create, drop)]
