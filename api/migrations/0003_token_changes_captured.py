"""An agent's API token is a grant of access: its creation, a change of its scope and its revocation are captured
by the database like every other change of access (audit/capture_sql.py, audit/account_changes.py)."""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

from audit import capture_sql

TABLES = [capture_sql.API_TOKENS]


def create(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    statements = {"postgresql": capture_sql.postgres_capture, "sqlite": capture_sql.sqlite_capture}.get(vendor)
    for sql in statements(TABLES) if statements else []:
        schema_editor.execute(sql, params=None)


def drop(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    for sql in capture_sql.drop_capture(TABLES, vendor) if vendor in ("postgresql", "sqlite") else []:
        schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):
    dependencies = [("api", "0002_idempotency"), ("audit", "0006_account_changes")]
    operations = [migrations.RunPython(create, drop)]
