"""The audit chain's end is protected too: TRUNCATE of the audit table is refused on PostgreSQL, and the head row
only ever moves forward by one, to the event just appended (it can be neither rolled back nor deleted).

As with the events (tasks/migrations/0009), someone who can drop these triggers can still rewrite the chain and
its head together; anchoring the head outside the database answers that actor, not this migration.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

POSTGRES = """
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit_auditevent FOR EACH STATEMENT
    EXECUTE FUNCTION audit_refuse_change();
CREATE OR REPLACE FUNCTION audit_head_forward_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP <> 'UPDATE' THEN
        RAISE EXCEPTION 'the audit head is never removed (% refused)', TG_OP;
    END IF;
    IF NEW.seq <> OLD.seq + 1 OR NEW.digest IS DISTINCT FROM
            (SELECT digest FROM audit_auditevent WHERE seq = NEW.seq) THEN
        RAISE EXCEPTION 'the audit head moves forward by one, to the event just appended';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_head_forward BEFORE UPDATE ON audit_audithead FOR EACH ROW
    EXECUTE FUNCTION audit_head_forward_only();
CREATE TRIGGER audit_head_no_delete BEFORE DELETE ON audit_audithead FOR EACH ROW
    EXECUTE FUNCTION audit_head_forward_only();
CREATE TRIGGER audit_head_no_truncate BEFORE TRUNCATE ON audit_audithead FOR EACH STATEMENT
    EXECUTE FUNCTION audit_head_forward_only();
"""
POSTGRES_DROP = """
DROP TRIGGER IF EXISTS audit_no_truncate ON audit_auditevent;
DROP TRIGGER IF EXISTS audit_head_forward ON audit_audithead;
DROP TRIGGER IF EXISTS audit_head_no_delete ON audit_audithead;
DROP TRIGGER IF EXISTS audit_head_no_truncate ON audit_audithead;
DROP FUNCTION IF EXISTS audit_head_forward_only();
"""
SQLITE = [
    "CREATE TRIGGER audit_head_forward BEFORE UPDATE ON audit_audithead "
    "WHEN NEW.seq <> OLD.seq + 1 OR NEW.digest IS NOT (SELECT digest FROM audit_auditevent WHERE seq = NEW.seq) "
    "BEGIN SELECT RAISE(ABORT, 'the audit head moves forward by one, to the event just appended'); END;",
    "CREATE TRIGGER audit_head_no_delete BEFORE DELETE ON audit_audithead "
    "BEGIN SELECT RAISE(ABORT, 'the audit head is never removed (DELETE refused)'); END;",
]
SQLITE_DROP = ["DROP TRIGGER IF EXISTS audit_head_forward;", "DROP TRIGGER IF EXISTS audit_head_no_delete;"]


def create(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    statements = [POSTGRES] if vendor == "postgresql" else SQLITE if vendor == "sqlite" else []
    for sql in statements:
        schema_editor.execute(sql, params=None)


def drop(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    statements = [POSTGRES_DROP] if vendor == "postgresql" else SQLITE_DROP if vendor == "sqlite" else []
    for sql in statements:
        schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0002_append_only_triggers")]
    operations = [migrations.RunPython(create, drop)]
